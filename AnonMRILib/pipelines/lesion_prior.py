"""The lesion method on a placed donor-brain prior (``prior="donor"``, the default).

    brains, details = generate_on_brain_prior(volumes, lesion, brain, contrasts, config, models, seed)

For one or several co-registered contrasts of one patient (BraTS: T1, T1c, T2, FLAIR) on one grid:

1. **tissue classes** of the reference contrast (the first) inside the non-lesion brain, and each
   contrast's per-class intensity quantiles over those classes
   (:func:`~AnonMRILib.transforms.brain_prior.classify_patient_tissues`,
   :func:`~AnonMRILib.transforms.brain_prior.tissue_statistics`): global statistics only;
2. **one placement** of a donor brain from the brain mask and the lesion mask
   (:func:`~AnonMRILib.transforms.brain_prior.place_brain_prior`), shared by every contrast: one
   anatomy in four contrasts;
3. **T_b per contrast**: the donor's labels rendered with that contrast's statistics, resampled onto
   the input grid (slab-averaged on thick slices), enhancement calibrated (a post-contrast input's
   enhancing fraction is met on the input grid, where slab averaging dilutes thin vessels: one
   correction of the donor fraction by the measured ratio), the input's noise level and in-plane
   sharpness given to it (:func:`match_texture`: seeded noise, unsharp masking; two global numbers);
4. **the lesion through the paper's networks**: per axial slice, E2 encodes the input's lesion
   ``x M`` (its latent is kept and checked unchanged, as in the paper), E1 encodes the prior's
   background ``T_b (1 - M)``, and D3 decodes ``[z_l, z_s]``; the decoded slice gives the lesion
   region and a ``feather_px`` band outside it, where it blends into T_b, so the lesion joins the new
   anatomy through the joint decoder. With ``exact_lesion`` the lesion voxels are the input's and no
   network runs; in the band T_b blends towards the lesion's own edge values carried outward
   (:func:`feather_from_lesion`), so the kept lesion meets the new anatomy without a step.

Why not the paper's generator here: its latent diffusion model draws z_s from (grade, M, depth) only,
so the brain it decodes is its own 64-pixel blob (3.75 mm pixels, blurred, T1 contrast whatever the
input). Here z_s is the prior's latent, so the anatomy is a real brain at the input's resolution and
contrast; the variation comes from the donor, its mirroring and a seeded smooth deformation. A
latent-diffusion model trained to draw z_s *around* the prior's latent (conditioned on it) is the
next step; ``prior="none"`` keeps the paper's path unchanged.

Invariant (tested): outside the lesion and its feather band the output depends on the input only
through the brain mask, the lesion mask, the per-class intensity quantiles, the noise level, the mean
in-plane gradient magnitude and the seed; inside the band also through the lesion (its latent, or with ``exact_lesion`` its voxels).
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError, InvariantError
from ..io.volume import Volume
from ..progress import ProgressCallback, report, sub_progress


def match_texture(prior: np.ndarray, image: np.ndarray, region: np.ndarray, reference: np.ndarray,
                  slice_axis: int, seed: int, sigma_px: float = 1.0, max_amount: float = 3.0
                  ) -> Tuple[np.ndarray, Dict[str, float]]:
    """``prior`` with the input's noise level and in-plane sharpness in ``region``
    (:func:`AnonMRILib.transforms.appearance.match_sharpness` without its histogram step: seeded
    Gaussian noise of the input's Immerkaer level, then unsharp masking of width ``sigma_px`` whose
    amount (at most ``max_amount``) makes the mean interior gradient magnitude the input's over
    ``reference``). Two global numbers of the input are used: its noise level and mean gradient."""
    from ..transforms.appearance import match_sharpness

    stack = lambda a: np.moveaxis(np.asarray(a), slice_axis, 0)  # noqa: E731
    out, figures = match_sharpness(stack(prior), stack(image), stack(region), stack(reference), (sigma_px, sigma_px),
                                   max_amount=max_amount, match_intensity=False, add_noise=True, seed=seed)
    details = {"noise_sigma_added": round(float(figures["noise_sigma"]), 3),
               "sharpening_amount": figures["sharpening_amount"],
               "sharpness_ratio_reached": round(float(figures["sharpness_ratio_reached"]), 3)}
    return np.moveaxis(out, 0, slice_axis).astype(np.float32), details


def _enhancing_fraction_on_grid(prior: np.ndarray, region: np.ndarray, threshold: float) -> float:
    values = prior[region]
    return float((values > threshold).mean()) if values.size else 0.0


def render_contrast(placement, statistics, image: Volume, region: np.ndarray, interior: np.ndarray, prior_config,
                    seed: int, canonical: Optional[np.ndarray] = None
                    ) -> Tuple[np.ndarray, Dict[str, float]]:
    """T_b of one contrast on ``image``'s grid (float32) over ``region``, with the enhancement
    calibration of the module docstring (step 3), measured over ``interior``, when ``statistics``
    has an enhancing tail. The correction at most quadruples the donor fraction. ``canonical``: the
    (varied) canonical prior on that grid, rendered instead of the donor (:func:`render_varied`)."""
    import dataclasses

    from ..transforms.brain_prior import render_brain_prior, render_tissue_values

    # the tissue rendering does not depend on the enhancing fraction: once, for both renderings below
    tissue = None if canonical is None else render_tissue_values(canonical, placement.donor.card, statistics,
                                                                 prior_config)

    def render(stats) -> np.ndarray:
        if tissue is not None:
            return render_varied(tissue, placement, stats, image, region, prior_config, seed)
        return np.asarray(render_brain_prior(placement, stats, image, region, prior_config, seed).array)

    prior = render(statistics)
    details: Dict[str, float] = {}
    if statistics.enhancing is None:
        return prior, details
    tail_threshold = statistics.enhancing_threshold
    reached = _enhancing_fraction_on_grid(prior, interior, tail_threshold)
    wanted = statistics.enhancing_fraction
    details.update({"enhancing_fraction_input": round(wanted, 4), "enhancing_fraction_first": round(reached, 4)})
    if reached > 0 and abs(reached / wanted - 1.0) > 0.2:
        prior = render(dataclasses.replace(statistics, enhancing_fraction=wanted * min(wanted / reached, 4.0)))
        reached = _enhancing_fraction_on_grid(prior, interior, tail_threshold)
    details["enhancing_fraction_output"] = round(reached, 4)
    return prior, details


def render_varied(tissue: np.ndarray, placement, statistics, image: Volume, region: np.ndarray, prior_config,
                  seed: int) -> np.ndarray:
    """T_b of one contrast from the (varied) canonical prior on ``image``'s grid: ``tissue``, its values
    already rendered in the patient's contrast
    (:func:`~AnonMRILib.transforms.brain_prior.render_tissue_values`), plus the enhancing sites of a
    post-contrast input carried from the donor through the placement (slab fraction f:
    ``(1 - f) tissue + f enhancement``). float32."""
    from ..transforms.brain_prior import enhancement_image, resample_placed

    out = tissue
    enhancement = enhancement_image(placement.donor, statistics, prior_config, seed)
    if enhancement is not None:
        intensity, sites = enhancement
        value = resample_placed(placement, intensity, image, region, prior_config)
        fraction = resample_placed(placement, sites, image, region, prior_config)
        out = (1.0 - fraction) * out + value
    return out.astype(np.float32)


def feather_from_lesion(prior: np.ndarray, image: np.ndarray, lesion: np.ndarray, brain: np.ndarray,
                        slice_axis: int, width_px: int, sigma_px: float = 1.5) -> np.ndarray:
    """Exact lesion: ``prior`` blended, in a band of ``width_px`` voxels (in-plane) outside the lesion,
    towards the lesion's own boundary values carried outward (in-plane normalised Gaussian
    convolution of the lesion voxels only), linearly from the lesion's edge to T_b. The kept lesion
    then meets the new anatomy without a step, and nothing outside the lesion comes from the input."""
    from scipy import ndimage

    from .lesion import feather_weights

    stack = lambda a: np.moveaxis(np.asarray(a), slice_axis, 0)  # noqa: E731
    lesion_s, image_s = stack(lesion), stack(image).astype(np.float64)
    weight = feather_weights(lesion_s, width_px)
    blur = (0.0, sigma_px, sigma_px)
    carried = ndimage.gaussian_filter(np.where(lesion_s, image_s, 0.0), blur) / np.maximum(
        ndimage.gaussian_filter(lesion_s.astype(np.float64), blur), 1e-6)
    band = (weight > 0) & ~lesion_s & stack(brain)
    out = np.array(stack(prior), dtype=np.float64, copy=True)
    out[band] = weight[band] * carried[band] + (1.0 - weight[band]) * out[band]
    return np.moveaxis(out, 0, slice_axis)


def decode_lesion_slices(models, priors: np.ndarray, image: np.ndarray, lesion: np.ndarray, region: np.ndarray,
                         spacing, window: Tuple[float, float], batch_size: int = 32) -> np.ndarray:
    """The lesion method's networks on the prior (module docstring, step 4), slices along the last
    axis of RAS-layout arrays: returns the decoded slices on the input grid (input units), with the
    lesion latent invariant checked. ``priors``: T_b; ``image``: the input; ``lesion``, ``region``
    bool; ``window``: the intensity window mapped to [0, 1]."""
    import torch

    from .lesion import slices_from_model, slices_to_model

    low, high = window
    present = np.flatnonzero(lesion.any(axis=(0, 1)))
    out = np.array(priors, dtype=np.float32, copy=True)
    if present.size == 0:
        return out
    size = models.image_size
    box = np.argwhere(region)
    center = (box.min(0) + box.max(0)) / 2.0
    norm = lambda a: np.clip((np.asarray(a, np.float64) - low) / (high - low), 0.0, 1.0).astype(np.float32)  # noqa
    composite = np.where(lesion, image, priors) * region
    stack = np.moveaxis(norm(np.where(region, composite, low))[:, :, present], -1, 0)
    mask_stack = np.moveaxis(lesion[:, :, present], -1, 0).astype(np.float32)
    model_images = np.clip(slices_to_model(stack, spacing[:2], center[:2], size), 0.0, 1.0)
    soft = slices_to_model(mask_stack, spacing[:2], center[:2], size)
    model_masks = (soft >= 0.5) | ((soft > 0) & ~(soft >= 0.5).reshape(len(soft), -1).any(1)[:, None, None])
    autoencoder = models.autoencoder
    autoencoder.eval()
    decoded = []
    with torch.no_grad():
        for start in range(0, len(present), batch_size):
            x = torch.from_numpy(model_images[start:start + batch_size])[:, None].to(models.device)
            m = torch.from_numpy(model_masks[start:start + batch_size].astype(np.float32))[:, None].to(models.device)
            z_lesion, _ = autoencoder.encode_lesion(x, m)
            stored = z_lesion.clone()
            z_background, _ = autoencoder.encode_background(x, m)
            decoded.append(autoencoder.decode_joint(z_lesion, z_background).clamp(0.0, 1.0)[:, 0].cpu().numpy())
            again, _ = autoencoder.encode_lesion(x, m)
            if not torch.equal(z_lesion, stored) or not torch.allclose(again, stored, rtol=1e-4, atol=1e-5):
                raise InvariantError("the lesion latent used for decoding is not the lesion encoder's output")
    back = slices_from_model(np.concatenate(decoded), spacing[:2], center[:2], image.shape[:2])
    out[:, :, present] = np.moveaxis(back.astype(np.float64) * (high - low) + low, 0, -1)
    return out


def training_window(brain_values: np.ndarray) -> Tuple[float, float]:
    """The intensity window mapped to [0, 1] for the networks: the brain's minimum to 0 and its 99th
    percentile to :data:`~AnonMRILib.pipelines.prior_variation.TRAINING_P99`, as in the training slices."""
    from .prior_variation import TRAINING_P99

    values = np.asarray(brain_values, dtype=np.float64)
    low = float(values.min()) if values.size else 0.0
    high = float(np.percentile(values, 99.0)) if values.size else 1.0
    return low, low + max(high - low, 1e-6) / TRAINING_P99


#: voxels around the brain's bounding box that the generation works on (the edge and feather bands)
BOX_MARGIN_VOXELS = 6
#: with the donor's outline, the box reaches at least this far (mm) beyond the patient's brain
DONOR_OUTLINE_MARGIN_MM = 20.0


def resolve_outline(outline: str, kind: str) -> str:
    """``"patient"`` or ``"donor"`` from a :attr:`BrainPriorConfig.outline` setting and the input kind
    (``"head"`` or ``"brain"``): a whole head's brain must fit its skull, so it is always the patient's."""
    if kind == "head":
        return "patient"
    return "donor" if outline == "auto" else outline


def generate_on_brain_prior(volumes: Sequence[Volume], lesion: np.ndarray, brain: np.ndarray,
                            contrasts: Sequence[str], config, models=None, seed: int = 0,
                            progress: Optional[ProgressCallback] = None, kind: str = "head"
                            ) -> Tuple[List[np.ndarray], Dict, np.ndarray]:
    """Regenerated brains (float64 arrays on the input grid, one per contrast; only the returned
    region's voxels and a few around them are meant to be used), details, and the output's brain
    region (bool; ``brain`` with the patient's outline, the placed donor's brain joined with the
    lesion with the donor's, :func:`resolve_outline`). ``lesion``, ``brain`` bool arrays of the shared
    grid (``brain`` includes the lesion); ``config`` a
    :class:`~AnonMRILib.pipelines.lesion.LesionAnonymizationConfig`; ``models`` the lesion networks
    (needed unless ``config.exact_lesion`` and no learned variation); ``kind`` the input kind. Works on
    the brain's bounding box plus a margin (0 outside it)."""
    if not brain.any():
        raise InputError("the brain region is empty")
    if len(contrasts) != len(volumes):
        raise InputError("give one contrast name per image")
    outline = resolve_outline(config.brain_prior.outline, kind)
    corners = np.argwhere(brain)
    margin = np.full(3, BOX_MARGIN_VOXELS + max(int(config.edge_blend_px), int(config.feather_px)))
    if outline == "donor":
        spacing = np.asarray(volumes[0].spacing, dtype=np.float64)
        margin = np.maximum(margin, np.ceil(DONOR_OUTLINE_MARGIN_MM / spacing).astype(int))
    low = np.maximum(corners.min(axis=0) - margin, 0)
    high = np.minimum(corners.max(axis=0) + margin + 1, brain.shape)
    box = tuple(slice(int(a), int(b)) for a, b in zip(low, high))
    boxed, details, boxed_region = _generate_in_box([v.cropped(box) for v in volumes], lesion[box], brain[box],
                                                    contrasts, config, models, seed, progress, outline)
    outputs = []
    for volume, generated in zip(volumes, boxed):
        full = np.zeros(volume.shape, dtype=np.float64)
        full[box] = generated
        outputs.append(full)
    region = np.zeros(brain.shape, dtype=bool)
    region[box] = boxed_region
    return outputs, details, region


def _generate_in_box(volumes: Sequence[Volume], lesion: np.ndarray, brain: np.ndarray, contrasts: Sequence[str],
                     config, models, seed: int, progress: Optional[ProgressCallback], outline: str
                     ) -> Tuple[List[np.ndarray], Dict, np.ndarray]:
    """:func:`generate_on_brain_prior` on volumes cropped to the brain's box."""
    from ..transforms.brain_prior import (canonical_csf_level, canonical_donor,
                                          classify_patient_tissues, guess_tissue_order, is_t1_like, place_brain_prior,
                                          placed_brain_mask, resample_placed, tissue_statistics)
    from .lesion import axial_layout, feather_weights, from_ras_layout, grade_index, to_ras_layout

    prior_config = config.brain_prior
    variation = config.variation
    reference = volumes[0]
    report(progress, 0.0, "brain prior: tissue classes")
    tissues = classify_patient_tissues(reference, brain, lesion, contrasts[0], prior_config)
    labels, order = tissues.labels, tissues.order
    details: Dict = {"prior": "donor", "tissue_order": [tissues.described]}
    placement = place_brain_prior(reference.with_array(brain.astype(np.uint8)),
                                  reference.with_array(lesion.astype(np.uint8)), seed=seed, config=prior_config,
                                  progress=sub_progress(progress, 0.05, 0.3), outline=outline)
    details.update({"donor": placement.donor.name, **placement.details,
                    "slab_mm": round(float(prior_config.slice_thickness_mm or max(reference.spacing)), 3)})
    region = brain
    if outline == "donor":
        region = placed_brain_mask(placement, reference, np.ones(brain.shape, bool), prior_config) | lesion
        if not region.any():
            raise InputError("the placed donor brain misses the image; check the brain mask")
    layout = axial_layout(reference.affine)
    order_, flips = layout
    slice_axis = layout[0][2]
    canonical = None
    if variation.strength > 0:
        from .prior_variation import require_prior_models, vary_prior

        require_prior_models(models)
        report(progress, 0.3, "brain prior: learned variation")
        canonical = resample_placed(placement, canonical_donor(placement.donor), reference, region, prior_config,
                                    canonical_csf_level(placement.donor))
        spacing = np.asarray(reference.spacing)[list(order_)]
        grade = grade_index(config.grade, models.diffusion.config.num_classes)
        varied = vary_prior(*(to_ras_layout(a, order_, flips) for a in (canonical, lesion, region)), spacing, models,
                            variation, seed, grade, sub_progress(progress, 0.3, 0.5))
        canonical = np.ascontiguousarray(from_ras_layout(varied, order_, flips))
        details["variation_strength"] = variation.strength
    outputs = []
    reference_region = brain & (labels > 0)
    start = 0.5 if canonical is not None else 0.3
    for index, (volume, contrast) in enumerate(zip(volumes, contrasts)):
        part = sub_progress(progress, start + (0.95 - start) * index / len(volumes),
                            start + (0.95 - start) * (index + 1) / len(volumes))
        report(part, 0.0, f"brain prior: contrast {index + 1} of {len(volumes)}")
        if index == 0:
            image_order = order
        elif contrast == "auto":
            image_order = guess_tissue_order(np.asarray(volume.array)[reference_region].astype(np.float64),
                                             tissues.deep_values(volume.array))
            details["tissue_order"].append(f"auto: {', '.join(image_order)} from dark to bright")
        else:
            from ..transforms.brain_prior import CONTRAST_ORDERS

            image_order = CONTRAST_ORDERS[contrast]
            details["tissue_order"].append(contrast)
        bright = is_t1_like(image_order)
        statistics = tissue_statistics(volume, tissues, prior_config, bright_tail=bright, reference=index == 0)
        data = np.asarray(volume.array, dtype=np.float64)
        prior, enhancement = render_contrast(placement, statistics, volume, region, tissues.interior & ~lesion,
                                             prior_config, seed + index, canonical)
        report(part, 0.6, "brain prior: noise and sharpness")
        texture: Dict[str, float] = {}
        if prior_config.match_texture:
            prior, texture = match_texture(prior, data, region & ~lesion, reference_region & ~lesion, slice_axis,
                                           seed + index)
        details.setdefault("contrasts", []).append({**texture, **enhancement})
        if not config.exact_lesion:
            if models is None:
                raise InputError("regenerating the lesion from its latent needs the lesion networks")
            ras = [to_ras_layout(a, order_, flips) for a in (prior, data, lesion, region)]
            spacing = np.asarray(volume.spacing)[list(order_)]
            window = training_window(data[brain])
            decoded = decode_lesion_slices(models, ras[0], ras[1], ras[2], ras[3], spacing, window,
                                           batch_size=config.batch_size)
            weight = np.moveaxis(feather_weights(np.moveaxis(ras[2], -1, 0), config.feather_px), 0, -1)
            blended = weight * decoded + (1.0 - weight) * ras[0]
            prior = from_ras_layout(blended, order_, flips)
        elif config.feather_px > 0 and lesion.any():
            prior = feather_from_lesion(prior, data, lesion, region, slice_axis, config.feather_px)
        outputs.append(np.asarray(prior, dtype=np.float64))
    report(progress, 1.0, "brain prior: done")
    return outputs, details, region
