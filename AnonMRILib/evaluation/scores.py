"""Per-scan privacy and utility scores of an anonymized scan against its original.

:func:`scan_scores` works on any pair of a scan and its anonymized version on the same grid
(any method: CP-GAN, removal baselines, other tools) and returns a JSON-able dict that leads with

* ``verdict``: one sentence a reader can act on, decided by the open face recognizer alone
  (``open_recognizer`` below, with the privacy evaluation's rule: top-1 in a gallery), and naming
  it: "recognisable: the open face recognizer (dlib) puts the anonymized face 0.35 from the
  original's, nearer than any of 14 reference heads ...", "not recognisable: the open face
  recognizer (dlib) puts 3 of 14 reference heads nearer ...", "not anonymized: the face region
  was left unchanged", or "not assessed: ..." with the reason (the recognizer not installed, with
  its install command; no face in the original); a warning is appended when the brain mask is
  implausible;
* ``residual``: what the Siamese attacker (``attacker``) finds, reported as what it is: the head's
  outline, which a method that keeps the convex hull keeps by design, with its measured strength
  on this scan and the same rank for a template face placed on the same scan's hull
  (``hull_control``); it never decides the verdict;
* ``explanations``: why signals that disagree (the PSNR criterion, a Siamese match beyond the
  hull control) are resolved the way they are;

then the evidence:

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
* ``open_recognizer``: dlib's face recognizer (:mod:`AnonMRILib.evaluation.face_recognition`,
  trained on photographs, nothing trained here) on several views of the original and of the
  anonymized scan (:func:`AnonMRILib.evaluation.privacy_attacks.describe_head`), against the
  reference set's recognizer descriptors (other generated subjects and the real heads the
  population is built from); a reference head closer to the original than the same-person
  threshold calibrated on renderings is the same person and left out. ``identified`` = the
  anonymized face is nearer to the original than to every reference head (decided by rank, not
  by dlib's 0.6 for photographs) *and* nearer than the template's own face is by more than a
  re-rendering moves the original (the kinship control, :func:`recognizer_identifies`;
  ``template_kinship`` says when it cleared a top-1);
* ``brain.mask_check``: :func:`AnonMRILib.transforms.plausibility.check_brain_mask` of the mask
  used (a whole head given as the brain is implausible), as a record, not an error;
* ``attacker``: with the shipped re-identification attacker (the Siamese network of
  :mod:`AnonMRILib.models.reidentification`), the rank of the true original among the original
  plus the reference heads, ordered by distance to the anonymized rendering (0 = the attacker
  picks the true original: identified; ``relative_rank`` 1 = it is the least likely).
* ``hull_control``: the same rank for REFACE of the original (:mod:`AnonMRILib.pipelines.reface`:
  a template face placed from the original's convex hull and brain alone, no face voxels), the
  control that tells an outline match from a face match (``ScoreConfig.hull_control``).

Renderings are made on the canonical frame of :mod:`AnonMRILib.evaluation.face_renderings`
(centred on the original's head, the reference set's field of view), so any scan can be
compared with the reference heads. Caveat printed in the result: the reference heads are
generated from a few real heads (one of them the embedded sample's subject), not a population
of real people, so the anonymity and rank scores are indicative, not a guarantee.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DependencyError, InputError, WeightsError
from ..io.volume import Volume, require_same_grid, require_usable_image
from ..progress import ProgressCallback, report, sub_progress

#: the shipped reference set of other heads' face renderings
DEFAULT_REFERENCE_FACES = Path(__file__).resolve().parents[1] / "data" / "reference_faces.npz"

ReferenceLike = Union[None, bool, str, Path, np.ndarray]


@dataclass(frozen=True)
class ScoreConfig:
    """Face-region definition (mm, fraction of the brain's S-extent); see the module doc.
    ``hull_control``: also rank the original for a template face on the same hull (:func:`residual`)."""

    brain_margin_mm: float = 3.0
    superior_fraction: float = 0.25
    inferior_margin_mm: float = 50.0
    rendering_device: str = "cpu"
    hull_control: bool = True
    #: also describe the template's own face and a re-rendering of the original (the open
    #: recognizer's kinship control, :func:`recognizer_identifies`), ~15 s
    template_control: bool = True


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
        result = {"renderings": images, "field_of_view_mm": float(data["field_of_view_mm"]),
                  "grid_size": int(data["grid_size"]), "source": path.name}
        if "recognizer_descriptors" in data.files:
            result["recognizer"] = {
                "descriptors": data["recognizer_descriptors"].astype(np.float64),
                "ids": [str(i) for i in data["recognizer_ids"]],
                "views": [tuple(float(a) for a in v) for v in data["recognizer_views"]],
                "render_size": int(data["recognizer_render_size"]),
                "same_person_threshold": float(data["recognizer_threshold"])}
        return result


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
    from ..models.reidentification import SiameseNetwork

    network = SiameseNetwork.load(weights or None, device="cpu")
    query = network.embed(anonymized_image[None])[0]
    candidates = network.embed(np.concatenate([original_image[None], references]))
    distances = np.linalg.norm(candidates - query, axis=1)
    rank = int(np.sum(distances[1:] < distances[0]))
    return {"rank": rank, "n_candidates": int(len(candidates)), "relative_rank": rank / (len(candidates) - 1),
            "identified": rank == 0, "distance_to_original": float(distances[0]),
            "nearest_reference_distance": float(distances[1:].min())}


def _hull_control_image(original: Volume, brain: Volume, centre: np.ndarray, render_config) -> np.ndarray:
    """Rendering of the hull control: REFACE of ``original`` (a template face placed from its convex
    hull and brain alone, :mod:`AnonMRILib.pipelines.reface`), in the canonical frame."""
    from ..pipelines.reface import reface
    from .face_renderings import render_canonical_face

    return render_canonical_face(reface(original, brain, seed=0, device=render_config.device), centre, render_config)


#: the original's views turned by (azimuth, elevation) degrees: how far re-rendering the same head
#: moves the recognizer's descriptor, the noise of the kinship control
RERENDERING_TURN_DEG = (3.0, 2.0)


def recognizer_identifies(distance: float, to_references: Sequence[float], template_distance: Optional[float] = None,
                          rerendering_distance: float = 0.0) -> Tuple[bool, bool]:
    """(identified, kinship): the open recognizer's single-subject rule with its kinship control.

    Top-1 rule of the privacy evaluation: the original is nearer to the anonymized face than every
    reference head (ties count against it). Kinship control: every REFACE or prior-based output
    wears the template's face, so when the template's face alone is already about as near to this
    original (``template_distance``), being top-1 says nothing about the method: measured on the
    embedded sample, the template alone is 0.52 from its subject and REFACE of three other people
    0.51-0.55, each nearer than any reference head (``Training/evaluate_template_kinship.py``).
    The anonymized face then counts as identified only when it is nearer than the template's face
    by more than re-rendering the original moves its descriptor (``rerendering_distance``).
    ``kinship`` is True when top-1 held but the control cleared it."""
    top1 = len(to_references) > 0 and bool(np.all(np.asarray(to_references, np.float64) > distance))
    if not top1 or template_distance is None:
        return top1, False
    beyond_template = distance < template_distance - rerendering_distance
    return beyond_template, not beyond_template


def recognizer_rendering(references: Dict[str, Any], device: str = "cpu"):
    """The :class:`~AnonMRILib.evaluation.face_renderings.FaceRenderingConfig` of the reference set's
    recognizer renderings (its field of view, grid and image size)."""
    from .face_renderings import FaceRenderingConfig

    return FaceRenderingConfig(field_of_view_mm=references["field_of_view_mm"], grid_size=references["grid_size"],
                               image_size=references["recognizer"]["render_size"], device=device)


def describe_views(volume: Volume, centre: np.ndarray, render_config, views, recognizer
                   ) -> Tuple[Optional[np.ndarray], float]:
    """(descriptor or None, detector score) of ``volume`` rendered in the canonical frame at
    ``centre`` (RAS mm) from each (azimuth, elevation) of ``views``
    (:func:`~AnonMRILib.evaluation.privacy_attacks.describe_head`)."""
    from .face_renderings import render_canonical_views
    from .privacy_attacks import describe_head

    return describe_head(list(render_canonical_views(volume, centre, render_config, views)), recognizer)


def other_references(gallery: Dict[str, Any], original_descriptor: np.ndarray) -> Tuple[List[np.ndarray], int]:
    """(the reference descriptors of other people, how many were left out): a reference head the
    recognizer cannot tell from the original (within the calibrated same-person threshold; none
    without a calibration) is the same person."""
    from .face_recognition import face_distance

    threshold = gallery["same_person_threshold"]
    threshold = float(threshold) if np.isfinite(threshold) else 0.0
    found = [d for d in gallery["descriptors"] if np.all(np.isfinite(d))]
    others = [d for d in found if face_distance(d, original_descriptor) > threshold]
    return others, len(found) - len(others)


def _template_kinship(original: Volume, centre: np.ndarray, original_descriptor: np.ndarray, render_config,
                      views, recognizer) -> Dict[str, Optional[float]]:
    """Distances to the original's descriptor of the template's own face (its own frame) and of the
    original re-rendered with its views turned by :data:`RERENDERING_TURN_DEG`."""
    from ..transforms.anatomical_prior import template_face
    from .face_recognition import face_distance
    from .face_renderings import head_centre

    template = template_face()
    template_descriptor, _ = describe_views(template, head_centre(template), render_config, views, recognizer)
    turned = [(float(a) + RERENDERING_TURN_DEG[0], float(e) + RERENDERING_TURN_DEG[1]) for a, e in views]
    turned_descriptor, _ = describe_views(original, centre, render_config, turned, recognizer)
    return {"template_distance_to_original": (None if template_descriptor is None
                                              else face_distance(template_descriptor, original_descriptor)),
            "rerendering_distance": (None if turned_descriptor is None
                                     else face_distance(turned_descriptor, original_descriptor))}


def _open_recognizer(original: Volume, anonymized: Volume, centre: np.ndarray, references: Dict[str, Any],
                     config: "ScoreConfig") -> Dict[str, Any]:
    """The open face recognizer's evidence (see the module doc): descriptors of the original and
    the anonymized scan (several views) against the reference heads' descriptors."""
    from .face_recognition import FaceRecognizer, face_distance

    gallery = references["recognizer"]
    render_config = recognizer_rendering(references, config.rendering_device)
    recognizer = FaceRecognizer()
    original_descriptor, _ = describe_views(original, centre, render_config, gallery["views"], recognizer)
    anonymized_descriptor, anonymized_score = describe_views(anonymized, centre, render_config, gallery["views"],
                                                             recognizer)
    threshold = gallery["same_person_threshold"]
    result: Dict[str, Any] = {"face_found_in_original": original_descriptor is not None,
                              "face_found_in_anonymized": anonymized_descriptor is not None,
                              "detector_score_anonymized": (float(anonymized_score) if anonymized_descriptor is not None
                                                            else None),
                              "same_person_threshold": float(threshold) if np.isfinite(threshold) else 0.0,
                              "identified": False}
    if original_descriptor is None or anonymized_descriptor is None:
        return result
    others, left_out = other_references(gallery, original_descriptor)
    distance = face_distance(anonymized_descriptor, original_descriptor)
    to_references = np.array([face_distance(anonymized_descriptor, d) for d in others])
    rank = int(np.sum(to_references <= distance)) if len(others) else 0
    kinship: Dict[str, Optional[float]] = {"template_distance_to_original": None, "rerendering_distance": None}
    if config.template_control and rank == 0 and len(others):
        kinship = _template_kinship(original, centre, original_descriptor, render_config, gallery["views"], recognizer)
    identified, cleared = recognizer_identifies(distance, to_references, kinship["template_distance_to_original"],
                                                kinship["rerendering_distance"] or 0.0)
    result.update({"distance_to_original": distance, "n_references": len(others),
                   "references_left_out_as_same_person": left_out,
                   "nearest_reference_distance": float(to_references.min()) if len(others) else None,
                   "rank": rank, "identified": identified, "template_kinship": cleared, **kinship})
    return result


def check_given_brain_mask(original: Volume, brain: Volume) -> Dict[str, Any]:
    """:func:`AnonMRILib.transforms.plausibility.check_brain_mask` as a record instead of an error."""
    from ..transforms.plausibility import check_brain_mask

    try:
        summary = check_brain_mask(original, brain)
    except InputError as error:
        return {"plausible": False, "reason": str(error).split("; skip this check")[0]}
    return {"plausible": True, "volume_ml": summary.volume_ml, "fraction_of_head": summary.fraction_of_reference}


#: the attacker that decides the verdict, as the verdict names it
DECIDING_ATTACKER = "the open face recognizer (dlib)"


def verdict(result: Dict[str, Any]) -> Tuple[str, List[str]]:
    """One sentence on whether the anonymized face is recognisable, and explanations.

    Decided by the open face recognizer alone, with the privacy evaluation's rule (top-1 in a
    gallery: recognisable when the original is nearer to the anonymized face than every reference
    head, ties counting against it). The Siamese attacker reads the head's outline, which a
    convex hull keeps by design: it is reported by :func:`residual`, never decides. Without the
    recognizer (not installed, no face in the original, no reference set) the verdict is "not
    assessed" and says why; the PSNR criterion is evidence, explained when it disagrees.
    """
    face = result.get("face_region", {})
    recognizer = result.get("open_recognizer")
    anonymity = result.get("anonymity")
    explanations: List[str] = []
    who = DECIDING_ATTACKER
    identified = bool(recognizer and recognizer.get("identified"))
    match = (f"{who} puts the anonymized face {recognizer['distance_to_original']:.2f} from the original's, nearer "
             f"than any of {recognizer['n_references']} reference heads (nearest "
             f"{recognizer['nearest_reference_distance']:.2f})" if identified else "")
    unchanged = face.get("voxels", 0) > 0 and face.get("changed_fraction", 1.0) == 0.0
    if unchanged:
        text = "not anonymized: the face region was left unchanged" + (f"; {match}" if identified else "")
    elif recognizer is None:
        text = f"not assessed: no reference set of other heads, so {who}, which decides, could not run"
    elif "skipped" in recognizer:
        text = f"not assessed: {who}, which decides, could not run ({recognizer['skipped']})"
    elif identified:
        text = f"recognisable: {match}"
    elif not recognizer.get("face_found_in_original"):
        text = f"not assessed: {who} finds no face in the original, so it cannot compare the anonymized face with it"
    elif not recognizer.get("face_found_in_anonymized"):
        text = f"not recognisable: {who} finds no face in the anonymized scan"
    elif not recognizer.get("n_references"):
        text = f"not assessed: {who} finds every reference head to be the original's person"
    elif recognizer.get("template_kinship"):
        text = (f"not recognisable: {who} puts the anonymized face {recognizer['distance_to_original']:.2f} from the "
                f"original's, nearer than any of {recognizer['n_references']} reference heads, but no nearer than "
                f"the template's own face ({recognizer['template_distance_to_original']:.2f}) by more than "
                f"re-rendering the original moves it ({recognizer['rerendering_distance']:.2f}): the template "
                "resembles this person, as it would in anyone's output")
    else:
        text = (f"not recognisable: {who} puts {recognizer['rank']} of {recognizer['n_references']} reference heads "
                f"nearer to the anonymized face than the original ({recognizer['distance_to_original']:.2f})")
    assessed = text.startswith(("recognisable", "not recognisable"))
    if assessed and anonymity is not None and anonymity.get("anonymized") == identified:
        if identified:
            explanations.append("the PSNR criterion counts it anonymized (pixel similarity to the original is no "
                                "higher than to another head), yet the recognizer finds the original: identity "
                                "survives in the face's shape, which PSNR does not measure; the recognizer decides")
        else:
            explanations.append("the PSNR criterion does not count it anonymized (the rendering is still more similar "
                                "to the original's pixels than to another head's), but the recognizer does not find "
                                "the original among the reference heads; the recognizer decides")
    threshold = (recognizer or {}).get("same_person_threshold") or 0.0
    distance = (recognizer or {}).get("distance_to_original")
    if assessed and distance is not None and threshold > 0 and (distance <= threshold) != identified:
        where = "within" if distance <= threshold else "beyond"
        explanations.append(f"the anonymized face is {where} the same-person distance calibrated on renderings "
                            f"({threshold:.2f}) of the original's ({distance:.2f}), yet "
                            + ("reference heads are nearer" if not identified else "nearer than every reference head")
                            + "; the rank decides, as in the privacy evaluation (dlib's 0.6 is for photographs)")
    siamese, control = result.get("attacker"), result.get("hull_control")
    if assessed and siamese and siamese.get("identified") and control and not control.get("identified"):
        explanations.append("the Siamese attacker matches this scan to its original more than it matches a template "
                            "face placed on the same hull (see residual): it may read more than the outline here; "
                            "look at the before/after renderings")
    mask = result.get("brain", {}).get("mask_check")
    if mask is not None and not mask.get("plausible", True):
        text += f"; WARNING: the brain mask is implausible ({mask['reason']}), so the brain and face-region figures rest on a wrong mask"
    return text, explanations


def residual(result: Dict[str, Any]) -> Optional[str]:
    """What the Siamese attacker finds, reported as the outline residual (None when it did not run).

    The Siamese attacker reads the head's outline at low resolution; a method that keeps the
    convex hull keeps it by design. Its strength on this scan is the rank of the original for
    the anonymized scan and, as a control, for a template face placed on the same scan's hull
    (``hull_control``: REFACE, no face voxels used): when both rank it first, the attacker cannot
    tell the remodeled head from the hull, so it does not make the verdict.
    """
    siamese = result.get("attacker")
    if not siamese:
        return None
    control = result.get("hull_control")
    text = (f"outline residual (the Siamese attacker reads the head's outline, which the convex hull keeps by "
            f"design): it ranks the original {siamese['rank'] + 1} of {siamese['n_candidates']} heads "
            f"(distance {siamese['distance_to_original']:.2f}, "
            f"nearest other {siamese['nearest_reference_distance']:.2f})")
    if control:
        text += (f"; for a template face placed on the same scan's hull (REFACE) it ranks it {control['rank'] + 1} "
                 f"of {control['n_candidates']} (distance {control['distance_to_original']:.2f})")
        if siamese.get("identified") and control.get("identified"):
            text += ", so it cannot tell this head from the same scan's hull"
    return text


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
                       "max_abs_change": float(np.max(np.abs(brain_after - brain_before))),
                       "mask_check": check_given_brain_mask(original, brain)}

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
        result["open_recognizer"] = {"skipped": "no face renderings scored" if reference_renderings is False
                                     else "no reference set of other heads"}
        report(progress, 1.0, "scores done")
        return _lead_with_verdict(result)
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
    report(progress, 0.75, "anonymity criterion")
    result["anonymity"] = _anonymity(anonymized_image, original_image, images)
    result["anonymity"]["reference_set"] = references["source"]
    result["notes"].append("reference heads are generated from a few real heads, not a population of real "
                           "people: anonymity and rank are indicative")
    from ..models.reidentification import default_weights_file

    missing = None
    if not attacker_weights:
        try:
            default_weights_file()
        except WeightsError as error:
            missing = str(error)
    if missing is not None:
        result["notes"].append(f"no attacker weights: attacker rank skipped ({missing})")
    else:
        report(progress, 0.8, "re-identification attacker")
        result["attacker"] = _attacker_rank(anonymized_image, original_image, images, attacker_weights)
        if config.hull_control:
            report(progress, 0.82, "hull control: a template face on the same hull")
            try:
                control = _hull_control_image(original, brain, centre, render_config)
            except InputError as error:
                result["notes"].append(f"hull control skipped: {error}")
            else:
                result["hull_control"] = dict(_attacker_rank(control, original_image, images, attacker_weights),
                                              method="REFACE of the original: a template face placed from its "
                                                     "convex hull and brain alone")
    if "recognizer" in references:
        report(progress, 0.9, "open face recognizer")
        try:
            result["open_recognizer"] = _open_recognizer(original, anonymized, centre, references, config)
        except DependencyError as error:
            result["open_recognizer"] = {"skipped": str(error)}
    else:
        result["open_recognizer"] = {"skipped": "the reference set has no open-recognizer descriptors"}
    report(progress, 1.0, "scores done")
    return _lead_with_verdict(result)


def _lead_with_verdict(result: Dict[str, Any]) -> Dict[str, Any]:
    """``result`` with ``verdict``, ``residual`` and ``explanations`` first, the evidence after."""
    text, explanations = verdict(result)
    outline = residual(result)
    lead: Dict[str, Any] = {"verdict": text} if outline is None else {"verdict": text, "residual": outline}
    return {**lead, "explanations": explanations, **result}
