"""Face remodeling with CP-GAN: ``remodel_face(volume) -> Volume`` in the input's own grid.

Stages (each reported through ``progress``):

1. **brain mask** b(x): the user's mask (checked to lie on the input grid) or
   :func:`~AnonMRILib.transforms.brain_mask.resolve_brain_mask`;
2. **privacy transform** gamma(x) = [convex hull, brain mask, brain intensities] on the S^3
   model grid (:func:`~AnonMRILib.transforms.privacy.privacy_transform`, with the settings the
   weights were trained with, read from their model card);
3. **generator**: G(gamma) at S^3 on CUDA when available (``device="auto"``), else CPU; a CUDA
   out-of-memory error is reported (progress message and a ``RuntimeWarning``) and the step is
   retried on the CPU;
4. **back to the input grid**: the generated head is resampled (linear) from the model grid to
   the input grid, set to the background level outside the convex hull, and composed with the
   input so that every brain voxel is *copied* from the input at native resolution
   (f = b*x + (1-b)*G). With a generator on the anatomical prior (``prior="average_head"``) the
   head outside the brain is instead T(x), placed at native resolution from gamma alone, either
   warped by the generator's displacement field (:func:`warp_prior`: the field in mm, resampled
   to the input grid, T read at p + u(p)) or plus its intensity residual (:func:`add_residual`).
   The brain voxels are then checked bit for bit against the input; any difference raises
   :class:`~AnonMRILib.errors.InvariantError` and nothing is returned.

Randomness (probabilistic pooling, g_0, the hull's random rotations) all comes from ``seed``:
the same input, weights and seed give the same output on CPU (CUDA may differ in the last bits
of the generated head; the brain is exact everywhere).
"""
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from ..errors import InputError, InvariantError
from ..io.volume import Volume, require_usable_image
from ..progress import ProgressCallback, report, sub_progress

WeightsLike = Union[None, str, Path]


def generate_on_model_grid(generator, gamma, seed: int = 0, device: Any = None, prior=None):
    """G(gamma) at full resolution: (S, S, S) float32 CPU tensor in normalised intensity units.

    ``gamma``: (3, S, S, S) tensor. ``prior``: T(x) on the model grid (S, S, S), normalised
    units, for a generator with ``prior="average_head"`` (else None). A generator that warps the
    prior (``config.warps_prior``) returns its displacement field instead, (3, S, S, S) in model
    voxels along the model grid's axes. The pyramid's Bernoulli draws and g_0 come from a CPU
    ``torch.Generator`` seeded with ``seed`` (same numbers on every device).
    """
    import torch

    from ..models.cpgan import image_pyramid
    from ..transforms.pooling import privacy_pyramid

    device = torch.device(device) if device is not None else next(generator.parameters()).device
    rng = torch.Generator()
    rng.manual_seed(int(seed))
    gamma = gamma.to(device=device, dtype=torch.float32)
    with torch.no_grad():
        gammas = privacy_pyramid(gamma[None], generator.config.scales, generator=rng)
        noise = generator.sample_noise(1, rng, device)
        priors = None
        if prior is not None:
            prior = torch.as_tensor(prior).to(device=device, dtype=torch.float32)
            priors = image_pyramid(prior[None, None], generator.config.scales)
        if generator.config.warps_prior:
            return generator.displacements(gammas, noise=noise, prior_pyramid=priors)[-1][0].to("cpu", torch.float32)
        output = generator(gammas, noise=noise, prior_pyramid=priors)[-1]
    return output[0, 0].to("cpu", torch.float32)


def _privacy_config(card: Dict[str, Any], size: int, rotations: Optional[int] = None):
    """The model card's privacy-transform settings at the generator's size; ``rotations`` overrides K."""
    from ..transforms.privacy import PrivacyTransformConfig

    values = dict(card.get("privacy_transform") or {})
    values["size"] = size
    if rotations is not None:
        if int(rotations) < 1:
            raise InputError(f"rotations K must be at least 1, got {rotations}")
        values["rotations"] = int(rotations)
    known = set(PrivacyTransformConfig.__dataclass_fields__)  # type: ignore[attr-defined]
    return PrivacyTransformConfig(**{k: v for k, v in values.items() if k in known})


def _run_generator(generator, gamma, seed: int, device, progress: Optional[ProgressCallback], prior=None):
    """Generate on ``device`` (:func:`generate_on_model_grid`); on CUDA out-of-memory warn and
    retry on the CPU."""
    import torch

    from ..device import is_cuda_out_of_memory

    try:
        return generate_on_model_grid(generator.to(device), gamma, seed=seed, device=device, prior=prior)
    except RuntimeError as error:
        if device.type != "cuda" or not is_cuda_out_of_memory(error):
            raise
        message = ("CUDA ran out of memory while running the CP-GAN generator; retrying on the CPU "
                   "(slower; close other GPU programs or use --device cpu)")
        warnings.warn(message, RuntimeWarning)
        report(progress, 0.0, message)
        torch.cuda.empty_cache()
        cpu = torch.device("cpu")
        return generate_on_model_grid(generator.to(cpu), gamma, seed=seed, device=cpu, prior=prior)


def add_residual(prior: Volume, residual_model: np.ndarray, transform, volume: Volume) -> Volume:
    """f = b*x + (1-b)*(T + R) on the input grid: T at native resolution plus the generator's
    residual R = G - T_model, resampled (linear), smoothed with a Gaussian of half a model voxel
    (no model-grid staircase) and faded out with the hull smoothed the same way; input's dtype,
    brain voxels copied (checked by the caller)."""
    from scipy import ndimage

    from ..transforms.brain_preservation import compose_preserving

    back = transform.grid.from_model(residual_model.astype(np.float32), volume).array * transform.normalization.scale
    sigma = 0.5 * float(transform.grid.spacing_mm) / np.asarray(volume.spacing, np.float64)
    residual = ndimage.gaussian_filter(back, sigma)
    inside = ndimage.gaussian_filter((np.asarray(transform.convex_hull.array) != 0).astype(np.float32), sigma)
    head = prior.array + residual * inside
    return compose_preserving(volume, volume.with_array(head.astype(np.float32)), transform.brain_mask)


def warp_prior(prior: Volume, displacement_model: np.ndarray, transform, volume: Volume, noise=None) -> Volume:
    """f = b*x + (1-b)*T(p + u(p)) on the input grid: T at native resolution warped by the
    generator's displacement u (``displacement_model``: (3, S, S, S) model voxels along the model
    grid's axes), turned into RAS mm, smoothed on the model grid by a Gaussian of half a model voxel
    and faded out with the model-grid hull smoothed the same way; T is read through that field
    (linear between model voxels) with a cubic B-spline (SimpleITK, 0 outside T) at every input voxel
    of the hull's bounding box (a zero displacement reads T's own voxel: B-splines interpolate;
    with trilinear reading the remodeled head outside the brain of sub-01 kept 0.70 of the input's
    gradient, with cubic 0.78).
    ``noise``: the prior's :class:`~AnonMRILib.transforms.anatomical_prior.PriorNoise`, added after
    the warp (``prior`` then noise-free), or None. Input's dtype, brain voxels copied (checked by
    the caller).

    (The first version resampled u to the input grid, smoothed it there and called scipy's
    ``map_coordinates`` on the moving voxels: 5.5 s of a 1 mm 256^3 head's 30 s; this is 1.5 s.)"""
    import SimpleITK as sitk
    from scipy import ndimage

    from ..io.readers import LPS_TO_RAS
    from ..io.writers import numpy_to_simpleitk
    from ..transforms.brain_preservation import compose_preserving
    from ..transforms.distance import bounding_box

    grid = transform.grid
    sigma = 0.5  # model voxels
    # the hull's covered fraction of each model voxel (not gamma's binary channel: its edge sits up
    # to half a model voxel off the input-grid hull's), smoothed over the part of the model grid that
    # the input covers (normalised convolution), so a hull cut by the field of view does not fade there
    hull = grid.to_model(transform.convex_hull, antialias="box")
    covered = grid.to_model(transform.convex_hull.with_array(np.ones(transform.convex_hull.shape, np.uint8)),
                            antialias="box")
    weight = ndimage.gaussian_filter(covered, sigma)
    inside = np.where(weight > 1e-3, ndimage.gaussian_filter(hull, sigma) / np.maximum(weight, 1e-3), 0.0)
    world_mm = np.tensordot(np.asarray(grid.affine, np.float64)[:3, :3],
                            np.asarray(displacement_model, np.float64), axes=(1, 0))
    lps_mm = np.stack([LPS_TO_RAS[axis, axis] * ndimage.gaussian_filter(world_mm[axis], sigma) * inside
                       for axis in range(3)])
    head = np.array(prior.array, np.float32, copy=True)
    extent = bounding_box(np.asarray(transform.convex_hull.array))
    if extent is not None and np.abs(lps_mm).max() > 0:
        reach = int(np.ceil(2.0 * float(grid.spacing_mm) / float(np.min(volume.spacing)))) + 2
        region = tuple(slice(max(0, int(a) - reach), min(n, int(b) + 1 + reach))
                       for a, b, n in zip(extent[0], extent[1], volume.shape))
        field = numpy_to_simpleitk(np.moveaxis(lps_mm, 0, -1), grid.affine)
        displacement = sitk.DisplacementFieldTransform(sitk.Cast(field, sitk.sitkVectorFloat64))
        box = volume.cropped(region)
        source = numpy_to_simpleitk(head[region], box.affine)
        warped = sitk.Resample(source, source, displacement, sitk.sitkBSpline, 0.0, sitk.sitkFloat32)
        head[region] = np.transpose(sitk.GetArrayFromImage(warped), (2, 1, 0))
    if noise is not None:
        head = noise.apply(head)
    return compose_preserving(volume, volume.with_array(head), transform.brain_mask)


def generator_view(card: Dict[str, Any], prior_config=None, target: Optional[Volume] = None):
    """The rendering of the anatomical prior that the generator's weights were trained on, when it
    differs from the one ``prior_config`` draws on ``target`` (the input's grid; else None): the
    model card's ``prior_fat_level``, ``prior_bright_stretch`` and ``prior_thick_slice_bright_stretch``
    (weights trained before these were recorded have none: the template's own fat level and a
    stretch of 2.0 for every grid, the only rendering there was). The generator's displacement is
    computed from that rendering, and then warps the prior drawn as configured, so recalibrating a
    class level changes the output's intensities, not where the generator moves the face. The labels
    are shared: the view has the vault in its layers too (:mod:`~AnonMRILib.transforms.vault_layers`,
    drawn after the shipped weights were trained; the face figures moved within the run-to-run
    change, ``docs/cpgan/tissue_slices.md``), so no second label map is built."""
    from dataclasses import replace

    from ..transforms.anatomical_prior import AnatomicalPriorConfig, prior_rendering

    config = prior_config or AnatomicalPriorConfig()
    record = prior_rendering(card)
    trained = replace(config, fat_level=record["prior_fat_level"], bright_stretch=record["prior_bright_stretch"],
                      thick_slice_bright_stretch=record["prior_thick_slice_bright_stretch"])
    if target is not None:
        config, trained = config.rendering_for(target), trained.rendering_for(target)
    if (trained.fat_level, trained.bright_stretch) == (config.fat_level, config.bright_stretch):
        return None
    return trained


def prior_output(generator, generated, prior: Optional[Volume], prior_model, transform, volume: Volume,
                 noise=None) -> Volume:
    """The generator's result on the input grid, brain voxels copied: G's image restored outside
    the hull (``prior="none"``), T plus the residual, or T warped by the displacement (``noise``:
    the prior's deferred noise, added after the warp)."""
    if prior is None:
        return transform.restore(generated, volume, suppress_outside_hull=True)
    if generator.config.warps_prior:
        return warp_prior(prior, generated.numpy(), transform, volume, noise=noise)
    if noise is not None:
        prior = prior.with_array(noise.apply(prior.array))
    return add_residual(prior, generated.numpy() - prior_model, transform, volume)


def remodel_face(volume: Volume, brain_mask: Optional[Volume] = None, weights: WeightsLike = None,
                 device: str = "auto", seed: int = 0, progress: Optional[ProgressCallback] = None,
                 rotations: Optional[int] = None, prior: Optional[str] = None, prior_config=None) -> Volume:
    """De-identify a whole-head T1 by remodeling everything outside the brain inside the head's hull.

    ``volume``: the head (any orientation and spacing). ``brain_mask``: nonzero = brain on the
    same grid, or None to compute one. ``weights``: CP-GAN generator safetensors (its model card
    beside it); None = the shipped weights of ``prior``: "average_head" (the default: the
    anatomical prior T(x) at native resolution, warped by the generator's displacement field, or
    plus its residual for weights trained that way) or "none" (the paper's generator, the face
    from gamma alone on the model grid); see the README's CP-GAN section.
    ``device``: auto | cpu | cuda. Returns a Volume on ``volume``'s grid with its dtype; brain voxels are the input's, bit for bit (checked).
    ``rotations``: K of the surface representation (None = the model card's value).
    ``prior_config``: :class:`~AnonMRILib.transforms.anatomical_prior.AnatomicalPriorConfig` of the
    anatomical prior (None = defaults; e.g. the input's slice thickness).
    Raises WeightsError (weights missing/corrupt), InputError (bad input), InvariantError.
    """
    volume_out, _ = remodel_face_with_details(volume, brain_mask, weights, device, seed, progress, rotations, prior,
                                              prior_config)
    return volume_out


def remodel_face_with_details(volume: Volume, brain_mask: Optional[Volume] = None, weights: WeightsLike = None,
                              device: str = "auto", seed: int = 0,
                              progress: Optional[ProgressCallback] = None,
                              rotations: Optional[int] = None,
                              prior: Optional[str] = None, prior_config=None) -> Tuple[Volume, Dict[str, Any]]:
    """:func:`remodel_face` plus details: the brain mask and convex hull used, stage timings (s)."""
    import time

    from ..device import resolve_device
    from ..models.cpgan_weights import load_generator
    from ..transforms.anatomical_prior import prior_from_transform
    from ..transforms.brain_mask import resolve_brain_mask
    from ..transforms.brain_preservation import check_brain_preserved
    from ..transforms.privacy import privacy_transform

    require_usable_image(volume)
    torch_device = resolve_device(device)
    timings: Dict[str, float] = {}

    start = time.perf_counter()
    report(progress, 0.0, "brain mask")
    mask = resolve_brain_mask(volume, brain_mask, progress=sub_progress(progress, 0.0, 0.35))
    timings["brain_mask"] = time.perf_counter() - start

    start = time.perf_counter()
    report(progress, 0.35, "loading CP-GAN weights")
    generator, card = load_generator(weights, device="cpu", prior=prior)
    timings["load_weights"] = time.perf_counter() - start

    start = time.perf_counter()
    report(progress, 0.4, "privacy transform")
    transform_done = 0.5 if generator.config.uses_prior else 0.7  # the prior's placement takes 0.5-0.7
    transform = privacy_transform(volume, mask, _privacy_config(card, generator.config.size, rotations), seed=seed,
                                  progress=sub_progress(progress, 0.4, transform_done))
    timings["privacy_transform"] = time.perf_counter() - start

    prior = prior_model = noise = None
    if generator.config.uses_prior:
        start = time.perf_counter()
        report(progress, 0.5, "placing the anatomical prior")
        # T without its noise (the generator sees it smooth); the noise is added after the warp. The
        # generator sees T rendered as in its training (generator_view), the output draws T as configured
        view = generator_view(card, prior_config, volume)
        prior, noise, *seen = prior_from_transform(volume, transform, config=prior_config,
                                                   progress=sub_progress(progress, 0.5, 0.7), seed=seed,
                                                   defer_noise=True, view=view)
        prior_model = transform.normalization.apply(transform.grid.to_model(seen[0] if seen else prior)
                                                    ).astype(np.float32)
        timings["anatomical_prior"] = time.perf_counter() - start

    start = time.perf_counter()
    report(progress, 0.7, f"generator on {torch_device.type}")
    generated = _run_generator(generator, transform.gamma, seed, torch_device, sub_progress(progress, 0.7, 0.85),
                               prior=prior_model)
    if not bool(np.isfinite(generated.numpy()).all()):
        raise InvariantError("the CP-GAN generator produced NaN or infinite values; nothing was written")
    timings["generator"] = time.perf_counter() - start

    start = time.perf_counter()
    report(progress, 0.85, "resampling back to the input grid")
    output = prior_output(generator, generated, prior, prior_model, transform, volume, noise=noise)
    check_brain_preserved(volume, output, mask)
    timings["resample_back"] = time.perf_counter() - start
    report(progress, 1.0, "face remodeled; brain voxels verified")
    details = {"brain_mask": mask, "convex_hull": transform.convex_hull, "timings_s": timings,
               "model_size": generator.config.size, "weights_sha256": card.get("sha256"),
               "device": str(torch_device)}
    return output, details


def remodel_scores(original: Volume, remodeled: Volume, brain_mask: Volume, convex_hull: Volume) -> Dict[str, float]:
    """Checks of a remodeling: brain voxels kept (fraction, 1.0 = all bit-exact) and face-region change.

    ``face_region_changed_fraction``: fraction of voxels inside the hull and outside the brain
    whose value changed; ``face_region_mean_abs_change``: their mean absolute change divided by
    the input's 99th percentile (unitless). Face shape: of the hull-minus-brain voxels in front of
    the brain's centroid (RAS A), those below the original's skin level (head threshold) are air; a real face leaves air inside its
    convex hull (around the nose, in the eye sockets, under the nose and chin), a generator that
    fills the hull does not. ``face_air_fraction_original`` / ``_remodeled``: the air fraction of
    each; ``face_air_dice``: Dice of the two air sets (where the remodeled face has its concavities
    compared with where a face has them inside this hull).
    """
    from ..transforms.head_mask import head_threshold

    if not (original.same_grid(remodeled) and original.same_grid(brain_mask) and original.same_grid(convex_hull)):
        raise InputError("original, remodeled, brain mask and hull must share one grid")
    brain = np.asarray(brain_mask.array) != 0
    before = np.asarray(original.array)
    after = np.asarray(remodeled.array)
    kept = float(np.mean(before[brain] == after[brain])) if brain.any() else 1.0
    region = (np.asarray(convex_hull.array) != 0) & ~brain
    scale = float(np.percentile(before, 99)) or 1.0
    difference = np.abs(after[region].astype(np.float64) - before[region].astype(np.float64))
    skin_level = head_threshold(before)
    centroid_a = float(brain_mask.world_coordinates(np.argwhere(brain)).mean(axis=0)[1]) if brain.any() else 0.0
    face = region & (convex_hull.world_axis(1) > centroid_a)
    face_voxels = max(1, int(face.sum()))
    air_before, air_after = face & (before < skin_level), face & (after < skin_level)
    return {
        "brain_voxels": int(brain.sum()),
        "brain_voxels_preserved_fraction": kept,
        "face_region_voxels": int(region.sum()),
        "face_region_changed_fraction": float(np.mean(difference > 0)) if region.any() else 0.0,
        "face_region_mean_abs_change": float(difference.mean() / scale) if region.any() else 0.0,
        "face_air_fraction_original": float(air_before.sum() / face_voxels),
        "face_air_fraction_remodeled": float(air_after.sum() / face_voxels),
        "face_air_dice": float(2.0 * (air_before & air_after).sum() / max(1, air_before.sum() + air_after.sum())),
    }
