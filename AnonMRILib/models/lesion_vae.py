"""Region-separated VAEs and the joint decoder of lesion-preserving anonymization (paper 4.4.1).

Two VAEs encode the two regions of a 2-D axial slice ``x`` (intensities scaled to about [0, 1])
with lesion mask ``M`` (1 = lesion):

* ``background_vae`` encodes/reconstructs the non-lesion region ``x * (1 - M)``;
* ``lesion_vae`` encodes/reconstructs the lesion region ``x * M``;
* ``joint_decoder`` reconstructs the whole slice from the concatenation
  ``[z_lesion, z_background]`` along channels (the paper's ``D3([z_l, z_s])``, eq. 12).

Latents are pixel-level: each encoder outputs ``2 * latent_channels`` maps at 1/8 of the slice
size (mean and log-variance stacked along channels), ``[32, 30, 30]`` for a 240x240 slice with
the paper configuration (``latent_channels=16``).

Mapping to the paper's labels, which contradict each other:

==========================  ===============================  ================================
this module                 paper 4.4.1 (text, eqs. 10-11)   paper 4.4.2 / 4.4.3 / Fig. 4
==========================  ===============================  ================================
``background_vae``          VAE1 (bullet list), but E2/D2    "E1(.)" encodes the non-lesion
(``background_encoder``)    in eq. 11 (z_s = E2(x_s))        image for the diffusion model
``lesion_vae``              VAE2 (bullet list), but E1/D1    "E2" gives the lesion code L2
(``lesion_encoder``)        in eq. 10 (z_l = E1(x_l))        in 4.4.3
``joint_decoder``           D3                               D3
==========================  ===============================  ================================

Architecture (the paper's Tables 1-2 are not in the text we have; choices written here): each
encoder is a 3x3 stem convolution, then three stages of [stride-2 3x3 conv, residual block of two
3x3 conv + BatchNorm + LeakyReLU], a 4-head self-attention block at 1/8 resolution and a 3x3
convolution to ``2 * latent_channels``. Decoders mirror it (3x3 conv from the latent, self-attention,
three stages of [residual block, nearest x2 upsampling, conv], a 3x3 conv to one channel). The
downsampling comes first in each stage so no residual block runs at full resolution, which keeps
the CPU cost low.

Normalisation: batch normalisation as in the paper (``norm="batch"``, every shipped model); group
normalisation (``norm="group"``) is available for runs whose batches are too small for batch statistics.

Output: the decoders end in a ReLU with ``output_activation="relu"`` (the 240 x 240 models): MR magnitude
images are non-negative and a skull-stripped slice's background is exactly 0. Without it the background
came out as +-0.01-0.04 noise, which whole-slice SSIM punishes (its luminance term is 0.5 for a mean of
0.01 against 0): the 240 x 240 model's held-out SSIM swung between 0.46 and 0.94 from one checkpoint to
the next while its training loss fell (measured here).

Loss (eq. 13): ``alpha_v * L_rec + kl_weight * L_KL``. ``L_rec`` is the per-pixel mean squared
error summed over the three reconstructions (background, lesion, whole slice); ``L_KL`` is the
per-element mean KL divergence of both posteriors to N(0, I). The paper writes the KL weight as 1
without saying how either term is normalised; with per-element means a weight of 1 collapses the
posterior on images in [0, 1], so ``kl_weight`` (default 1e-3) is a documented choice.
``alpha_v`` follows eq. 14: 16, halved every 10 epochs, never below 1 (:func:`alpha_v_schedule`).
"""
from dataclasses import dataclass
from typing import Dict, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from .model_card import JSONConfig


@dataclass(frozen=True)
class LesionVAEConfig(JSONConfig):
    """Sizes of the two VAEs and the joint decoder.

    ``image_size`` is the square slice size in pixels the models are trained at (must be a
    multiple of 8); the latent maps are ``image_size // 8`` pixels square.
    """

    image_size: int = 64
    latent_channels: int = 16
    channels: Tuple[int, int, int] = (16, 32, 48)
    attention_heads: int = 4
    negative_slope: float = 0.2
    kl_weight: float = 1e-3
    #: self-attention within non-overlapping windows of this many latent pixels (0: over the whole map)
    attention_window: int = 0
    #: "batch" (the paper's batch normalisation) or "group" (group normalisation, 8 groups: no running
    #: statistics, so a model trained on crops behaves the same on whole slices; module docstring)
    norm: str = "batch"
    #: decoders' output activation: "none" or "relu" (magnitude images are non-negative: the background
    #: of a skull-stripped slice comes out exactly 0 instead of +-0.01-0.04 noise, which alone took the
    #: 240 x 240 model's whole-slice SSIM from 0.93 to 0.86; module docstring)
    output_activation: str = "none"

    def __post_init__(self) -> None:
        if self.norm not in ("batch", "group"):
            raise ValueError(f"norm must be 'batch' or 'group', got {self.norm!r}")
        if self.output_activation not in ("none", "relu"):
            raise ValueError(f"output_activation must be 'none' or 'relu', got {self.output_activation!r}")

    @property
    def latent_size(self) -> int:
        return self.image_size // 8


    @classmethod
    def paper(cls) -> "LesionVAEConfig":
        """The paper's size: 240x240 slices -> [32, 30, 30] encoder output."""
        return cls(image_size=240, latent_channels=16, channels=(64, 128, 256))


def alpha_v_schedule(epoch: int, initial: float = 16.0, halve_every: int = 10, minimum: float = 1.0) -> float:
    """Reconstruction weight of eq. 14 for 0-based ``epoch``: 16, 8, 4, 2, 1, 1, ... per 10 epochs."""
    if epoch < 0:
        raise ValueError("epoch must be >= 0")
    return max(initial / (2.0 ** (epoch // halve_every)), minimum)


def normalization(kind: str, channels: int) -> nn.Module:
    """BatchNorm2d (``"batch"``) or GroupNorm with up to 8 groups (``"group"``)."""
    if kind == "group":
        return nn.GroupNorm(min(8, channels), channels)
    return nn.BatchNorm2d(channels)


class ConvBlock(nn.Module):
    """3x3 convolution, batch (or group) normalisation, LeakyReLU."""

    def __init__(self, in_channels: int, out_channels: int, negative_slope: float, stride: int = 1,
                 norm: str = "batch") -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm = normalization(norm, out_channels)
        self.act = nn.LeakyReLU(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


class ResidualBlock(nn.Module):
    """Two :class:`ConvBlock` with a (1x1 projected when needed) skip."""

    def __init__(self, in_channels: int, out_channels: int, negative_slope: float, norm: str = "batch") -> None:
        super().__init__()
        self.first = ConvBlock(in_channels, out_channels, negative_slope, norm=norm)
        self.second = ConvBlock(out_channels, out_channels, negative_slope, norm=norm)
        self.skip = nn.Identity() if in_channels == out_channels else nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)) + self.skip(x)


class SelfAttention2d(nn.Module):
    """Multi-head self-attention over the pixels of a feature map, with a residual connection.

    ``window`` > 0: within non-overlapping ``window`` x ``window`` tiles (the map zero-padded to a
    multiple). A network trained on crops and applied to whole slices then attends over as many
    pixels at both: with attention over the whole map, the 240 x 240 VAE trained on 96-pixel crops
    (12 x 12 latent pixels) fell from whole-slice SSIM 0.90 to 0.22 as training went on, while its
    crop loss kept falling (measured here)."""

    def __init__(self, channels: int, heads: int = 4, window: int = 0) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(min(8, channels), channels)
        self.attention = nn.MultiheadAttention(channels, heads, batch_first=True)
        self.window = int(window)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        if self.window <= 0:
            tokens = self.norm(x).flatten(2).transpose(1, 2)  # (B, H*W, C)
            attended, _ = self.attention(tokens, tokens, tokens, need_weights=False)
            return x + attended.transpose(1, 2).reshape(batch, channels, height, width)
        w = self.window
        padded_h, padded_w = -(-height // w) * w, -(-width // w) * w
        h = F.pad(self.norm(x), (0, padded_w - width, 0, padded_h - height))
        rows, cols = padded_h // w, padded_w // w
        tokens = h.reshape(batch, channels, rows, w, cols, w).permute(0, 2, 4, 3, 5, 1).reshape(-1, w * w, channels)
        attended, _ = self.attention(tokens, tokens, tokens, need_weights=False)
        attended = attended.reshape(batch, rows, cols, w, w, channels).permute(0, 5, 1, 3, 2, 4)
        attended = attended.reshape(batch, channels, padded_h, padded_w)[:, :, :height, :width]
        return x + attended


class RegionEncoder(nn.Module):
    """Image (B, 1, S, S) -> (mean, log-variance), each (B, latent_channels, S/8, S/8)."""

    def __init__(self, config: LesionVAEConfig) -> None:
        super().__init__()
        c1, c2, c3 = config.channels
        slope = config.negative_slope
        norm = config.norm
        self.stem = ConvBlock(1, c1, slope, norm=norm)
        stages = []
        previous = c1
        for width in (c1, c2, c3):
            stages += [ConvBlock(previous, width, slope, stride=2, norm=norm), ResidualBlock(width, width, slope, norm)]
            previous = width
        self.stages = nn.Sequential(*stages)
        self.attention = SelfAttention2d(c3, config.attention_heads, config.attention_window)
        self.to_moments = nn.Conv2d(c3, 2 * config.latent_channels, 3, padding=1)
        self.latent_channels = config.latent_channels

    def moments(self, x: torch.Tensor) -> torch.Tensor:
        """The raw encoder output: (B, 2 * latent_channels, S/8, S/8), mean then log-variance."""
        return self.to_moments(self.attention(self.stages(self.stem(x))))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        mean, log_variance = self.moments(x).chunk(2, dim=1)
        return mean, log_variance.clamp(-30.0, 20.0)


class LatentDecoder(nn.Module):
    """Latent (B, in_channels, s, s) -> image (B, 1, 8s, 8s)."""

    def __init__(self, config: LesionVAEConfig, in_channels: int) -> None:
        super().__init__()
        c1, c2, c3 = config.channels
        slope = config.negative_slope
        norm = config.norm
        self.from_latent = ConvBlock(in_channels, c3, slope, norm=norm)
        self.attention = SelfAttention2d(c3, config.attention_heads, config.attention_window)
        stages = []
        previous = c3
        for width in (c3, c2, c1):
            stages += [ResidualBlock(previous, width, slope, norm), nn.Upsample(scale_factor=2, mode="nearest"),
                       ConvBlock(width, max(width // 2, 8) if width == c1 else width, slope, norm=norm)]
            previous = width
        self.stages = nn.Sequential(*stages)
        self.to_image = nn.Conv2d(max(c1 // 2, 8), 1, 3, padding=1)
        self.output_activation = nn.ReLU() if config.output_activation == "relu" else nn.Identity()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.output_activation(self.to_image(self.stages(self.attention(self.from_latent(z)))))


class RegionVAE(nn.Module):
    """One region's VAE: :class:`RegionEncoder` + :class:`LatentDecoder`."""

    def __init__(self, config: LesionVAEConfig) -> None:
        super().__init__()
        self.encoder = RegionEncoder(config)
        self.decoder = LatentDecoder(config, config.latent_channels)

    def forward(self, x: torch.Tensor, generator: "torch.Generator" = None):
        mean, log_variance = self.encoder(x)
        z = reparameterize(mean, log_variance, generator)
        return self.decoder(z), z, mean, log_variance


def reparameterize(mean: torch.Tensor, log_variance: torch.Tensor, generator=None) -> torch.Tensor:
    """A sample ``mean + exp(log_variance / 2) * eps`` with ``eps ~ N(0, I)`` from ``generator``."""
    eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
    return mean + torch.exp(0.5 * log_variance) * eps


def kl_divergence(mean: torch.Tensor, log_variance: torch.Tensor) -> torch.Tensor:
    """Per-element mean KL(N(mean, exp(log_variance)) || N(0, I))."""
    return 0.5 * torch.mean(mean.pow(2) + log_variance.exp() - 1.0 - log_variance)


class LesionPreservingAutoencoder(nn.Module):
    """Background VAE + lesion VAE + joint decoder (see the module docstring for the paper labels)."""

    def __init__(self, config: LesionVAEConfig = LesionVAEConfig()) -> None:
        super().__init__()
        if config.image_size % 8:
            raise ValueError(f"image_size must be a multiple of 8, got {config.image_size}")
        self.config = config
        self.background_vae = RegionVAE(config)
        self.lesion_vae = RegionVAE(config)
        self.joint_decoder = LatentDecoder(config, 2 * config.latent_channels)

    @property
    def background_encoder(self) -> RegionEncoder:
        return self.background_vae.encoder

    @property
    def lesion_encoder(self) -> RegionEncoder:
        return self.lesion_vae.encoder

    @staticmethod
    def split_regions(image: torch.Tensor, lesion_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(background x*(1-M), lesion x*M) for image and mask of shape (B, 1, S, S)."""
        return image * (1.0 - lesion_mask), image * lesion_mask

    def encode_background(self, image: torch.Tensor, lesion_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(mean, log-variance) of the background posterior."""
        background, _ = self.split_regions(image, lesion_mask)
        return self.background_encoder(background)

    def encode_lesion(self, image: torch.Tensor, lesion_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(mean, log-variance) of the lesion posterior."""
        _, lesion = self.split_regions(image, lesion_mask)
        return self.lesion_encoder(lesion)

    def decode_joint(self, z_lesion: torch.Tensor, z_background: torch.Tensor) -> torch.Tensor:
        """The whole slice from ``[z_lesion, z_background]`` (paper eq. 12 order)."""
        return self.joint_decoder(torch.cat([z_lesion, z_background], dim=1))

    def forward(self, image: torch.Tensor, lesion_mask: torch.Tensor, generator=None) -> Dict[str, torch.Tensor]:
        background, lesion = self.split_regions(image, lesion_mask)
        background_hat, z_background, mean_b, logvar_b = self.background_vae(background, generator)
        lesion_hat, z_lesion, mean_l, logvar_l = self.lesion_vae(lesion, generator)
        whole_hat = self.decode_joint(z_lesion, z_background)
        return {"background": background, "lesion": lesion,
                "background_hat": background_hat, "lesion_hat": lesion_hat, "whole_hat": whole_hat,
                "mean_background": mean_b, "logvar_background": logvar_b,
                "mean_lesion": mean_l, "logvar_lesion": logvar_l}

    def loss(self, image: torch.Tensor, lesion_mask: torch.Tensor, alpha_v: float,
             generator=None) -> Tuple[torch.Tensor, Dict[str, float]]:
        """``alpha_v * L_rec + kl_weight * L_KL`` and its parts (floats) for logging."""
        return lesion_vae_loss(self.forward(image, lesion_mask, generator), image, alpha_v, self.config.kl_weight)

    @torch.no_grad()
    def reconstruct(self, image: torch.Tensor, lesion_mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Deterministic reconstructions from the posterior means (eval mode expected)."""
        background, lesion = self.split_regions(image, lesion_mask)
        mean_b, _ = self.background_encoder(background)
        mean_l, _ = self.lesion_encoder(lesion)
        return {"background_hat": self.background_vae.decoder(mean_b),
                "lesion_hat": self.lesion_vae.decoder(mean_l),
                "whole_hat": self.decode_joint(mean_l, mean_b),
                "mean_background": mean_b, "mean_lesion": mean_l}


def lesion_vae_loss(outputs: Dict[str, torch.Tensor], image: torch.Tensor, alpha_v: float,
                    kl_weight: float) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Eq. 13 on the outputs of :meth:`LesionPreservingAutoencoder.forward` (a free function so a
    DistributedDataParallel wrapper's forward can be used in training)."""
    rec_background = F.mse_loss(outputs["background_hat"], outputs["background"])
    rec_lesion = F.mse_loss(outputs["lesion_hat"], outputs["lesion"])
    rec_whole = F.mse_loss(outputs["whole_hat"], image)
    reconstruction = rec_background + rec_lesion + rec_whole
    kl = kl_divergence(outputs["mean_background"], outputs["logvar_background"]) + \
        kl_divergence(outputs["mean_lesion"], outputs["logvar_lesion"])
    total = alpha_v * reconstruction + kl_weight * kl
    parts = {"loss": float(total.detach()), "mse_background": float(rec_background.detach()),
             "mse_lesion": float(rec_lesion.detach()), "mse_whole": float(rec_whole.detach()),
             "kl": float(kl.detach()), "alpha_v": float(alpha_v)}
    return total, parts
