"""Per-scan privacy and utility scores of an anonymized scan against its original.

:func:`scan_scores` works on any pair of a scan and its anonymized version on the same grid
(any method: CP-GAN, removal baselines, other tools) and returns a JSON-able dict:

* ``brain``: brain voxels preserved — the fraction of brain-mask voxels whose value is exactly
  the original's (1.0 = every brain voxel kept bit for bit), and the largest change there.
  The brain mask is the user's when given, else :func:`AnonMRILib.transforms.brain_mask.brain_mask`
  of the ORIGINAL.
* ``face_region``: how much the face changed — PSNR (dB) and SSIM of the anonymized scan against
  the original over the **face region**, and the fraction of its voxels that changed. The face
  region is defined on the original as: inside the head (:mod:`AnonMRILib.transforms.head_mask`),
  more than ``brain_margin_mm`` from the brain, anterior of the coronal plane through the
  brain's centroid, below the plane ``superior_fraction`` of the brain's S-extent above the
  centroid and above the plane ``inferior_margin_mm`` below the brain's lowest point (eyes,
  nose, mouth, cheeks, chin, lower forehead; not the lower neck). PSNR and SSIM use the data range
  ``p99.9 - min`` of the original; SSIM is scikit-image's 3-D SSIM (7-voxel window) on the
  region's bounding box, averaged over region voxels. Lower = more changed.
* ``anonymity``: the PSNR-difference criterion of the lesion-preserving paper (sec. 4.5,
  :mod:`AnonMRILib.evaluation.anonymity`) on FACE RENDERINGS: ``PSNR(r(x^), r(x)) -
  PSNR(r(x^), r(x_j))`` with ``x^`` the anonymized scan, ``x`` its original and ``x_j`` the
  other heads of a reference set (``AnonMRILib/data/reference_faces.npz``: renderings of
  held-out subjects of the generated population). Following the similarity index of Yoon et
  al. that the criterion is built on (a minimum distance over the other samples), the decision
  uses the NEAREST reference head (highest PSNR to the anonymized rendering); the median over
  references is reported too. ``anonymized`` = score at or below the criterion's threshold.
* ``attacker``: with the shipped re-identification attacker (the Siamese network of
  :mod:`AnonMRILib.models.reidentification`), the rank of the true original among the original
  plus the reference heads, ordered by distance to the anonymized rendering (0 = the attacker
  picks the true original: identified; ``relative_rank`` 1 = it is the least likely).

Renderings are made on the canonical frame of :mod:`AnonMRILib.evaluation.face_renderings`
(centred on the original's head, the reference set's field of view), so any scan can be
compared with the reference heads. Caveat printed in the result: the reference heads are
generated from a few real heads (one of them the embedded sample's subject), not a population
of real people, so the anonymity and rank scores are indicative, not a guarantee.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Union

import numpy as np

from ..errors import InputError
from ..io.volume import Volume, require_same_grid, require_usable_image
from ..progress import ProgressCallback, report, sub_progress

#: the shipped reference set of other heads' face renderings
DEFAULT_REFERENCE_FACES = Path(__file__).resolve().parents[1] / "data" / "reference_faces.npz"

ReferenceLike = Union[None, bool, str, Path, np.ndarray]


@dataclass(frozen=True)
class ScoreConfig:
    """Face-region definition (mm, fraction of the brain's S-extent); see the module doc."""

    brain_margin_mm: float = 3.0
    superior_fraction: float = 0.25
    inferior_margin_mm: float = 50.0
    rendering_device: str = "cpu"


def face_region(original: Volume, brain: Volume, config: Optional[ScoreConfig] = None) -> np.ndarray:
    """Boolean face-region mask on the original's grid (see the module doc)."""
    from scipy import ndimage

    from ..transforms.head_mask import head_mask_array

    config = config or ScoreConfig()
    require_same_grid(original, brain, what="brain mask")
    inside_brain = np.asarray(brain.array) != 0
    if not inside_brain.any():
        raise InputError("the brain mask is empty")
    head = head_mask_array(original.array)
    distance = ndimage.distance_transform_edt(~inside_brain, sampling=original.spacing)
    outside_brain = distance > config.brain_margin_mm
    brain_indices = np.argwhere(inside_brain)
    brain_world = original.world_coordinates(brain_indices)
    centroid = brain_world.mean(axis=0)
    superior_limit = centroid[2] + config.superior_fraction * float(np.ptp(brain_world[:, 2]))
    inferior_limit = float(brain_world[:, 2].min()) - config.inferior_margin_mm
    anterior = original.world_axis(1) > centroid[1]
    superior = original.world_axis(2)
    band = (superior < superior_limit) & (superior > inferior_limit)
    return head & outside_brain & anterior & band


def _region_ssim(before: np.ndarray, after: np.ndarray, region: np.ndarray, data_range: float) -> float:
    from skimage.metrics import structural_similarity

    indices = np.argwhere(region)
    low = np.maximum(indices.min(axis=0) - 3, 0)
    high = np.minimum(indices.max(axis=0) + 4, region.shape)
    box = tuple(slice(a, b) for a, b in zip(low, high))
    a, b = before[box].astype(np.float64), after[box].astype(np.float64)
    window = min(7, *[n if n % 2 else n - 1 for n in a.shape])
    if window < 3:
        return float("nan")
    _, ssim_map = structural_similarity(a, b, data_range=data_range, win_size=window, full=True)
    return float(ssim_map[region[box]].mean())


def load_reference_faces(reference: ReferenceLike = None) -> Optional[Dict[str, Any]]:
    """The reference set: ``{"renderings": (K, H, W) float32 in [0, 1], "field_of_view_mm",
    "grid_size"}``; None when ``reference`` is False or the default file is absent."""
    if reference is False:
        return None
    if isinstance(reference, np.ndarray):
        images = np.asarray(reference, dtype=np.float32)
        if images.ndim != 3 or len(images) < 1:
            raise InputError("reference renderings must be a (K, H, W) array with K >= 1")
        if images.max() > 1.0:
            images = images / 255.0
        return {"renderings": images, "field_of_view_mm": 256.0, "grid_size": 128, "source": "array"}
    path = DEFAULT_REFERENCE_FACES if reference in (None, True) else Path(reference)
    if not path.is_file():
        if reference in (None, True):
            return None
        raise InputError(f"reference renderings not found: {path}")
    with np.load(path, allow_pickle=False) as data:
        images = data["renderings"].astype(np.float32)
        if data["renderings"].dtype == np.uint8:
            images /= 255.0
        return {"renderings": images, "field_of_view_mm": float(data["field_of_view_mm"]),
                "grid_size": int(data["grid_size"]), "source": path.name}


def _anonymity(anonymized_image: np.ndarray, original_image: np.ndarray, references: np.ndarray) -> Dict[str, Any]:
    from . import anonymity

    scores = np.array([float(anonymity.anonymity_score(anonymized_image, original_image, other))
                       for other in references])
    nearest = int(np.argmin(scores))  # nearest reference = highest PSNR to x^ = smallest difference
    threshold = float(anonymity.DEFAULT_THRESHOLD_DB)
    return {"score_db": float(scores[nearest]), "median_score_db": float(np.median(scores)),
            "threshold_db": threshold, "anonymized": bool(anonymity.is_anonymized(scores[nearest])),
            "nearest_reference": nearest, "n_references": int(len(references))}


def _attacker_rank(anonymized_image: np.ndarray, original_image: np.ndarray, references: np.ndarray,
                   weights) -> Dict[str, Any]:
    from ..models.reidentification import DEFAULT_WEIGHTS, SiameseNetwork

    network = SiameseNetwork.load(weights or DEFAULT_WEIGHTS, device="cpu")
    query = network.embed(anonymized_image[None])[0]
    candidates = network.embed(np.concatenate([original_image[None], references]))
    distances = np.linalg.norm(candidates - query, axis=1)
    rank = int(np.sum(distances[1:] < distances[0]))
    return {"rank": rank, "n_candidates": int(len(candidates)), "relative_rank": rank / (len(candidates) - 1),
            "identified": rank == 0, "distance_to_original": float(distances[0]),
            "nearest_reference_distance": float(distances[1:].min())}


def scan_scores(original: Volume, anonymized: Volume, brain_mask: Optional[Volume] = None,
                reference_renderings: ReferenceLike = None, attacker_weights=None,
                config: Optional[ScoreConfig] = None, progress: Optional[ProgressCallback] = None
                ) -> Dict[str, Any]:
    """Scores of ``anonymized`` against ``original`` (same grid); see the module doc.

    ``reference_renderings``: None = the shipped set (skipped with a note if absent), False = no
    rendering-based scores, a path to an .npz like the shipped one, or a (K, H, W) array in [0, 1]
    rendered like :mod:`AnonMRILib.evaluation.face_renderings`. ``attacker_weights``: None = the
    shipped attacker (skipped with a note if absent), or a safetensors path.
    """
    from ..evaluation.image_metrics import psnr
    from ..transforms.brain_mask import brain_mask as compute_brain_mask
    from ..transforms.brain_mask import user_brain_mask

    config = config or ScoreConfig()
    require_usable_image(original, what="original scan")
    if original.shape != anonymized.shape or not original.same_grid(anonymized):
        raise InputError(f"the anonymized scan (shape {anonymized.shape}) does not lie on the original's grid "
                         f"(shape {original.shape}); scores compare voxel by voxel, so both must share one grid")
    report(progress, 0.0, "brain mask")
    if brain_mask is not None:
        brain = user_brain_mask(brain_mask, original)
        mask_source = "given"
    else:
        brain = compute_brain_mask(original, progress=sub_progress(progress, 0.0, 0.4))
        mask_source = "computed from the original"
    inside = np.asarray(brain.array) != 0
    before = np.asarray(original.array)
    after = np.asarray(anonymized.array)
    result: Dict[str, Any] = {"notes": []}
    brain_before = before[inside].astype(np.float64)
    brain_after = after[inside].astype(np.float64)
    result["brain"] = {"voxels": int(inside.sum()), "mask": mask_source,
                       "preserved_fraction": float(np.mean(brain_before == brain_after)),
                       "max_abs_change": float(np.max(np.abs(brain_after - brain_before)))}

    report(progress, 0.45, "face region")
    region = face_region(original, brain, config)
    data_range = float(np.percentile(before, 99.9) - before.min()) or 1.0
    face = {"voxels": int(region.sum()), "data_range": data_range,
            "definition": "head, > %g mm from the brain, anterior of the brain centroid, below centroid + %g x "
                          "brain S-extent, above %g mm below the brain" % (
                              config.brain_margin_mm, config.superior_fraction, config.inferior_margin_mm)}
    if region.any():
        a, b = before[region].astype(np.float64), after[region].astype(np.float64)
        face["psnr_db"] = float(psnr(a[None], b[None], data_range=data_range))
        face["ssim"] = _region_ssim(before, after, region, data_range)
        face["changed_fraction"] = float(np.mean(a != b))
    result["face_region"] = face

    references = load_reference_faces(reference_renderings)
    if references is None:
        if reference_renderings is not False:
            result["notes"].append("no reference set of other heads' renderings: anonymity and attacker scores skipped")
        report(progress, 1.0, "scores done")
        return result
    from .face_renderings import FaceRenderingConfig, head_centre, render_canonical_face

    report(progress, 0.6, "face renderings")
    size = int(references["renderings"].shape[-1])
    render_config = FaceRenderingConfig(field_of_view_mm=references["field_of_view_mm"],
                                        grid_size=references["grid_size"], image_size=size,
                                        device=config.rendering_device)
    centre = head_centre(original)
    original_image = render_canonical_face(original, centre, render_config)
    anonymized_image = render_canonical_face(anonymized, centre, render_config)
    images = references["renderings"]
    if images.shape[1:] != original_image.shape:
        raise InputError(f"reference renderings are {images.shape[1:]} but the scan renders as {original_image.shape}")
    report(progress, 0.8, "anonymity criterion")
    result["anonymity"] = _anonymity(anonymized_image, original_image, images)
    result["anonymity"]["reference_set"] = references["source"]
    result["notes"].append("reference heads are generated from a few real heads, not a population of real "
                           "people: anonymity and rank are indicative")
    from ..models.reidentification import DEFAULT_WEIGHTS

    weights = attacker_weights or DEFAULT_WEIGHTS
    if attacker_weights is None and not Path(weights).is_file():
        result["notes"].append("no attacker weights: attacker rank skipped")
    else:
        report(progress, 0.9, "re-identification attacker")
        result["attacker"] = _attacker_rank(anonymized_image, original_image, images, weights)
    report(progress, 1.0, "scores done")
    return result
