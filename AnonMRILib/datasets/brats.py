"""BraTS2020 training-data loader (the paper's data set; users bring their own copy).

Layout (as distributed, ``MICCAI_BraTS2020_TrainingData/``)::

    ROOT/name_mapping.csv                                   Grade, ..., BraTS_2020_subject_ID
    ROOT/BraTS20_Training_001/BraTS20_Training_001_t1.nii.gz
                             .../BraTS20_Training_001_{t1,t1ce,t2,flair,seg}.nii.gz

Volumes are 240 x 240 x 155 at 1 mm; axial slices are ``array[:, :, k]`` (240 x 240), slice depth
D = k / 154. Segmentation labels 1 (necrotic / non-enhancing core), 2 (oedema), 4 (enhancing);
the lesion mask is every nonzero label. Grades come from ``name_mapping.csv`` (HGG -> 1,
LGG -> 0). Intensities are normalised per volume with
:func:`AnonMRILib.datasets.slices.normalize_intensity`. Splits are by patient
(:func:`AnonMRILib.datasets.slices.patient_split`), never by slice.
"""
import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from ..errors import InputError
from .slices import GRADES, LesionSliceSet, normalize_intensity

MODALITIES = ("t1", "t1ce", "t2", "flair")
CASE_PATTERN = re.compile(r"^BraTS20_(Training|Validation)_(\d{3})$")


@dataclass(frozen=True)
class BraTSCase:
    """One patient folder: ``case_id`` (e.g. BraTS20_Training_001), numeric ``number``, ``grade``
    (1 = HGG, 0 = LGG, None = unknown), ``folder``."""

    case_id: str
    number: int
    grade: Optional[int]
    folder: Path

    def path(self, kind: str) -> Path:
        """File of a modality (t1, t1ce, t2, flair) or ``seg``."""
        if kind not in MODALITIES + ("seg",):
            raise InputError(f"unknown BraTS modality {kind!r} (use one of {', '.join(MODALITIES)} or seg)")
        return self.folder / f"{self.case_id}_{kind}.nii.gz"


def read_grades(mapping_csv: Union[str, Path]) -> Dict[str, int]:
    """BraTS_2020_subject_ID -> grade index from ``name_mapping.csv``."""
    grades = {}
    with open(mapping_csv, newline="") as handle:
        for row in csv.DictReader(handle):
            case_id = (row.get("BraTS_2020_subject_ID") or "").strip()
            grade = (row.get("Grade") or "").strip().upper()
            if case_id and grade in GRADES:
                grades[case_id] = GRADES.index(grade)
    return grades


def find_brats_cases(root: Union[str, Path], require: Sequence[str] = ("seg",)) -> List[BraTSCase]:
    """The patient folders under ``root`` with every file kind in ``require``, sorted by number."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"BraTS folder {root} does not exist")
    mapping = root / "name_mapping.csv"
    grades = read_grades(mapping) if mapping.is_file() else {}
    cases = []
    for folder in sorted(root.iterdir()):
        match = CASE_PATTERN.match(folder.name)
        if not folder.is_dir() or not match:
            continue
        case = BraTSCase(folder.name, int(match.group(2)), grades.get(folder.name), folder)
        if all(case.path(kind).is_file() for kind in require):
            cases.append(case)
    if not cases:
        raise InputError(f"no BraTS20_Training_XXX folders with {', '.join(require)} files under {root}")
    return cases


def load_case_slices(case: BraTSCase, modality: str = "t1ce", image_size: Optional[int] = None,
                     lesion_only: bool = False, min_brain_fraction: float = 0.02) -> LesionSliceSet:
    """Axial slices of one case as a :class:`LesionSliceSet` (patient id = case number).

    Slices whose brain (nonzero voxels) covers less than ``min_brain_fraction`` of the slice are
    skipped; ``lesion_only`` keeps slices with at least one lesion voxel; ``image_size`` resizes
    (default: the native 240).
    """
    import nibabel as nib

    image = np.asarray(nib.load(str(case.path(modality))).dataobj, dtype=np.float32)
    labels = np.asarray(nib.load(str(case.path("seg"))).dataobj)
    if image.shape != labels.shape or image.ndim != 3:
        raise InputError(f"{case.case_id}: image {image.shape} and segmentation {labels.shape} differ")
    normalized = normalize_intensity(image)
    lesion = labels != 0
    depth_span = max(image.shape[2] - 1, 1)
    keep = [k for k in range(image.shape[2])
            if (image[:, :, k] > 0).mean() >= min_brain_fraction and (lesion[:, :, k].any() or not lesion_only)]
    keep_array = np.array(keep, dtype=int)
    slices = LesionSliceSet(
        images=np.moveaxis(normalized[:, :, keep_array], -1, 0),
        masks=np.moveaxis(lesion[:, :, keep_array], -1, 0),
        grades=np.full(len(keep), case.grade if case.grade is not None else -1),
        depths=keep_array / float(depth_span),
        patients=np.full(len(keep), case.number))
    return slices if image_size is None else slices.resized(image_size)


def load_brats_slices(cases: Sequence[BraTSCase], modality: str = "t1ce", image_size: Optional[int] = None,
                      lesion_only: bool = False) -> LesionSliceSet:
    """Slices of several cases concatenated (cases without a grade are refused)."""
    missing = [case.case_id for case in cases if case.grade is None]
    if missing:
        raise InputError(f"no grade in name_mapping.csv for {', '.join(missing[:3])}")
    return LesionSliceSet.concatenate([load_case_slices(case, modality, image_size, lesion_only) for case in cases])
