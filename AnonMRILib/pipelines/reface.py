"""REFACE: replace everything outside the brain by a template head placed from gamma(x) alone.

The mri_reface / AFNI refacer family without their templates' licences or FreeSurfer: the face,
skull, scalp, ears and neck of the output are the tissue model of
:mod:`AnonMRILib.transforms.anatomical_prior` (one real head's labelled non-brain tissues, BSD,
under MakeHuman's neutral skin, CC0), carried onto the patient by the brain mask and the convex
hull and drawn in the contrast of the patient's own brain; the brain is the patient's, bit for bit.

    from AnonMRILib.pipelines.reface import reface
    out = reface(volume, brain_mask=mask)        # Volume on volume's grid and dtype

Stages: brain mask (the user's or :func:`resolve_brain_mask`) -> convex hull c(x) and the
intensity normalisation of the privacy transform (:func:`privacy_transform` at S = 128; only its
hull on the input grid and its air level are used) -> T(x) placed from (b, c, median of b*x) ->
f = b*x + (1-b)*T, brain voxels checked bit for bit.

**Invariant (tested):** outside the brain the output depends on the input only through
gamma(x) = [c, b, b*x]: the prior sees the brain mask, the hull and the brain's voxels (its
tissue levels, noise level and outermost layer); the air level is the median of the voxels below
the head threshold (air, outside the head). ``seed`` drives the hull's random rotations and
facets and the prior's noise.
"""
from typing import Any, Dict, Optional, Tuple

from ..io.volume import Volume, require_usable_image
from ..progress import ProgressCallback, report, sub_progress

#: the privacy-transform size used for the hull (its planes are voxelised on the input grid exactly)
HULL_MODEL_SIZE = 128


def place_prior_for(volume: Volume, mask: Volume, seed: int = 0, config=None,
                    progress: Optional[ProgressCallback] = None) -> Tuple[Volume, Any]:
    """T(x) of ``volume`` (float32, its units, its grid) and the privacy transform it came from."""
    from ..transforms.anatomical_prior import prior_from_transform
    from ..transforms.privacy import PrivacyTransformConfig, privacy_transform

    transform = privacy_transform(volume, mask, PrivacyTransformConfig(size=HULL_MODEL_SIZE), seed=seed,
                                  progress=sub_progress(progress, 0.0, 0.3))
    return (prior_from_transform(volume, transform, config=config, progress=sub_progress(progress, 0.3, 1.0), seed=seed),
            transform)


def reface_with_details(volume: Volume, brain_mask: Optional[Volume] = None, seed: int = 0,
                        progress: Optional[ProgressCallback] = None, config=None,
                        device: str = "auto") -> Tuple[Volume, Dict[str, Any]]:
    """:func:`reface` plus details: the brain mask and convex hull used, stage timings (s)."""
    import time

    from ..transforms.brain_mask import resolve_brain_mask
    from ..transforms.brain_preservation import check_brain_preserved, compose_preserving

    require_usable_image(volume)
    timings: Dict[str, float] = {}
    start = time.perf_counter()
    report(progress, 0.0, "brain mask")
    mask = resolve_brain_mask(volume, brain_mask, progress=sub_progress(progress, 0.0, 0.4), device=device)
    timings["brain_mask"] = time.perf_counter() - start
    start = time.perf_counter()
    report(progress, 0.4, "placing the template head")
    prior, transform = place_prior_for(volume, mask, seed=seed, config=config,
                                       progress=sub_progress(progress, 0.4, 0.95))
    timings["anatomical_prior"] = time.perf_counter() - start
    output = compose_preserving(volume, prior, transform.brain_mask)
    check_brain_preserved(volume, output, transform.brain_mask)
    report(progress, 1.0, "refaced; brain voxels verified")
    return output, {"brain_mask": transform.brain_mask, "convex_hull": transform.convex_hull, "timings_s": timings}


def reface(volume: Volume, brain_mask: Optional[Volume] = None, seed: int = 0,
           progress: Optional[ProgressCallback] = None, config=None, device: str = "auto") -> Volume:
    """De-identify a whole-head T1 by replacing all but the brain with the placed template head.

    ``brain_mask``: nonzero = brain on ``volume``'s grid, or None to compute one (on ``device``).
    ``config``: :class:`~AnonMRILib.transforms.anatomical_prior.AnatomicalPriorConfig` or None.
    Returns a Volume on ``volume``'s grid and dtype; brain voxels bit-exact (checked).
    """
    return reface_with_details(volume, brain_mask, seed, progress, config, device)[0]
