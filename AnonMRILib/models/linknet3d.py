"""LinkNet3d: the 3-D LinkNet of deepbet (Fisch et al., Comput. Biol. Med. 2024), as a plain module.

deepbet (https://github.com/wwu-mmll/deepbet, MIT licence) ships its two brain-extraction networks
as TorchScript archives. This module rebuilds the same architecture as an ordinary
``torch.nn.Module`` so that AnonMRI can load the converted weights from ``safetensors`` (no
TorchScript, no pickle); ``Training/convert_deepbet_weights.py`` converts them and checks that
this module reproduces the TorchScript outputs.

Architecture (channels ``c = base_channels``; every norm is an InstanceNorm3d without affine)::

    init:   conv 7^3 stride 2 (1 -> c) + IN + ReLU + maxpool 3^3 stride 2
    down0..3: two residual blocks each (c, 2c, 4c, 8c; down1..3 start with stride 2)
    up0..3:   1^3 conv (in -> in/4), transposed 3^3 conv (stride 2; up3: stride 1),
              1^3 conv (in/4 -> out), each added to the encoder output of its resolution
    head:   transposed 3^3 conv stride 2 (c -> c/2) + IN + ReLU, conv 3^3 + IN + ReLU,
            transposed 2^3 conv stride 2 (c/2 -> classes), softmax over classes

Input ``(N, 1, D, H, W)`` with D, H, W divisible by 32; output ``(N, classes, D, H, W)``
probabilities.
"""
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class LinkNet3dConfig:
    """Size of a :class:`LinkNet3d` (deepbet's networks: base 16, 1 input channel, 2 classes)."""

    base_channels: int = 16
    in_channels: int = 1
    num_classes: int = 2


def _norm(channels: int) -> nn.Module:
    return nn.InstanceNorm3d(channels, affine=False, track_running_stats=False)


class ResidualBlock(nn.Module):
    """conv-IN-ReLU-conv-IN plus a (strided 1^3 conv + IN) or identity shortcut, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv3d(in_channels, out_channels, 3, stride, 1, bias=False), _norm(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv3d(out_channels, out_channels, 3, 1, 1, bias=False), _norm(out_channels))
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv3d(in_channels, out_channels, 1, stride, 0, bias=False), _norm(out_channels))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.act(self.double_conv(x) + shortcut)


class EncoderStage(nn.Module):
    """Two residual blocks; the first may halve the resolution."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.block1 = ResidualBlock(in_channels, out_channels, stride)
        self.block2 = ResidualBlock(out_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block2(self.block1(x))


class DecoderStage(nn.Module):
    """LinkNet decoder: 1^3 conv to in/4, transposed 3^3 conv (x``stride`` upsampling), 1^3 conv to out."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 2) -> None:
        super().__init__()
        middle = in_channels // 4
        self.conv1 = nn.Sequential(nn.Conv3d(in_channels, middle, 1, bias=False), _norm(middle),
                                   nn.ReLU(inplace=True))
        self.tp_conv = nn.Sequential(
            nn.ConvTranspose3d(middle, middle, 3, stride, 1, output_padding=stride - 1, bias=False), _norm(middle),
            nn.ReLU(inplace=True))
        self.conv2 = nn.Sequential(nn.Conv3d(middle, out_channels, 1, bias=False), _norm(out_channels),
                                   nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.tp_conv(self.conv1(x)))


class LinkNet3d(nn.Module):
    """deepbet's 3-D LinkNet; ``forward`` returns class probabilities (softmax over dim 1)."""

    def __init__(self, config: LinkNet3dConfig = LinkNet3dConfig()) -> None:
        super().__init__()
        self.config = config
        c = config.base_channels
        self.init = nn.Sequential(nn.Conv3d(config.in_channels, c, 7, 2, 3, bias=False), _norm(c),
                                  nn.ReLU(inplace=True), nn.MaxPool3d(3, 2, 1))
        self.down0 = EncoderStage(c, c, 1)
        self.down1 = EncoderStage(c, 2 * c, 2)
        self.down2 = EncoderStage(2 * c, 4 * c, 2)
        self.down3 = EncoderStage(4 * c, 8 * c, 2)
        self.up0 = DecoderStage(8 * c, 4 * c)
        self.up1 = DecoderStage(4 * c, 2 * c)
        self.up2 = DecoderStage(2 * c, c)
        self.up3 = DecoderStage(c, c, stride=1)
        self.tp_conv1 = nn.Sequential(nn.ConvTranspose3d(c, c // 2, 3, 2, 1, output_padding=1), _norm(c // 2),
                                      nn.ReLU(inplace=True))
        self.conv = nn.Sequential(nn.Conv3d(c // 2, c // 2, 3, 1, 1), _norm(c // 2), nn.ReLU(inplace=True))
        self.tp_conv2 = nn.ConvTranspose3d(c // 2, config.num_classes, 2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = self.init(x)
        x1 = self.down0(x0)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        y = self.up0(x4) + x3
        y = self.up1(y) + x2
        y = self.up2(y) + x1
        y = self.up3(y) + x0
        y = self.conv(self.tp_conv1(y))
        return torch.softmax(self.tp_conv2(y), dim=1)
