"""The learned variation of the brain prior: the paper's VAE and latent diffusion on top of T_b.

    varied = vary_prior(canonical, lesion, region, spacing, models, config, seed, grade)

``canonical`` is the placed donor brain in the donor's own T1 units on the input grid (one array for
every contrast of the patient: the variation runs once, so T1, T1c, T2 and FLAIR keep one anatomy;
each contrast is rendered from the varied canonical image afterwards,
:func:`AnonMRILib.pipelines.lesion_prior.render_varied`). Per axial slice, at the paper's size
(240 x 240 pixels of 1 mm, the 240 mm model field of view centred on the brain):

1. E1 (the background encoder) encodes the prior's background ``T_b (1 - M)``: the prior latent
   z_p ([16 x 30 x 30] posterior mean, standardised by the diffusion model's shift and scale);
2. the latent diffusion model, conditioned on grade c, lesion mask M, slice depth D **and the prior's
   latent** (its low-pass, :func:`AnonMRILib.models.latent_diffusion.prior_condition`), draws z_s by
   DDIM from z_p noised to ``strength`` of the chain (SDEdit): a learned variation of the prior whose
   size ``strength`` sets -- 0 keeps the prior (no network runs), 1 draws the finer anatomy anew
   around the donor's coarse layout;
3. the background decoder decodes z_s and z_p; their difference ``D_b(z_s) - D_b(z_p)`` -- the
   learned change -- goes back onto the input's pixels and is added to the prior at the input's own
   resolution (``T_b + D_b(z_s) - D_b(z_p)``, not ``D_b(z_s)``): the 8x-downsampling VAE's round trip
   alone blurs gyri and sulci of a few millimetres (whole-slice SSIM 0.95 still leaves them soft; the
   input's sharpness matching then only hid it in the gradient figures), so what the decoder cannot
   represent stays the placed donor's, and strength 0 is the placed prior exactly. (The paper decodes
   z_s alone; its generator has no prior to keep.)

**Shared along depth**: the initial noise of neighbouring slices is an AR(1) sequence along the
slice axis (correlation ``exp(-gap / depth_correlation_mm)``), and the conditions (the prior, a 3-D
placement) change smoothly from slice to slice, so the variation is one smooth field, not
independent per slice.

The lesion joins the varied anatomy afterwards through the joint decoder D3 ``[z_l, z_s]``
(:func:`AnonMRILib.pipelines.lesion_prior.decode_lesion_slices`), or, with exact lesion voxels, through
the feathered band (:func:`AnonMRILib.pipelines.lesion_prior.feather_from_lesion`).

Intensities: the canonical image's brain voxels are mapped to the training data's range, the 99th
percentile to 0.85 (the synthetic training slices are scaled so; 0 stays 0), and back.

Invariant: the variation sees only the placed prior (built from masks), the lesion mask, the grade,
the slice positions and the seed -- nothing of the patient's image.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..device import inference_autocast
from ..errors import InputError, WeightsError
from ..progress import ProgressCallback, report

#: the training slices' 99th brain percentile (``synthesize_patient`` scales by 0.85)
TRAINING_P99 = 0.85


@dataclass(frozen=True)
class PriorVariationConfig:
    """``strength``: fraction of the diffusion chain the prior latent is noised to (0 = no learned
    variation, 1 = drawn from noise with the prior as condition only); ``steps``: DDIM steps over
    that part of the chain; ``depth_correlation_mm``: correlation length of the initial noise along
    the slice axis; ``batch_size``: slices per network call."""

    strength: float = 0.3
    steps: int = 10
    depth_correlation_mm: float = 8.0
    batch_size: int = 16

    def __post_init__(self) -> None:
        if not 0.0 <= self.strength <= 1.0:
            raise InputError(f"the variation strength must lie in [0, 1], got {self.strength}")
        if self.steps < 1:
            raise InputError("the variation needs at least one denoising step")
        if self.depth_correlation_mm < 0:
            raise InputError("depth_correlation_mm must be >= 0")


def depth_correlated_noise(positions_mm: np.ndarray, shape, length_mm: float, generator) -> "object":
    """(N,) + ``shape`` standard normal noise, AR(1) along ``positions_mm`` (sorted order): slice k is
    ``rho z_{k-1} + sqrt(1 - rho^2) e_k`` with ``rho = exp(-gap / length_mm)`` (0: independent)."""
    import torch

    order = np.argsort(np.asarray(positions_mm, dtype=np.float64), kind="stable")
    noise = torch.randn((len(order),) + tuple(shape), generator=generator)
    out = torch.empty_like(noise)
    previous = None
    for rank, index in enumerate(order):
        if previous is None or length_mm <= 0:
            out[index] = noise[rank]
        else:
            rho = float(np.exp(-abs(positions_mm[index] - positions_mm[previous]) / length_mm))
            out[index] = rho * out[previous] + (1.0 - rho ** 2) ** 0.5 * noise[rank]
        previous = index
    return out


def require_prior_models(models) -> None:
    """Refuse lesion networks whose diffusion model is not conditioned on the brain prior."""
    if models is None or not getattr(models.diffusion.config, "prior_channels", 0):
        raise WeightsError("the learned variation of the brain prior needs a diffusion model conditioned on the "
                           "prior's latent (prior_channels > 0); train it with Training/train_lesion_diffusion.py "
                           "--set prior_conditioned=true, or set the variation strength to 0")


def vary_prior(canonical: np.ndarray, lesion: np.ndarray, region: np.ndarray, spacing, models,
               config: PriorVariationConfig = PriorVariationConfig(), seed: int = 0, grade: int = 2,
               progress: Optional[ProgressCallback] = None) -> np.ndarray:
    """The varied canonical prior (float32, same units and grid) in RAS layout (slices along the last
    axis): ``canonical`` (X, Y, Z), ``lesion`` and ``region`` (the output's brain, lesion included)
    bool, ``spacing`` (mm, in that layout), ``grade`` an index of the diffusion model's classes (its
    ``num_classes`` = unknown). Voxels outside ``region`` and inside the lesion are returned unchanged
    (module docstring)."""
    import torch

    from ..models.latent_diffusion import sample_latents
    from .lesion import BRATS_DEPTH_SPAN_MM, slices_from_model, slices_to_model

    out = np.array(canonical, dtype=np.float32, copy=True)
    if config.strength <= 0:
        return out
    require_prior_models(models)
    present = np.flatnonzero(region.any(axis=(0, 1)))
    if present.size == 0:
        return out
    autoencoder, diffusion, device = models.autoencoder, models.diffusion, models.device
    size = models.image_size
    values = canonical[region & ~lesion]
    low, high = 0.0, float(np.percentile(values, 99.0)) if values.size else 1.0
    scale = TRAINING_P99 / max(high - low, 1e-6)
    box = np.argwhere(region)
    center = (box.min(0) + box.max(0)) / 2.0
    background = np.where(region & ~lesion, (canonical - low) * scale, 0.0)
    stack = np.clip(np.moveaxis(background[:, :, present], -1, 0), 0.0, 1.0).astype(np.float32)
    images = np.clip(slices_to_model(stack, spacing[:2], center[:2], size), 0.0, 1.0)
    soft = slices_to_model(np.moveaxis(lesion[:, :, present], -1, 0).astype(np.float32), spacing[:2], center[:2], size)
    masks = (soft >= 0.5).astype(np.float32)
    positions = present * float(spacing[2])
    depths = np.clip(0.5 + (present - center[2]) * spacing[2] / BRATS_DEPTH_SPAN_MM, 0.0, 1.0).astype(np.float32)
    generator = torch.Generator().manual_seed(int(seed) * 7919 + 17)
    latent_shape = (diffusion.config.latent_channels, size // 8, size // 8)
    noise = depth_correlated_noise(positions, latent_shape, config.depth_correlation_mm, generator)
    change = np.empty_like(images)
    autoencoder.eval()
    diffusion.eval()
    batch = max(1, int(config.batch_size))
    with torch.no_grad():
        for start in range(0, len(present), batch):
            part = slice(start, start + batch)
            x = torch.from_numpy(images[part])[:, None].to(device)
            m = torch.from_numpy(masks[part])[:, None].to(device)
            with inference_autocast(device):  # VAE in bfloat16 where the CPU has it; diffusion in float32
                mean, _ = autoencoder.encode_background(x, m)
            prior = (mean.float() - models.latent_shift) / models.latent_scale
            count = prior.shape[0]
            c = torch.full((count,), int(grade), dtype=torch.long, device=device)
            d = torch.from_numpy(depths[part]).to(device)
            z = sample_latents(diffusion, c, m, d, steps=config.steps, prior_latent=prior, start_latent=prior,
                               strength=config.strength, initial_noise=noise[part].to(device))
            with inference_autocast(device):  # VAE in bfloat16 where the CPU has it; diffusion in float32
                latents = torch.cat([z * models.latent_scale + models.latent_shift, mean.float()])
                both = autoencoder.background_vae.decoder(latents).float().clamp(0.0, 1.0)[:, 0]
            change[part] = (both[:count] - both[count:]).cpu().numpy()  # D_b(z_s) - D_b(z_p)
            report(progress, min(1.0, (start + count) / len(present)), "learned variation of the prior")
    back = slices_from_model(change, spacing[:2], center[:2], canonical.shape[:2])
    varied = np.maximum(canonical[:, :, present] + np.moveaxis(back, 0, -1) / scale, 0.0)
    inside = (region & ~lesion)[:, :, present]
    target = out[:, :, present]
    target[inside] = varied[inside]
    out[:, :, present] = target
    return out
