"""3-D building blocks of CP-GAN: MobileNetV2-style inverted-residual convolutions.

An :class:`InvertedResidual3d` is MobileNetV2's block (Sandler et al. 2018) in 3-D: a 1x1x1
convolution expands ``C`` channels to ``expansion * C``, a depthwise 3x3x3 convolution (one
filter per channel, ``groups = channels``) mixes space, a linear 1x1x1 convolution projects back
to ``C`` channels, and the input is added (residual). The convolutions are MONAI
:class:`~monai.networks.blocks.Convolution` blocks.

Choices (the paper only says "modified MobileNetV2 convolutions"):

* no normalisation layer: batch statistics of 2 volumes are meaningless, and instance
  normalisation would remove the absolute intensity the generator has to produce;
* LeakyReLU(0.2) instead of ReLU6, as in most GANs, so gradients flow for negative inputs;
* the residual branch's last convolution is initialised at 0.1x its default scale so that a
  deep stack starts close to the identity (stable early GAN training).

Tensors are (N, C, D, H, W). Depthwise 3-D convolutions are far faster on CPU in the
``torch.channels_last_3d`` memory format; the CP-GAN modules convert their inputs to it.
"""
from typing import Sequence

import torch
from torch import nn

LEAKY_SLOPE = 0.2


def leaky_relu(negative_slope: float = LEAKY_SLOPE) -> tuple:
    """The MONAI activation spec of a LeakyReLU."""
    return ("leakyrelu", {"negative_slope": float(negative_slope), "inplace": False})


def convolution(in_channels: int, out_channels: int, kernel_size: int = 3, groups: int = 1,
                activation: bool = True, negative_slope: float = LEAKY_SLOPE, dilation: int = 1) -> nn.Module:
    """A 3-D MONAI convolution ('same' padding, stride 1, no norm), optionally with LeakyReLU."""
    from monai.networks.blocks import Convolution

    if activation:
        return Convolution(3, in_channels, out_channels, kernel_size=kernel_size, groups=groups,
                           dilation=dilation, act=leaky_relu(negative_slope), norm=None, bias=True)
    return Convolution(3, in_channels, out_channels, kernel_size=kernel_size, groups=groups,
                       dilation=dilation, conv_only=True, bias=True)


class InvertedResidual3d(nn.Module):
    """x + project(depthwise3x3x3(expand(x))): MobileNetV2's inverted residual in 3-D.

    ``dilation`` spaces the depthwise taps (DeepLabv3's dilated MobileNetV2): the receptive field
    grows by ``2 * dilation`` voxels at the same cost.
    """

    def __init__(self, channels: int, expansion: int = 2, negative_slope: float = LEAKY_SLOPE,
                 residual_init_scale: float = 0.1, dilation: int = 1) -> None:
        super().__init__()
        hidden = int(channels) * int(expansion)
        self.expand = convolution(channels, hidden, kernel_size=1, negative_slope=negative_slope)
        self.depthwise = convolution(hidden, hidden, kernel_size=3, groups=hidden, negative_slope=negative_slope,
                                     dilation=int(dilation))
        self.project = convolution(hidden, channels, kernel_size=1, activation=False)
        with torch.no_grad():
            for parameter in self.project.parameters():
                parameter.mul_(residual_init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.project(self.depthwise(self.expand(x)))


def inverted_residual_stack(channels: int, depth: int, expansion: int,
                            negative_slope: float = LEAKY_SLOPE, dilations: Sequence[int] = ()) -> nn.Module:
    """``depth`` inverted-residual blocks in sequence (the identity when ``depth`` is 0).

    Block ``i`` uses dilation ``dilations[i % len(dilations)]`` (1 when ``dilations`` is empty).
    """
    if depth <= 0:
        return nn.Identity()
    cycle = tuple(int(d) for d in dilations) or (1,)
    return nn.Sequential(*[InvertedResidual3d(channels, expansion, negative_slope, dilation=cycle[i % len(cycle)])
                           for i in range(depth)])
