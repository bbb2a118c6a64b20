"""One task per image: de-identify one BIDS scan, or carry one other image, writing all its outputs together.

For a T1w: brain mask (the user's derivative or computed), plausibility checks, the method
(``remodel`` = CP-GAN, or a removal baseline such as ``reface``), then in one
:class:`~AnonMRILib.io.writers.OutputTransaction`: the image under its own name and its JSON sidecar
with ``DeidentificationMethod`` and ``DeidentificationMethodCodeSequence`` in the raw dataset, and
in the derivative ``derivatives/anonmri/``: ``<entities>_mod-<suffix>_defacemask.nii.gz`` (the
convex region that holds every voxel the de-identification changed: a mask of the changed voxels
themselves would carry the shape of the original face), the brain mask used
(``<entities>_desc-brain_mask.nii.gz``), a rendering of the de-identified face
(``figures/<stem>_deidentified.png``; the original face is never rendered into an output) and the
scan's record (``figures/<stem>_scan.json``), written last: a scan is finished exactly when its
record exists. Another contrast of the session receives the T1w's face through
:func:`~AnonMRILib.pipelines.multicontrast.carry_face` from the T1w's finished outputs.

Every other image (func, dwi, fmap, perf, pet, untreated anatomical suffixes) is carried by
:func:`carry_image`: header text emptied, extensions dropped, voxel bytes unchanged; it is finished
when its output exists (written by one rename).

A failure never escapes: both return a record with ``status`` ``done``, ``skipped`` (finished by an
earlier run), ``failed`` (with the one-line error) or ``blocked`` (its T1w failed). Unexpected
errors are retried ``retries`` times; errors of the input (AnonMRIError) are not.
"""
import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np

from ..errors import AnonMRIError, InputError
from .bids_layout import Scan, parse_name, subject_of

#: the derivative dataset (relative to the output dataset) that holds masks, figures and records
DERIVATIVE = "derivatives/anonmri"
#: an image carried untreated warns that its face may be recognisable when every voxel side is at most this (mm)
FACE_VISIBLE_MM = 2.5

_CACHE_LOCK = threading.Lock()
#: per-process cache of loaded networks (one per Dask worker process): (name, device) -> model
_WORKER_MODELS: Dict[tuple, Any] = {}


@dataclass(frozen=True)
class ScanSettings:
    """What every scan task of a run does (picklable: sent to every Dask worker)."""

    bids_dir: str
    out_dir: str
    method: str = "remodel"
    #: BIDS derivative folder with ``<entities>_desc-brain_mask.nii.gz`` per T1w (None: computed)
    brain_masks: Optional[str] = None
    weights: Optional[str] = None
    device: str = "cpu"
    seed: int = 0
    plausibility_checks: bool = True
    figures: bool = True
    retries: int = 1


def worker_brain_network(device: str):
    """The HD-BET network of this worker process, loaded once and reused by every scan it runs."""
    from ..device import resolve_device
    from ..transforms.brain_extraction.hdbet import load_network

    key = ("hdbet", device)
    with _CACHE_LOCK:
        if key not in _WORKER_MODELS:
            _WORKER_MODELS[key] = load_network(resolve_device(device))
        return _WORKER_MODELS[key]


def brain_mask_name(scan: Scan) -> str:
    """The BIDS derivative name of a T1w's brain mask (relative to a derivative dataset)."""
    return (Path(scan.folder) / f"{scan.entities}_desc-brain_mask.nii.gz").as_posix()


def output_names(scan: Scan) -> Dict[str, str]:
    """Relative output paths of ``scan`` in the output dataset (derivative files under :data:`DERIVATIVE`)."""
    folder = Path(DERIVATIVE) / scan.folder
    figures = Path(DERIVATIVE) / f"sub-{scan.subject}" / "figures"
    names = {
        "image": scan.relative_path,
        "sidecar": (Path(scan.folder) / f"{scan.stem}.json").as_posix(),
        "defacemask": (folder / f"{scan.entities}_mod-{scan.suffix}_defacemask.nii.gz").as_posix(),
        "figure": (figures / f"{scan.stem}_deidentified.png").as_posix(),
        "record": (figures / f"{scan.stem}_scan.json").as_posix(),
    }
    if scan.reference is None:
        names["brain_mask"] = (Path(DERIVATIVE) / brain_mask_name(scan)).as_posix()
    return names


def is_finished(scan: Scan, out_dir: Path) -> bool:
    return (out_dir / output_names(scan)["record"]).is_file()


def _load_brain_mask(scan: Scan, settings: ScanSettings, volume):
    from ..io import load_volume
    from ..transforms.brain_mask import user_brain_mask

    if settings.brain_masks is not None:
        path = Path(settings.brain_masks) / brain_mask_name(scan)
        if not path.is_file():
            raise InputError(f"no brain mask {brain_mask_name(scan)} in the --brain-masks folder")
        return user_brain_mask(load_volume(path), volume)
    from ..transforms.brain_extraction.hdbet import compute_brain_mask

    mask = compute_brain_mask(volume, device=settings.device, network=worker_brain_network(settings.device))
    if not mask.any():
        raise InputError("no brain was found in the image")
    return volume.with_array(mask.astype(np.uint8))


def _anonymize_reference(scan: Scan, settings: ScanSettings):
    from ..io import load_volume, require_usable_image

    source = Path(settings.bids_dir) / scan.relative_path
    volume = load_volume(source)
    require_usable_image(volume)
    if settings.plausibility_checks:
        from ..transforms.plausibility import check_head_present

        check_head_present(volume)
    brain = _load_brain_mask(scan, settings, volume)
    if settings.plausibility_checks:
        from ..transforms.plausibility import check_brain_mask

        check_brain_mask(volume, brain)
    if settings.method == "remodel":
        from ..pipelines.remodel import remodel_face

        output = remodel_face(volume, brain_mask=brain, weights=settings.weights, device=settings.device,
                              seed=settings.seed)
    else:
        from ..pipelines.baselines import deface

        output = deface(volume, settings.method, brain_mask=brain, seed=settings.seed)
    return volume, output, brain


def _carry_to_contrast(scan: Scan, settings: ScanSettings):
    from ..io import load_volume, require_usable_image
    from ..pipelines.multicontrast import carry_face_with_details

    out_dir = Path(settings.out_dir)
    reference = Scan(scan.reference, scan.subject, scan.session, *_reference_parts(scan.reference))
    names = output_names(reference)
    t1 = load_volume(Path(settings.bids_dir) / scan.reference)
    t1_out = load_volume(out_dir / names["image"])
    t1_brain = load_volume(out_dir / names["brain_mask"])
    volume = load_volume(Path(settings.bids_dir) / scan.relative_path)
    require_usable_image(volume)
    if settings.plausibility_checks:
        from ..transforms.plausibility import check_head_present

        check_head_present(volume)
    output, details = carry_face_with_details(t1, t1_out, t1_brain, volume)
    return volume, output, details["brain_mask"]


def _reference_parts(relative_path: str):
    parsed = parse_name(relative_path)
    if parsed is None:
        raise InputError(f"{relative_path}: not a BIDS image name")
    return parsed


def _scores(volume, output, brain) -> Dict[str, float]:
    from ..transforms.head_mask import head_mask_array

    changed = np.asarray(output.array) != np.asarray(volume.array)
    inside = np.asarray(brain.array) != 0
    head = head_mask_array(volume.array)
    voxel_ml = float(np.prod(volume.spacing)) / 1000.0
    return {"brain_voxels_exact": bool(np.array_equal(np.asarray(output.array)[inside],
                                                      np.asarray(volume.array)[inside])),
            "brain_ml": round(float(inside.sum()) * voxel_ml, 1),
            "head_ml": round(float(head.sum()) * voxel_ml, 1),
            "changed_ml": round(float(changed.sum()) * voxel_ml, 1),
            "changed_fraction_of_head_outside_brain": round(
                float((changed & head & ~inside).sum()) / max(float((head & ~inside).sum()), 1.0), 4)}


def treated_region(changed: np.ndarray) -> np.ndarray:
    """The convex region (100 random facets of the hull, a fixed seed) that holds every changed voxel.

    Written as the defacemask instead of ``changed`` itself, whose boundary is the original face."""
    import torch

    from ..transforms.convex_hull import hull_half_spaces

    points = np.argwhere(changed)
    if points.shape[0] < 4:
        return changed.copy()
    try:
        from scipy.spatial import ConvexHull as QhullHull

        points = points[QhullHull(points.astype(np.float64)).vertices]
        half_spaces = hull_half_spaces(points, generator=torch.Generator().manual_seed(0))
    except (InputError, ValueError, RuntimeError):  # flat or degenerate: the bounding box
        region = np.zeros_like(changed, dtype=bool)
        low, high = points.min(axis=0), points.max(axis=0) + 1
        region[low[0]:high[0], low[1]:high[1], low[2]:high[2]] = True
        return region
    return half_spaces.voxelize(changed.shape) | changed


def _write_outputs(scan: Scan, settings: ScanSettings, volume, output, brain, record: Dict[str, Any]) -> None:
    from ..io.sidecar import write_deidentified_sidecar
    from ..io.writers import OutputTransaction

    out_dir = Path(settings.out_dir)
    names = output_names(scan)
    source = Path(settings.bids_dir) / scan.relative_path
    changed = treated_region(np.asarray(output.array) != np.asarray(volume.array)).astype(np.uint8)
    with OutputTransaction() as outputs:
        outputs.add_volume(output, out_dir / names["image"], like=volume, protect=[source])
        outputs.add_volume(volume.with_array(changed), out_dir / names["defacemask"], like=np.uint8)
        outputs.add_file(out_dir / names["sidecar"], lambda path: write_deidentified_sidecar(
            path, settings.method, source_image=source))
        if "brain_mask" in names:
            outputs.add_volume(brain.with_array((np.asarray(brain.array) != 0).astype(np.uint8)),
                               out_dir / names["brain_mask"], like=np.uint8)
        if settings.figures:
            from ..rendering import render_face, save_png, side_by_side, skin_iso_level

            figure = side_by_side([render_face(output, iso_level=skin_iso_level(volume), size=128)],
                                  [f"{scan.suffix} {settings.method}"])
            outputs.add_file(out_dir / names["figure"], lambda path: save_png(figure, path))
        outputs.add_file(out_dir / names["record"], lambda path: path.write_text(
            json.dumps(record, indent=2) + "\n", encoding="utf-8"))  # staged last: committed last


def process_scan(scan: Scan, settings: ScanSettings, reference_record: Optional[Dict[str, Any]] = None
                 ) -> Dict[str, Any]:
    """De-identify ``scan`` and write its outputs (see the module docstring); returns its record."""
    record: Dict[str, Any] = {"scan": scan.relative_path, "participant_id": f"sub-{scan.subject}",
                              "session": scan.session or "", "suffix": scan.suffix, "method": settings.method,
                              "reference": scan.reference or ""}
    out_dir = Path(settings.out_dir)
    if is_finished(scan, out_dir):
        previous = json.loads((out_dir / output_names(scan)["record"]).read_text(encoding="utf-8"))
        return dict(previous, status="skipped")
    if reference_record is not None and reference_record.get("status") not in ("done", "skipped"):
        return dict(record, status="blocked", error=f"its T1w {scan.reference} did not finish")

    def work(started: float) -> None:
        if scan.reference is None:
            volume, output, brain = _anonymize_reference(scan, settings)
        else:
            volume, output, brain = _carry_to_contrast(scan, settings)
        record.update(_scores(volume, output, brain))
        record.update(status="done", seconds=round(time.perf_counter() - started, 2))
        if not record["brain_voxels_exact"]:
            raise InputError("brain voxels changed; nothing was written")
        _write_outputs(scan, settings, volume, output, brain, record)

    return _with_retries(record, settings.retries, work)


def _with_retries(record: Dict[str, Any], retries: int, work: Callable[[float], None]) -> Dict[str, Any]:
    """Run ``work(start time)`` (which fills ``record`` and writes the outputs) up to ``retries + 1`` times."""
    attempts = max(1, retries + 1)
    error_text = "no attempt made"
    for attempt in range(1, attempts + 1):
        started = time.perf_counter()
        record.update(attempts=attempt)
        try:
            work(started)
            return dict(record, status="done")
        except AnonMRIError as error:  # the input's fault: no retry
            return dict(record, status="failed", error=str(error).splitlines()[0])
        except MemoryError:
            error_text = "out of memory"
        except Exception as error:  # noqa: BLE001 - any failure is reported per scan, never stops the run
            error_text = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return dict(record, status="failed", error=error_text)


def untreated_warning(relative_path: str, spacing) -> str:
    """The report's warning for an image carried with its face untreated ("" when none is due)."""
    if "/anat/" in f"/{relative_path}":
        return "anatomical image carried with its face untreated"
    if all(float(s) <= FACE_VISIBLE_MM for s in spacing):
        return f"voxels of at most {FACE_VISIBLE_MM} mm carried unchanged: a face may be recognisable"
    return ""


def carry_image(relative_path: str, settings: ScanSettings) -> Dict[str, Any]:
    """Copy one image that is not de-identified, header text scrubbed and voxels unchanged; its record."""
    from ..io.writers import OutputTransaction, write_scrubbed_nifti_copy

    parsed = parse_name(relative_path)
    session = next((part[4:] for part in relative_path.split("/") if part.startswith("ses-")), "")
    record: Dict[str, Any] = {"scan": relative_path, "participant_id": f"sub-{subject_of(relative_path) or ''}",
                              "session": session, "suffix": parsed[1] if parsed else "", "method": "none"}
    source = Path(settings.bids_dir) / relative_path
    target = Path(settings.out_dir) / relative_path

    def warn(image: Path) -> None:
        import nibabel as nib

        record["warning"] = untreated_warning(relative_path, nib.load(str(image)).header.get_zooms()[:3])

    def work(started: float) -> None:
        warn(source)
        with OutputTransaction() as outputs:
            outputs.add_file(target, lambda staged: write_scrubbed_nifti_copy(source, staged), protect=[source])
        record["seconds"] = round(time.perf_counter() - started, 2)

    if target.is_file():
        warn(target)  # written by this library: readable
        return dict(record, status="skipped")
    return _with_retries(record, settings.retries, work)


def settings_dict(settings: ScanSettings) -> Dict[str, Any]:
    return asdict(settings)
