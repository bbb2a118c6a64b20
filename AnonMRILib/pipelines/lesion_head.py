"""Whole-head inputs for lesion-preserving anonymization: input kind, brain region, face treatment.

The lesion models regenerate the *brain* (they were trained on skull-stripped slices). A scan with
skull, scalp and face is handled by :func:`~AnonMRILib.pipelines.lesion.anonymize_lesions` as:

1. :func:`input_kind` -- ``"brain"`` for a skull-stripped (BraTS-style) input, ``"head"`` otherwise;
2. the brain mask b(x) (:func:`~AnonMRILib.transforms.brain_mask.resolve_brain_mask`: the user's
   mask or the default backend) joined with the lesion (:func:`brain_region`);
3. inside b(x) the lesion pipeline's generated brain; outside it :func:`face_treatment`, the face
   method the user picks (:data:`FACE_METHODS`); the output is a complete head on the input's grid.

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


def face_treatment(volume: Volume, brain: Volume, method: str, seed: int = 0, device: str = "auto",
                   progress: Optional[ProgressCallback] = None) -> Volume:
    """The input with everything outside ``brain`` (uint8 0/1 on its grid) treated by ``method``:
    ``remodel`` -> :func:`~AnonMRILib.pipelines.remodel.remodel_face`, ``none`` -> the input
    unchanged (warns: the face stays identifiable), any other name ->
    :func:`~AnonMRILib.pipelines.baselines.deface` (removal methods and ``reface``). Brain voxels
    are the input's in every case (each method checks it)."""
    if method not in FACE_METHODS:
        raise InputError(f"unknown face method {method!r} (use one of {', '.join(FACE_METHODS)})")
    if method == "none":
        warnings.warn(FACE_KEPT_WARNING, UserWarning)
        return volume
    if method == "remodel":
        from .remodel import remodel_face

        return remodel_face(volume, brain_mask=brain, device=device, seed=seed, progress=progress)
    from .baselines import deface

    return deface(volume, method, brain_mask=brain, progress=progress, seed=seed)
