"""BIDS JSON sidecars of de-identified images: ``DeidentificationMethod`` and its code sequence.

An output's sidecar starts from the input's sidecar (the ``.json`` beside a NIfTI input, when
there is one) without the keys that can identify a patient, a site or a date (:data:`DROPPED_KEYS`),
then gains ``DeidentificationMethod`` (text) and ``DeidentificationMethodCodeSequence`` (DCM codes,
see :mod:`~AnonMRILib.io.deidentification`).
"""
import json
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Union

from .deidentification import method_codes, method_description
from .formats import PathLike, image_suffix

#: sidecar keys never copied to an output: dates, times, sites, devices, people, free text
DROPPED_KEYS = frozenset({
    "AcquisitionDateTime", "AcquisitionDate", "AcquisitionTime", "ContentDate", "ContentTime",
    "SeriesDate", "StudyDate", "StudyTime", "SeriesTime", "PatientName", "PatientID", "PatientBirthDate",
    "PatientSex", "PatientAge", "PatientWeight", "InstitutionName", "InstitutionAddress",
    "InstitutionalDepartmentName", "StationName", "DeviceSerialNumber", "ProcedureStepDescription",
    "PerformingPhysicianName", "ReferringPhysicianName", "OperatorsName", "StudyDescription",
    "SeriesDescription", "ProtocolName", "ImageComments", "StudyInstanceUID", "SeriesInstanceUID",
    "SOPInstanceUID", "FrameOfReferenceUID", "AccessionNumber", "StudyID", "RequestingPhysician",
})


def sidecar_path(image: PathLike) -> Path:
    """``sub-01_T1w.nii.gz`` -> ``sub-01_T1w.json`` (beside the image)."""
    image = Path(image)
    suffix = image_suffix(image)
    name = image.name[: len(image.name) - len(suffix)] if suffix else image.stem
    return image.parent / f"{name}.json"


def read_sidecar(path: PathLike) -> Dict[str, Any]:
    """The JSON object in ``path`` ({} when it does not exist or is not a JSON object)."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def sidecar_slice_thickness(image: PathLike) -> Optional[float]:
    """``SliceThickness`` (mm) of the BIDS sidecar beside ``image``, when it is a positive number;
    None otherwise (no sidecar, no such key, or a value that is not a usable thickness)."""
    value = read_sidecar(sidecar_path(image)).get("SliceThickness")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if 0.0 < value < 100.0 else None


def deidentified_sidecar(method: str, codes: Iterable[str] = (),
                         source: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The sidecar content of an output de-identified by ``method``: ``source``'s safe keys + the two keys."""
    fields = {k: v for k, v in (source or {}).items() if k not in DROPPED_KEYS}
    fields["DeidentificationMethod"] = method_description(method)
    fields["DeidentificationMethodCodeSequence"] = method_codes(codes)
    return fields


def write_deidentified_sidecar(path: PathLike, method: str, codes: Iterable[str] = (),
                               source_image: Union[PathLike, None] = None) -> Path:
    """Write the sidecar of an output de-identified by ``method`` to ``path`` (not atomic: stage it)."""
    source = read_sidecar(sidecar_path(source_image)) if source_image is not None and \
        Path(source_image).is_file() else {}
    path = Path(path)
    path.write_text(json.dumps(deidentified_sidecar(method, codes, source), indent=2) + "\n", encoding="utf-8")
    return path
