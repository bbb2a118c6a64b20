"""Walk a BIDS dataset: every anatomical T1w, and the other anatomical contrasts of its session.

A scan is ``sub-<label>[/ses-<label>]/anat/<entities>_<suffix>.nii[.gz]``. The T1w scans are the
references; every T2w, FLAIR, PDw, PD or T2starw image of the same session folder receives the
face of the session's first T1w (sorted by name) through
:mod:`~AnonMRILib.pipelines.multicontrast`. Names that already are derivatives (``_defacemask``,
``desc-``) are ignored. Only files are read; nothing in the dataset is ever written.
"""
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ..errors import InputError
from ..io.formats import PathLike

REFERENCE_SUFFIX = "T1w"
OTHER_SUFFIXES = ("T2w", "FLAIR", "PDw", "PD", "T2starw")
_NAME = re.compile(r"^(?P<entities>sub-[A-Za-z0-9]+(?:_[a-z]+-[A-Za-z0-9]+)*)_(?P<suffix>[A-Za-z0-9]+)"
                   r"(?P<extension>\.nii(?:\.gz)?)$")


@dataclass(frozen=True)
class Scan:
    """One anatomical image of a BIDS dataset (paths relative to the dataset root, POSIX style)."""

    relative_path: str
    subject: str
    session: Optional[str]
    entities: str
    suffix: str
    extension: str
    #: relative path of the session's T1w whose face this scan receives (None for a T1w itself)
    reference: Optional[str] = None

    @property
    def folder(self) -> str:
        return str(Path(self.relative_path).parent.as_posix())

    @property
    def stem(self) -> str:
        return f"{self.entities}_{self.suffix}"


@dataclass(frozen=True)
class BidsLayout:
    """The scans of a dataset to process: references (T1w) first, then the other contrasts."""

    root: Path
    references: Tuple[Scan, ...]
    others: Tuple[Scan, ...] = field(default_factory=tuple)

    @property
    def scans(self) -> Tuple[Scan, ...]:
        return self.references + self.others


def parse_name(path: PathLike) -> Optional[Tuple[str, str, str]]:
    """(entities, suffix, extension) of a BIDS image name, or None for other files."""
    match = _NAME.match(Path(path).name)
    if not match or "desc-" in match.group("entities"):
        return None
    return match.group("entities"), match.group("suffix"), match.group("extension")


def find_scans(root: PathLike, participants: Optional[Sequence[str]] = None) -> BidsLayout:
    """The T1w scans (and their sessions' other contrasts) of the BIDS dataset at ``root``.

    ``participants``: labels with or without ``sub-`` (default: every subject). Raises
    :class:`InputError` when ``root`` is not a BIDS dataset or a requested participant is missing.
    """
    root = Path(root)
    if not (root / "dataset_description.json").is_file():
        raise InputError(f"{root}: not a BIDS dataset (no dataset_description.json)")
    subjects = sorted(p for p in root.glob("sub-*") if p.is_dir())
    if participants:
        wanted = {label[4:] if label.startswith("sub-") else label for label in participants}
        missing = sorted(wanted - {p.name[4:] for p in subjects})
        if missing:
            raise InputError(f"{root}: no participant {', '.join(missing)} in the dataset")
        subjects = [p for p in subjects if p.name[4:] in wanted]
    references: List[Scan] = []
    others: List[Scan] = []
    for subject in subjects:
        sessions = sorted(p for p in subject.glob("ses-*") if p.is_dir()) or [subject]
        for session in sessions:
            anat = session / "anat"
            if not anat.is_dir():
                continue
            session_label = session.name[4:] if session.name.startswith("ses-") else None
            found = [(path, parse_name(path)) for path in sorted(anat.iterdir()) if path.is_file()]
            t1 = [Scan(path.relative_to(root).as_posix(), subject.name[4:], session_label, *parsed)
                  for path, parsed in found if parsed and parsed[1] == REFERENCE_SUFFIX]
            references.extend(t1)
            if not t1:
                continue
            others.extend(Scan(path.relative_to(root).as_posix(), subject.name[4:], session_label, *parsed,
                               reference=t1[0].relative_path)
                          for path, parsed in found if parsed and parsed[1] in OTHER_SUFFIXES)
    if not references:
        raise InputError(f"{root}: no T1w image found (sub-*/[ses-*/]anat/*_T1w.nii[.gz])")
    return BidsLayout(root, tuple(references), tuple(others))
