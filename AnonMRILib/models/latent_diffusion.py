"""Conditional latent diffusion on the background (non-lesion) latent (paper 4.4.2).

The denoiser is a U-Net on the background VAE's latent ``z`` (``latent_channels`` maps at 1/8 of
the slice size) that predicts the noise ``eps`` added by the forward process (eq. 16) and is
trained with the MSE of eq. 18. It is conditioned on

* the time step ``t`` (sinusoidal embedding + MLP) and the slice depth ``D`` in [0, 1] (relative
  axial position in the volume; its own sinusoidal embedding + MLP, *added* to the time embedding,
  i.e. "embedded with the time step"),
* the class label ``c`` (tumour grade; index ``num_classes`` means "unknown" and is also used for
  the 10 % label dropout during training), a learned embedding added to the same vector,
* the lesion mask ``M`` at image resolution, through a learned convolutional mask encoder whose
  features are injected (1x1 projection, added) at every U-Net scale on the way down and up,
* optionally (``prior_channels`` > 0) **the brain prior's latent**: the standardised background
  latent of the placed donor brain, low-passed by a Gaussian of ``prior_smoothing_px`` latent pixels
  (:func:`prior_condition`), concatenated to ``z_t`` at the input. Trained with the condition made
  the same way from the training slice's own latent, the model learns to draw the finer anatomy
  (gyri, sulci, tissue boundaries below about 2.5 latent pixels, 20 mm at 240 x 240) around a given
  coarse layout; at inference the layout is the donor's and the finer anatomy is new. Started from
  the prior's own latent noised to a fraction ``strength`` of the chain (:func:`sample_latents`,
  SDEdit), the draw is a learned variation of the prior whose size ``strength`` sets.

Architecture (paper 2.1): an input convolution, 3 down blocks (two convolutions, a stride-2
convolution, 4-head self-attention after the downsampling), a bottom block of three convolutions,
and 3 mirrored up blocks (upsampling to the skip's size, concatenation with the skip, two
convolutions, self-attention), an output convolution. Odd latent sizes (30 -> 15 -> 8 -> 4 for
240x240 slices) are handled by resizing to the skip's size.

Training uses MONAI's ``DDPMScheduler`` (``add_noise``). Sampling uses :class:`NoiseSchedule`, the
same arithmetic as MONAI's ``DDPMScheduler`` (full T=1000 ancestral chain) and ``DDIMScheduler``
(eta = 0, few steps) without importing MONAI at inference (seconds of import time on a busy CPU);
tests check it against MONAI. Sample clipping is off because latents are unbounded (they are
standardised by ``latent_shift``/``latent_scale`` before diffusion).
"""
import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from .lesion_vae import SelfAttention2d
from .model_card import JSONConfig


@dataclass(frozen=True)
class LatentDiffusionConfig(JSONConfig):
    """Sizes and schedule of the conditional latent diffusion model.

    ``image_size`` is the slice size of the lesion mask (the VAE's), ``latent_size`` =
    ``image_size // 8`` that of the latent. ``beta_schedule`` is a MONAI schedule name.
    """

    image_size: int = 64
    latent_channels: int = 16
    channels: Tuple[int, int, int] = (32, 64, 64)
    embedding_dim: int = 128
    mask_channels: int = 32
    num_classes: int = 2
    attention_heads: int = 4
    num_train_timesteps: int = 1000
    beta_schedule: str = "scaled_linear_beta"
    beta_start: float = 0.0015
    beta_end: float = 0.0195
    #: channels of the brain-prior latent concatenated to z_t (0: the paper's model, no prior)
    prior_channels: int = 0
    #: Gaussian low-pass of the prior latent (latent pixels) before it conditions the model
    prior_smoothing_px: float = 1.0

    @property
    def latent_size(self) -> int:
        return self.image_size // 8



def smooth_latent(z: torch.Tensor, sigma_px: float) -> torch.Tensor:
    """(B, C, h, w) latents blurred in-plane by a Gaussian of ``sigma_px`` latent pixels (reflect
    padding, 3 sigma support); ``sigma_px`` <= 0 returns them unchanged."""
    if sigma_px <= 0:
        return z
    radius = max(1, int(math.ceil(3.0 * sigma_px)))
    radius = min(radius, z.shape[-1] - 1, z.shape[-2] - 1)
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float32, device=z.device)
    kernel = torch.exp(-0.5 * (offsets / sigma_px) ** 2)
    kernel = (kernel / kernel.sum()).to(z.dtype)
    channels = z.shape[1]
    x = F.pad(z, (radius, radius, 0, 0), mode="reflect")
    x = F.conv2d(x, kernel.view(1, 1, 1, -1).repeat(channels, 1, 1, 1), groups=channels)
    x = F.pad(x, (0, 0, radius, radius), mode="reflect")
    return F.conv2d(x, kernel.view(1, 1, -1, 1).repeat(channels, 1, 1, 1), groups=channels)


def prior_condition(prior_latent: torch.Tensor, config: "LatentDiffusionConfig") -> torch.Tensor:
    """The conditioning input made from a standardised prior latent: its low-pass
    (:func:`smooth_latent`, ``config.prior_smoothing_px``). The same function makes the training
    condition from the training slice's own latent."""
    return smooth_latent(prior_latent, config.prior_smoothing_px)


def sinusoidal_embedding(values: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """(B,) float values -> (B, dim) sinusoidal features (transformer/DDPM convention)."""
    half = dim // 2
    frequencies = torch.exp(-math.log(max_period) * torch.arange(half, device=values.device, dtype=torch.float32) / half)
    angles = values.float()[:, None] * frequencies[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(8, channels), channels)


class EmbeddedConv(nn.Module):
    """GroupNorm, SiLU, 3x3 conv, plus a per-channel shift from the condition embedding; residual."""

    def __init__(self, in_channels: int, out_channels: int, embedding_dim: int) -> None:
        super().__init__()
        self.norm = _group_norm(in_channels)
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.embedding = nn.Linear(embedding_dim, out_channels)
        self.skip = nn.Identity() if in_channels == out_channels else nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        h = self.conv(F.silu(self.norm(x))) + self.embedding(F.silu(embedding))[:, :, None, None]
        return h + self.skip(x)


class MaskEncoder(nn.Module):
    """Lesion mask (B, 1, S, S) -> one feature map per U-Net scale (latent size, /2, /4, /8)."""

    def __init__(self, mask_channels: int, levels: int = 4) -> None:
        super().__init__()
        c = mask_channels
        self.to_latent = nn.Sequential(
            nn.Conv2d(1, c // 2, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(c // 2, c, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(c, c, 3, stride=2, padding=1), nn.SiLU())
        self.downs = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, c, 3, stride=2, padding=1), nn.SiLU()) for _ in range(levels - 1))

    def forward(self, mask: torch.Tensor, sizes: List[Tuple[int, int]]) -> List[torch.Tensor]:
        features = [F.adaptive_avg_pool2d(self.to_latent(mask), sizes[0])]
        for down, size in zip(self.downs, sizes[1:]):
            feature = down(features[-1])
            if feature.shape[-2:] != size:
                feature = F.interpolate(feature, size=size, mode="nearest")
            features.append(feature)
        return features


class DownBlock(nn.Module):
    """Two embedded convolutions (their output is the skip), stride-2 conv, self-attention."""

    def __init__(self, in_channels: int, out_channels: int, config: LatentDiffusionConfig) -> None:
        super().__init__()
        self.convs = nn.ModuleList([EmbeddedConv(in_channels, out_channels, config.embedding_dim),
                                    EmbeddedConv(out_channels, out_channels, config.embedding_dim)])
        self.mask_projection = nn.Conv2d(config.mask_channels, out_channels, 1)
        self.downsample = nn.Conv2d(out_channels, out_channels, 3, stride=2, padding=1)
        self.attention = SelfAttention2d(out_channels, config.attention_heads)

    def forward(self, x, embedding, mask_feature):
        for conv in self.convs:
            x = conv(x, embedding)
        x = x + self.mask_projection(mask_feature)
        skip = x
        return self.attention(self.downsample(x)), skip


class UpBlock(nn.Module):
    """Upsample to the skip's size, concatenate the skip, two embedded convolutions, self-attention."""

    def __init__(self, in_channels: int, skip_channels: int, out_channels: int, config: LatentDiffusionConfig) -> None:
        super().__init__()
        self.upsample_conv = nn.Conv2d(in_channels, in_channels, 3, padding=1)
        self.convs = nn.ModuleList([EmbeddedConv(in_channels + skip_channels, out_channels, config.embedding_dim),
                                    EmbeddedConv(out_channels, out_channels, config.embedding_dim)])
        self.mask_projection = nn.Conv2d(config.mask_channels, out_channels, 1)
        self.attention = SelfAttention2d(out_channels, config.attention_heads)

    def forward(self, x, skip, embedding, mask_feature):
        x = self.upsample_conv(F.interpolate(x, size=skip.shape[-2:], mode="nearest"))
        x = torch.cat([x, skip], dim=1)
        for conv in self.convs:
            x = conv(x, embedding)
        return self.attention(x + self.mask_projection(mask_feature))


class ConditionalLatentUNet(nn.Module):
    """eps_theta(z_t, t, c, M, D): the conditional denoiser of eq. 17-18."""

    def __init__(self, config: LatentDiffusionConfig = LatentDiffusionConfig()) -> None:
        super().__init__()
        self.config = config
        c1, c2, c3 = config.channels
        e = config.embedding_dim
        self.time_mlp = nn.Sequential(nn.Linear(e, e), nn.SiLU(), nn.Linear(e, e))
        self.depth_mlp = nn.Sequential(nn.Linear(e, e), nn.SiLU(), nn.Linear(e, e))
        self.class_embedding = nn.Embedding(config.num_classes + 1, e)
        self.mask_encoder = MaskEncoder(config.mask_channels, levels=4)
        self.input_conv = nn.Conv2d(config.latent_channels + config.prior_channels, c1, 3, padding=1)
        self.downs = nn.ModuleList([DownBlock(c1, c1, config), DownBlock(c1, c2, config), DownBlock(c2, c3, config)])
        self.bottom = nn.ModuleList([EmbeddedConv(c3, c3, e) for _ in range(3)])
        self.bottom_mask_projection = nn.Conv2d(config.mask_channels, c3, 1)
        self.ups = nn.ModuleList([UpBlock(c3, c3, c2, config), UpBlock(c2, c2, c1, config), UpBlock(c1, c1, c1, config)])
        self.output = nn.Sequential(_group_norm(c1), nn.SiLU(), nn.Conv2d(c1, config.latent_channels, 3, padding=1))

    @property
    def unknown_class(self) -> int:
        """The class index meaning "no label" (also used for label dropout in training)."""
        return self.config.num_classes

    def encode_conditions(self, class_labels: torch.Tensor, lesion_mask: torch.Tensor,
                          depths: torch.Tensor, latent_hw: Tuple[int, int],
                          prior_latent: Optional[torch.Tensor] = None) -> Tuple:
        """The time-independent part of the conditioning: (class + depth embedding, mask features
        per scale, prior condition or None). Computed once per sampling run instead of once per
        step. ``prior_latent``: the standardised prior latent (B, prior_channels, s, s), required
        when the model has ``prior_channels`` (it is low-passed here, :func:`prior_condition`)."""
        e = self.config.embedding_dim
        static = self.depth_mlp(sinusoidal_embedding(depths * 1000.0, e)) + self.class_embedding(class_labels)
        sizes = [tuple(latent_hw)]
        for _ in range(3):
            sizes.append(((sizes[-1][0] + 1) // 2, (sizes[-1][1] + 1) // 2))
        prior = None
        if self.config.prior_channels:
            if prior_latent is None:
                raise ValueError("this diffusion model is conditioned on the brain prior's latent; pass prior_latent")
            prior = prior_condition(prior_latent, self.config)
        elif prior_latent is not None:
            raise ValueError("this diffusion model takes no prior latent (prior_channels = 0)")
        return static, self.mask_encoder(lesion_mask, sizes), prior

    def forward(self, z_t: torch.Tensor, timesteps: torch.Tensor, class_labels: torch.Tensor,
                lesion_mask: torch.Tensor, depths: torch.Tensor,
                prior_latent: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Predicted noise for latents ``z_t`` (B, C, s, s); ``lesion_mask`` (B, 1, S, S) in {0, 1};
        ``timesteps`` (B,) int; ``class_labels`` (B,) long; ``depths`` (B,) float in [0, 1];
        ``prior_latent`` (B, prior_channels, s, s) for a prior-conditioned model."""
        conditions = self.encode_conditions(class_labels, lesion_mask, depths, tuple(z_t.shape[-2:]), prior_latent)
        return self.denoise(z_t, timesteps, conditions)

    def denoise(self, z_t: torch.Tensor, timesteps: torch.Tensor, conditions: Tuple) -> torch.Tensor:
        """Predicted noise given precomputed :meth:`encode_conditions` output."""
        static_embedding, mask_features = conditions[0], conditions[1]
        prior = conditions[2] if len(conditions) > 2 else None
        embedding = self.time_mlp(sinusoidal_embedding(timesteps, self.config.embedding_dim)) + static_embedding
        x = self.input_conv(z_t if prior is None else torch.cat([z_t, prior.to(z_t.dtype)], dim=1))
        skips = []
        for level, down in enumerate(self.downs):
            x, skip = down(x, embedding, mask_features[level])
            skips.append(skip)
        for conv in self.bottom:
            x = conv(x, embedding)
        x = x + self.bottom_mask_projection(mask_features[3])
        for level, up in zip((2, 1, 0), self.ups):
            x = up(x, skips[level], embedding, mask_features[level])
        return self.output(x)


def make_ddpm_scheduler(config: LatentDiffusionConfig):
    """MONAI DDPM scheduler for training (``add_noise``) and the full T-step sampler."""
    from monai.networks.schedulers import DDPMScheduler

    return DDPMScheduler(num_train_timesteps=config.num_train_timesteps, schedule=config.beta_schedule,
                         beta_start=config.beta_start, beta_end=config.beta_end, clip_sample=False)


def make_ddim_scheduler(config: LatentDiffusionConfig, steps: int):
    """MONAI DDIM scheduler set to ``steps`` inference steps (deterministic with eta = 0)."""
    from monai.networks.schedulers import DDIMScheduler

    if not 1 <= steps <= config.num_train_timesteps:
        raise ValueError(f"steps must be in 1..{config.num_train_timesteps}, got {steps}")
    scheduler = DDIMScheduler(num_train_timesteps=config.num_train_timesteps, schedule=config.beta_schedule,
                              beta_start=config.beta_start, beta_end=config.beta_end, clip_sample=False)
    scheduler.set_timesteps(steps)
    return scheduler


def diffusion_loss(model: ConditionalLatentUNet, scheduler, z0: torch.Tensor, class_labels: torch.Tensor,
                   lesion_mask: torch.Tensor, depths: torch.Tensor, generator: Optional[torch.Generator] = None,
                   label_dropout: float = 0.1) -> torch.Tensor:
    """Eq. 18: MSE between the added noise and the predicted noise at uniformly drawn t. A
    prior-conditioned model gets the low-pass of ``z0`` itself as its prior condition (module docstring).

    ``model`` may be wrapped in DistributedDataParallel; random draws come from ``generator`` (CPU)."""
    core = getattr(model, "module", model)
    batch = z0.shape[0]
    device = z0.device
    timesteps = torch.randint(0, core.config.num_train_timesteps, (batch,), generator=generator,
                              device="cpu").to(device)
    noise = torch.randn(z0.shape, generator=generator, device="cpu").to(device)
    if label_dropout > 0:
        drop = torch.rand(batch, generator=generator, device="cpu").to(device) < label_dropout
        class_labels = torch.where(drop, torch.full_like(class_labels, core.unknown_class), class_labels)
    z_t = scheduler.add_noise(z0, noise, timesteps)
    prior = z0 if core.config.prior_channels else None  # low-passed in encode_conditions
    return F.mse_loss(model(z_t, timesteps, class_labels, lesion_mask, depths, prior), noise)


class NoiseSchedule:
    """The DDPM/DDIM arithmetic on the config's beta schedule, without importing MONAI (whose import
    costs seconds on a busy CPU). Same betas as MONAI's ``linear_beta``/``scaled_linear_beta``, same
    DDIM time steps and update (eta = 0) as ``monai.networks.schedulers.DDIMScheduler`` with
    ``clip_sample=False``; the tests check both against MONAI."""

    def __init__(self, config: LatentDiffusionConfig) -> None:
        steps = config.num_train_timesteps
        if config.beta_schedule == "linear_beta":
            betas = torch.linspace(config.beta_start, config.beta_end, steps, dtype=torch.float32)
        elif config.beta_schedule == "scaled_linear_beta":
            betas = torch.linspace(config.beta_start ** 0.5, config.beta_end ** 0.5, steps, dtype=torch.float32) ** 2
        else:
            raise ValueError(f"unsupported beta schedule {config.beta_schedule!r}")
        self.num_train_timesteps = steps
        self.betas = betas
        self.alphas = 1.0 - betas
        self.alphas_cumprod = torch.cumprod(self.alphas, dim=0)

    def ddim_timesteps(self, steps: int) -> List[int]:
        if not 1 <= steps <= self.num_train_timesteps:
            raise ValueError(f"steps must be in 1..{self.num_train_timesteps}, got {steps}")
        return [int(t) for t in torch.linspace(self.num_train_timesteps - 1, 0, steps).round().long()]

    def partial_timesteps(self, strength: float, steps: int) -> List[int]:
        """``steps`` DDIM time steps from round(strength (T - 1)) down to 0 (distinct, decreasing)."""
        start = int(round(strength * (self.num_train_timesteps - 1)))
        steps = max(1, min(steps, start + 1))
        values = torch.linspace(start, 0, steps).round().long().tolist()
        return [int(v) for v in values]

    def ddim_step(self, eps: torch.Tensor, t: int, z: torch.Tensor, steps: int) -> torch.Tensor:
        """Deterministic DDIM update (eta = 0) from t to t - T // steps (MONAI's convention)."""
        return self.ddim_step_to(eps, t, t - self.num_train_timesteps // steps, z)

    def ddim_step_to(self, eps: torch.Tensor, t: int, previous: int, z: torch.Tensor) -> torch.Tensor:
        """Deterministic DDIM update (eta = 0) from t to ``previous`` (< 0: to the clean latent)."""
        alpha_t = self.alphas_cumprod[t].to(z)
        alpha_prev = self.alphas_cumprod[previous].to(z) if previous >= 0 else torch.ones((), dtype=z.dtype, device=z.device)
        z0 = (z - (1 - alpha_t) ** 0.5 * eps) / alpha_t ** 0.5
        return alpha_prev ** 0.5 * z0 + (1 - alpha_prev) ** 0.5 * eps

    def ddpm_step(self, eps: torch.Tensor, t: int, z: torch.Tensor, generator) -> torch.Tensor:
        """Ancestral DDPM update (posterior mean + fixed variance beta_tilde), noise drawn on the CPU."""
        alpha_prod_t = self.alphas_cumprod[t].to(z)
        beta_prod_t = 1 - alpha_prod_t
        z0 = (z - beta_prod_t ** 0.5 * eps) / alpha_prod_t ** 0.5
        if t == 0:
            return z0
        alpha_prod_prev = self.alphas_cumprod[t - 1].to(z)
        coeff_z0 = alpha_prod_prev ** 0.5 * self.betas[t].to(z) / beta_prod_t
        coeff_zt = self.alphas[t].to(z) ** 0.5 * (1 - alpha_prod_prev) / beta_prod_t
        variance = ((1 - alpha_prod_prev) / beta_prod_t * self.betas[t].to(z)).clamp_min(1e-20)
        noise = torch.randn(z.shape, generator=generator, device="cpu").to(z.device)
        return coeff_z0 * z0 + coeff_zt * z + variance ** 0.5 * noise


@torch.no_grad()
def sample_latents(model: ConditionalLatentUNet, class_labels: torch.Tensor, lesion_mask: torch.Tensor,
                   depths: torch.Tensor, steps: int = 10, sampler: str = "ddim",
                   generator: Optional[torch.Generator] = None,
                   progress: Optional[Callable[[float, str], None]] = None,
                   initial_noise: Optional[torch.Tensor] = None,
                   step_hook: Optional[Callable[[int, torch.Tensor], torch.Tensor]] = None,
                   prior_latent: Optional[torch.Tensor] = None,
                   start_latent: Optional[torch.Tensor] = None, strength: float = 1.0) -> torch.Tensor:
    """Draw background latents (standardised units) given the conditions, from N(0, I) noise.

    ``sampler="ddim"`` runs ``steps`` deterministic DDIM steps; ``sampler="ddpm"`` the full
    T-step ancestral chain (``steps`` ignored). All noise comes from ``generator`` on the CPU, so
    the same seed gives the same latents on CPU and CUDA (up to floating-point differences).
    ``initial_noise``: z_T to start from instead of a draw (e.g. correlated along depth);
    ``step_hook(step index, z)`` -> z: called after every step (e.g. an inpainting-style blend with
    a neighbouring slice's trajectory); its return value continues the chain.
    ``prior_latent``: the brain prior's standardised latent, for a prior-conditioned model.
    ``start_latent`` with ``strength`` in (0, 1] (DDIM only; SDEdit): the chain starts at
    t = strength (T - 1) from ``start_latent`` noised to that step with the initial noise, and runs
    ``steps`` DDIM steps from there to 0; ``strength`` 1 is a draw from noise alone.
    """
    config = model.config
    device = lesion_mask.device
    batch = lesion_mask.shape[0]
    shape = (batch, config.latent_channels, config.latent_size, config.latent_size)
    if prior_latent is not None:
        shape = (batch, config.latent_channels) + tuple(prior_latent.shape[-2:])
    if initial_noise is not None:
        z = initial_noise.to(device)
        shape = tuple(z.shape)
    else:
        z = torch.randn(shape, generator=generator, device="cpu").to(device)
    schedule = NoiseSchedule(config)
    if not 0.0 < strength <= 1.0:
        raise ValueError(f"strength must be in (0, 1], got {strength}")
    if sampler == "ddim":
        if start_latent is not None:
            timesteps = schedule.partial_timesteps(strength, steps)
            alpha = schedule.alphas_cumprod[timesteps[0]].to(z)
            z = alpha ** 0.5 * start_latent.to(z) + (1 - alpha) ** 0.5 * z
        else:
            timesteps = schedule.ddim_timesteps(steps)
    elif sampler == "ddpm":
        if start_latent is not None:
            raise ValueError("a start latent (strength) needs the ddim sampler")
        timesteps = list(range(config.num_train_timesteps - 1, -1, -1))
    else:
        raise ValueError(f"unknown sampler {sampler!r} (use ddim or ddpm)")
    conditions = model.encode_conditions(class_labels, lesion_mask, depths, shape[-2:], prior_latent)
    for index, t in enumerate(timesteps):
        t_batch = torch.full((batch,), t, device=device, dtype=torch.long)
        eps = model.denoise(z, t_batch, conditions)
        if sampler == "ddim":
            previous = timesteps[index + 1] if index + 1 < len(timesteps) else -1
            if start_latent is None:
                z = schedule.ddim_step(eps, t, z, steps)
            else:
                z = schedule.ddim_step_to(eps, t, previous, z)
        else:
            z = schedule.ddpm_step(eps, t, z, generator)
        if step_hook is not None:
            z = step_hook(index, z)
        if progress is not None:
            progress((index + 1) / len(timesteps), f"denoising step {index + 1}/{len(timesteps)}")
    return z
