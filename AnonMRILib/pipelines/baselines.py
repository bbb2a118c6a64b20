"""Removal baselines and REFACE: de-identify by removing, obscuring or replacing the face,
keeping every brain voxel.

    from AnonMRILib.pipelines.baselines import deface, REMOVAL_METHODS
    defaced = deface(volume, "quickshear", brain_mask=mask)     # Volume on volume's grid, its dtype

=============  ===========================================================================
method         what happens outside the brain
=============  ===========================================================================
quickshear     QUICKSHEAR (Schimke et al. 2011): 0 below a plane under the brain's sagittal
               convex hull (face, front of the neck); :mod:`.removal.quickshear`
facemask       FACE MASK (after Milchenko & Marcus 2013): the face region strongly blurred,
               its surface kept without features; :mod:`.removal.face_blur`
deface         DEFACE (pydeface without FSL): 0 in pydeface's face mask registered to the image
               with SimpleITK; :mod:`.removal.template_deface`
skullstrip     brain with its sulcal CSF kept, all else 0 (MRI WATERSHED-like);
               :mod:`.removal.brain_only`
blur           every non-brain voxel Gaussian-blurred (4 mm); :mod:`.removal.face_blur`
black          every non-brain voxel 0; :mod:`.removal.brain_only`
reface         not a removal: everything outside the brain replaced by an average head placed
               from the brain mask and convex hull alone (mri_reface family); :mod:`.reface`
=============  ===========================================================================

Every method returns a Volume on the input's grid in the input's voxel type whose brain-mask
voxels equal the input's bit for bit: the output is composed with
:func:`AnonMRILib.transforms.brain_preservation.compose_preserving`, which checks it and raises
:class:`~AnonMRILib.errors.InvariantError` otherwise. Removed voxels are set to 0. The brain mask
is the user's when given, else :func:`AnonMRILib.transforms.brain_mask.resolve_brain_mask`'s.
``seed`` drives the only random step (DEFACE's metric sampling): same seed, same output.
"""
from typing import Optional

import numpy as np

from ..errors import InputError
from ..io.volume import Volume, require_usable_image
from ..progress import ProgressCallback, report, sub_progress

#: the removal methods, in the order figures and benchmarks list them
REMOVAL_METHODS = ("quickshear", "facemask", "deface", "skullstrip", "blur", "black", "reface")


def removed_region(volume: Volume, method: str, brain: np.ndarray, seed: int = 0, config: Optional[object] = None,
                   progress: Optional[ProgressCallback] = None) -> np.ndarray:
    """float32 image of ``method``'s output before the brain is copied back (see module docstring).

    ``brain`` is a boolean array on ``volume``'s grid; ``config`` the method's config dataclass
    (``QuickshearConfig``, ``FaceMaskConfig``, ``DefaceConfig``, ``SkullStripConfig``,
    ``BlurConfig``, ``AnatomicalPriorConfig``) or None for its defaults.
    """
    from .removal import brain_only, face_blur, quickshear, template_deface

    data = np.asarray(volume.array)
    zero = np.zeros((), dtype=data.dtype)
    if method == "quickshear":
        face, _ = quickshear.quickshear_face_mask(brain, volume, config or quickshear.QuickshearConfig())
        return np.where(face, zero, data)
    if method == "facemask":
        return face_blur.blurred_face(volume, brain, config or face_blur.FaceMaskConfig())
    if method == "deface":
        face = template_deface.template_face_mask(volume, config or template_deface.DefaceConfig(), seed=seed,
                                                  progress=progress)
        return np.where(face, zero, data)
    if method == "skullstrip":
        keep = brain_only.skull_stripped_region(brain, volume, config or brain_only.SkullStripConfig())
        return np.where(keep, data, zero)
    if method == "blur":
        return face_blur.blurred_head(volume, brain, config or face_blur.BlurConfig())
    if method == "black":
        return np.where(brain, data, zero)
    if method == "reface":
        from .reface import place_prior_for

        prior, _ = place_prior_for(volume, volume.with_array(brain.view(np.uint8)), seed=seed, config=config,
                                   progress=progress)
        return prior.array
    raise InputError(f"unknown removal method {method!r}; choose one of {', '.join(REMOVAL_METHODS)}")


def deface(volume: Volume, method: str, brain_mask: Optional[Volume] = None,
           progress: Optional[ProgressCallback] = None, seed: int = 0, config: Optional[object] = None) -> Volume:
    """De-identify ``volume`` with the removal ``method`` (one of :data:`REMOVAL_METHODS`).

    ``brain_mask``: the user's mask (nonzero = brain) on ``volume``'s grid, else one is computed.
    Returns a new Volume on ``volume``'s grid and dtype; brain voxels bit-exact (checked).
    """
    from ..transforms.brain_mask import resolve_brain_mask
    from ..transforms.brain_preservation import check_brain_preserved, compose_preserving

    if method not in REMOVAL_METHODS:
        raise InputError(f"unknown removal method {method!r}; choose one of {', '.join(REMOVAL_METHODS)}")
    require_usable_image(volume)
    mask_progress = None if brain_mask is not None else sub_progress(progress, 0.0, 0.3)
    brain_volume = resolve_brain_mask(volume, brain_mask, progress=mask_progress)
    brain = np.asarray(brain_volume.array) != 0
    report(progress, 0.3, f"{method}: removing the face")
    changed = removed_region(volume, method, brain, seed=seed, config=config,
                             progress=sub_progress(progress, 0.3, 0.95))
    report(progress, 0.95, f"{method}: checking the brain voxels")
    output = compose_preserving(volume, volume.with_array(changed), brain_volume)
    check_brain_preserved(volume, output, brain_volume)      # the invariant, checked on what is returned
    report(progress, 1.0, f"{method}: done")
    return output
