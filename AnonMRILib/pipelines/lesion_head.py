"""Whole-head inputs for lesion-preserving anonymization: input kind, brain region, face treatment.

The lesion models regenerate the *brain* (they were trained on skull-stripped slices). A scan with
skull, scalp and face is handled by :func:`~AnonMRILib.pipelines.lesion.anonymize_lesions` as:

1. :func:`input_kind` -- ``"brain"`` for a skull-stripped (BraTS-style) input, ``"head"`` otherwise;
2. the brain mask b(x) (:func:`~AnonMRILib.transforms.brain_mask.resolve_brain_mask`: the user's
   mask or the default backend) joined with the lesion (:func:`brain_region`);
3. inside b(x) the lesion pipeline's generated brain, extended to fill all of b(x)
   (:func:`fill_brain_mask`); outside it :func:`face_treatment`, the face method the user picks
   (:data:`FACE_METHODS`); the output is a complete head on the input's grid.

**Filling the brain mask.** The diffusion model is conditioned on the lesion mask and the slice
depth, not on the brain's outline, so the brain it draws is its own shape: on pyradiomics brain1
(HD-BET mask) 22 % of the brain-mask voxels lay outside the generated brain (up to 62 % of a slice
at the temporal lobes), and the composition put the model's black background there -- blocky
black holes of 3.75 mm model pixels at the brain's edge, darker than any tissue, that a reader
sees at once. Their edges also made up most of the "sharpness" that the appearance matching
reached (sharpness ratio 1.00 over the brain, 0.40 over the generated tissue alone).
:func:`fill_brain_mask` gives those pixels tissue extrapolated from the nearest generated brain
(normalised Gaussian convolution at growing widths, on the model grid, before the write-back and
the appearance matching); the model's own soft edge inside the mask (:data:`FILL_EDGE_PX` pixels)
is treated the same way. Lesion pixels are never changed. The filled tissue is smooth: the
sharpness ratio then reports the model's real blur (README, whole-head case).

Detection rule (:func:`input_kind` with ``kind="auto"``): an input is brain-only when at least
90 % of the voxels outside its Otsu head mask are exactly at the image minimum (skull stripping
sets them to one value; air in a head scan is noisy) *and* the head mask holds at most 2,000 mL
(an adult brain with a tumour is about 1.1-1.7 L, a head with face over 2.4 L in every head
here). Measured: the ROBEX atlas skull-stripped with its own mask 1,204 mL, 99.7 % at the minimum;
the four real heads and brain1 2,426-4,445 mL, at most 11 % at the minimum. Pass ``kind`` to
override (a child's head, a defaced head with zeroed air).
"""
import warnings
from typing import Optional, Tuple

import numpy as np

from ..errors import InputError
from ..io.volume import Volume
from ..progress import ProgressCallback

#: face treatments outside the brain: CP-GAN remodeling, the lead's refacing, removal methods, none
FACE_METHODS = ("remodel", "reface", "quickshear", "facemask", "deface", "skullstrip", "blur", "black", "none")
INPUT_KINDS = ("auto", "head", "brain")
BRAIN_ONLY_MAX_ML = 2000.0
BRAIN_ONLY_MIN_BACKGROUND_FRACTION = 0.9
#: a lesion more than this fraction outside the brain mask is refused (mask on the wrong image?)
MAX_LESION_OUTSIDE_BRAIN = 0.5

FACE_KEPT_WARNING = ("face method 'none' keeps the original skull, scalp and face outside the brain: "
                     "the output is still identifiable from a face rendering")


def input_kind(volume: Volume, kind: str = "auto") -> str:
    """``"brain"`` (skull-stripped input) or ``"head"`` (skull and face present); see the module
    docstring for the ``"auto"`` rule."""
    if kind not in INPUT_KINDS:
        raise InputError(f"unknown input kind {kind!r} (use one of {', '.join(INPUT_KINDS)})")
    if kind != "auto":
        return kind
    from ..transforms.head_mask import head_mask_array

    array = np.asarray(volume.array)
    head = head_mask_array(array)
    outside = ~head
    at_minimum = float((array[outside] == array.min()).mean()) if outside.any() else 0.0
    head_ml = float(head.sum()) * float(np.prod(volume.spacing)) / 1000.0
    brain_only = at_minimum >= BRAIN_ONLY_MIN_BACKGROUND_FRACTION and head_ml <= BRAIN_ONLY_MAX_ML
    return "brain" if brain_only else "head"


def brain_region(brain: np.ndarray, lesion: np.ndarray) -> Tuple[np.ndarray, int]:
    """(brain | lesion, lesion voxels outside the brain mask). The lesion always belongs to the
    regenerated/preserved region, so a tumour reaching the brain's edge (or beyond a tight mask)
    is kept whole and never given to the face treatment. More than :data:`MAX_LESION_OUTSIDE_BRAIN`
    of the lesion outside the mask is refused: the mask or the lesion is probably on another image."""
    outside = int((lesion & ~brain).sum())
    total = int(lesion.sum())
    if total and outside > MAX_LESION_OUTSIDE_BRAIN * total:
        raise InputError(f"{100.0 * outside / total:.0f} % of the lesion lies outside the brain mask; "
                         "are the lesion mask and the brain mask from this image?")
    return brain | lesion, outside


#: model pixels of the generated brain's own edge that are re-filled (its soft fall-off to background):
#: on brain1 a dark ring along the drawn outline stayed visible with 1 pixel, not with 2 or 3
FILL_EDGE_PX = 2
#: Gaussian widths (model pixels) of the normalised convolution that fills the uncovered brain mask
FILL_SIGMAS_PX = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def fill_brain_mask(generated: np.ndarray, brain: np.ndarray, lesion: np.ndarray, foreground: float,
                    edge_px: int = FILL_EDGE_PX) -> Tuple[np.ndarray, float]:
    """Generated model slices (N, S, S) in [0, 1] with every pixel of ``brain`` (bool, N x S x S: the
    input's brain mask on the model grid) that the generated brain does not cover given tissue
    extrapolated from the covered pixels; returns (filled copy, fraction of ``brain`` that was filled).

    Covered = above ``foreground`` and more than ``edge_px`` pixels (in-plane) inside the generated
    foreground. Each uncovered pixel gets G_s * (g 1[covered]) / G_s * 1[covered] (in-plane Gaussian
    G_s) at the smallest width s of :data:`FILL_SIGMAS_PX` where that denominator is at least 1e-3,
    so near tissue it takes the nearby values and far from it a wider average. ``lesion`` pixels and
    pixels outside ``brain`` are returned unchanged; a slice with no covered pixel is left as it is."""
    from scipy import ndimage

    generated = np.asarray(generated, dtype=np.float32)
    brain = np.asarray(brain, dtype=bool)
    foreground_mask = generated > foreground
    if edge_px > 0:
        structure = np.zeros((3, 3, 3), dtype=bool)
        structure[1] = ndimage.generate_binary_structure(2, 1)
        covered = ndimage.binary_erosion(foreground_mask, structure=structure, iterations=edge_px)
    else:
        covered = foreground_mask
    todo = brain & ~covered & ~np.asarray(lesion, dtype=bool)
    todo &= covered.reshape(len(covered), -1).any(axis=1)[:, None, None]  # slices with tissue to extend
    total = int(brain.sum())
    if not todo.any():
        return generated.copy(), 0.0
    out = generated.copy()
    weights = covered.astype(np.float32)
    values = generated * weights
    remaining = todo.copy()
    for sigma in FILL_SIGMAS_PX:
        blur = (0.0, sigma, sigma)
        denominator = ndimage.gaussian_filter(weights, blur, mode="constant")
        take = remaining & (denominator >= 1e-3)
        if take.any():
            numerator = ndimage.gaussian_filter(values, blur, mode="constant")
            out[take] = numerator[take] / denominator[take]
            remaining &= ~take
        if not remaining.any():
            break
    if remaining.any():  # farther than 3 x the widest width from any tissue: the slice's mean tissue
        for index in np.flatnonzero(remaining.reshape(len(remaining), -1).any(axis=1)):
            out[index][remaining[index]] = float(generated[index][covered[index]].mean())
    return out, float(todo.sum()) / max(total, 1)


def face_treatment(volume: Volume, brain: Volume, method: str, seed: int = 0, device: str = "auto",
                   progress: Optional[ProgressCallback] = None, slice_thickness_mm: Optional[float] = None) -> Volume:
    """The input with everything outside ``brain`` (uint8 0/1 on its grid) treated by ``method``:
    ``remodel`` -> :func:`~AnonMRILib.pipelines.remodel.remodel_face`, ``none`` -> the input
    unchanged (warns: the face stays identifiable), any other name ->
    :func:`~AnonMRILib.pipelines.baselines.deface` (removal methods and ``reface``). Brain voxels
    are the input's in every case (each method checks it). ``slice_thickness_mm``: the input's
    slice thickness when not its spacing, for the anatomical prior of ``remodel`` and ``reface``."""
    if method not in FACE_METHODS:
        raise InputError(f"unknown face method {method!r} (use one of {', '.join(FACE_METHODS)})")
    if method == "none":
        warnings.warn(FACE_KEPT_WARNING, UserWarning)
        return volume
    prior_config = None
    if method in ("remodel", "reface") and slice_thickness_mm is not None:
        from ..transforms.anatomical_prior import AnatomicalPriorConfig

        prior_config = AnatomicalPriorConfig(slice_thickness_mm=slice_thickness_mm)
    if method == "remodel":
        from .remodel import remodel_face

        return remodel_face(volume, brain_mask=brain, device=device, seed=seed, progress=progress,
                            prior_config=prior_config)
    from .baselines import deface

    return deface(volume, method, brain_mask=brain, progress=progress, seed=seed, config=prior_config)
