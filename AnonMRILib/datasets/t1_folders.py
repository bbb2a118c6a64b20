"""Real T1w data as users hold it: BIDS datasets (OASIS-3), ADNI download folders, plain folders.

:func:`find_t1w_images` walks a folder and returns one :class:`T1Record` per T1-weighted NIfTI
file with the *patient* it belongs to, so that :func:`split_by_patient` can keep every scan of a
patient on one side of a train/test split (the paper splits OASIS-3 and ADNI 80/20 by patient).

Layouts recognised (``layout="auto"`` tries them in this order):

* ``bids``: ``sub-<label>/[ses-<label>/]anat/*_T1w.nii[.gz]`` (OASIS-3 as converted to BIDS:
  ``sub-OAS30001/ses-d0129/anat/sub-OAS30001_ses-d0129_run-01_T1w.nii.gz``); patient =
  ``sub-<label>``, session = ``ses-<label>`` or "".
* ``adni``: any NIfTI below a folder named like an ADNI subject id ``123_S_4567`` (the layout of
  ADNI downloads: ``ADNI/002_S_0295/MPRAGE/2006-04-18_08_20_30.0/I13722/*.nii``); patient = that
  id, session = the path between the subject folder and the file.
* ``flat``: every NIfTI in the tree; patient = a ``sub-<label>`` or ADNI id found in the path,
  else the file name without extension (one patient per file).

DICOM folders are not searched (convert them with dcm2niix, or load one series at a time with
:func:`AnonMRILib.io.load_volume`).
"""
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np

from ..errors import InputError

LAYOUTS = ("auto", "bids", "adni", "flat")
_NIFTI = (".nii", ".nii.gz")
_BIDS_SUBJECT = re.compile(r"^sub-[A-Za-z0-9]+$")
_BIDS_SESSION = re.compile(r"^ses-[A-Za-z0-9]+$")
_ADNI_SUBJECT = re.compile(r"^\d{3}_S_\d{4}$")


@dataclass(frozen=True)
class T1Record:
    """One T1w image file: ``patient`` id, ``session`` ("" when unknown) and ``path``."""

    patient: str
    session: str
    path: Path

    def load(self):
        """The image as a :class:`~AnonMRILib.io.Volume`."""
        from ..io import load_volume

        return load_volume(self.path)


def _is_nifti(path: Path) -> bool:
    name = path.name.lower()
    return path.is_file() and any(name.endswith(s) for s in _NIFTI)


def _bids_records(root: Path) -> List[T1Record]:
    records = []
    for path in sorted(root.rglob("*")):
        if not _is_nifti(path) or "_T1w." not in path.name or path.parent.name != "anat":
            continue
        parts = path.relative_to(root).parts
        subject = next((p for p in parts if _BIDS_SUBJECT.match(p)), None)
        if subject is None or "derivatives" in parts:
            continue
        session = next((p for p in parts if _BIDS_SESSION.match(p)), "")
        records.append(T1Record(subject, session, path))
    return records


def _adni_records(root: Path) -> List[T1Record]:
    records = []
    for path in sorted(root.rglob("*")):
        if not _is_nifti(path):
            continue
        parts = path.relative_to(root).parts
        for index, part in enumerate(parts[:-1]):
            if _ADNI_SUBJECT.match(part):
                records.append(T1Record(part, "/".join(parts[index + 1:-1]), path))
                break
    return records


def _flat_records(root: Path) -> List[T1Record]:
    records = []
    for path in sorted(root.rglob("*")):
        if not _is_nifti(path):
            continue
        parts = path.relative_to(root).parts
        patient = next((p for p in parts[:-1] if _BIDS_SUBJECT.match(p) or _ADNI_SUBJECT.match(p)), None)
        if patient is None:
            match = re.match(r"^(sub-[A-Za-z0-9]+)_", path.name)
            patient = match.group(1) if match else re.sub(r"\.nii(\.gz)?$", "", path.name, flags=re.I)
        records.append(T1Record(patient, "", path))
    return records


def find_t1w_images(root: Union[str, Path], layout: str = "auto") -> List[T1Record]:
    """All T1w NIfTI files below ``root`` with their patient ids, sorted by path.

    Raises :class:`InputError` when ``root`` is not a folder or holds no matching file.
    """
    root = Path(root)
    if layout not in LAYOUTS:
        raise InputError(f"unknown layout {layout!r} (use one of {', '.join(LAYOUTS)})")
    if not root.is_dir():
        raise InputError(f"{root}: not a folder")
    finders = {"bids": _bids_records, "adni": _adni_records, "flat": _flat_records}
    order = ("bids", "adni", "flat") if layout == "auto" else (layout,)
    for name in order:
        records = finders[name](root)
        if records:
            return sorted(records, key=lambda r: str(r.path))
    raise InputError(f"{root}: no T1w NIfTI file found (layout {layout})")


def group_by_patient(records: Sequence[T1Record]) -> Dict[str, List[T1Record]]:
    """patient id -> that patient's records (in input order)."""
    groups: Dict[str, List[T1Record]] = {}
    for record in records:
        groups.setdefault(record.patient, []).append(record)
    return groups


def split_by_patient(records: Sequence[T1Record], test_fraction: float = 0.2, seed: int = 0
                     ) -> Tuple[List[T1Record], List[T1Record]]:
    """(train, test) records with every patient's scans on one side; deterministic per seed.

    With two or more patients and 0 < test_fraction < 1 each side gets at least one patient.
    """
    if not 0.0 <= test_fraction <= 1.0:
        raise InputError("test_fraction must lie in [0, 1]")
    groups = group_by_patient(records)
    patients = sorted(groups)
    rng = np.random.default_rng([int(seed), 0x7F1])
    order = [patients[i] for i in rng.permutation(len(patients))]
    n_test = int(round(test_fraction * len(patients)))
    if len(patients) >= 2 and 0.0 < test_fraction < 1.0:
        n_test = min(max(n_test, 1), len(patients) - 1)
    test_patients = set(order[:n_test])
    train = [r for r in records if r.patient not in test_patients]
    test = [r for r in records if r.patient in test_patients]
    return train, test
