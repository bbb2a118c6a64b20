"""Walk a BIDS dataset: the anatomical scans to de-identify, and every other file to carry.

A scan is ``sub-<label>[/ses-<label>]/anat/<entities>_<suffix>.nii[.gz]``. The T1w scans are the
references; every anatomical image of the same session folder whose suffix is in ``carry_suffixes``
(default T2w, FLAIR, PDw, PD, T2starw) receives the face of the session's first T1w (sorted by
name) through :mod:`~AnonMRILib.pipelines.multicontrast`. Every other file of the dataset is
*carried*: other images (func, dwi, fmap, perf, pet, anatomical images of untreated suffixes)
with their header scrubbed and voxels unchanged, text files through
:mod:`~AnonMRILib.batch.metadata`. ``sourcedata/``, ``derivatives/`` and hidden files (``.git``,
``.datalad``; ``.bidsignore`` excepted) are never carried (they may hold source DICOMs or images
with faces): they are listed in ``left_out``. Only files are read; nothing in the dataset is written.
"""
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

from ..errors import InputError
from ..io.formats import PathLike

REFERENCE_SUFFIX = "T1w"
OTHER_SUFFIXES = ("T2w", "FLAIR", "PDw", "PD", "T2starw")
#: top-level folders never carried into the de-identified dataset
NOT_CARRIED = ("sourcedata", "derivatives")
#: the one hidden file that is carried
CARRIED_HIDDEN = (".bidsignore",)
_NAME = re.compile(r"^(?P<entities>sub-[A-Za-z0-9]+(?:_[a-z]+-[A-Za-z0-9]+)*)_(?P<suffix>[A-Za-z0-9]+)"
                   r"(?P<extension>\.nii(?:\.gz)?)$")
_IMAGE = re.compile(r"\.nii(\.gz)?$")


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
    """What a run does with a dataset: the scans to de-identify (references first, then the other
    contrasts), the images carried untreated, the other files carried, and what is left out."""

    root: Path
    references: Tuple[Scan, ...]
    others: Tuple[Scan, ...] = field(default_factory=tuple)
    #: images carried with a scrubbed header and unchanged voxels (relative paths)
    carried_images: Tuple[str, ...] = field(default_factory=tuple)
    #: every other carried file (text, tables, sidecars, bval/bvec, ...; relative paths)
    carried_files: Tuple[str, ...] = field(default_factory=tuple)
    #: files and folders of the input that are not carried (relative paths)
    left_out: Tuple[str, ...] = field(default_factory=tuple)
    #: subject labels (without ``sub-``) of this run
    subjects: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def scans(self) -> Tuple[Scan, ...]:
        return self.references + self.others


def parse_name(path: PathLike) -> Optional[Tuple[str, str, str]]:
    """(entities, suffix, extension) of a BIDS image name, or None for other files."""
    match = _NAME.match(Path(path).name)
    if not match or "desc-" in match.group("entities"):
        return None
    return match.group("entities"), match.group("suffix"), match.group("extension")


def subject_of(relative_path: str) -> Optional[str]:
    """``sub-01/ses-1/x`` -> ``01`` (None outside a subject folder)."""
    first = relative_path.split("/", 1)[0]
    return first[4:] if first.startswith("sub-") else None


def is_image(path: PathLike) -> bool:
    """Whether ``path`` names a NIfTI image (``.nii`` or ``.nii.gz``)."""
    return bool(_IMAGE.search(Path(path).name))


def _files_under(folder: Path, root: Path, left_out: List[str]) -> List[str]:
    """Files under ``folder`` (relative to ``root``); hidden entries go to ``left_out`` instead."""
    found = []
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(root).parts
        hidden = [i for i, part in enumerate(parts) if part.startswith(".") and part not in CARRIED_HIDDEN]
        if hidden:
            name = "/".join(parts[: hidden[0] + 1])
            if name not in left_out:
                left_out.append(name)
        elif path.is_file():
            found.append("/".join(parts))
    return found


def find_scans(root: PathLike, participants: Optional[Sequence[str]] = None,
               carry_suffixes: Iterable[str] = OTHER_SUFFIXES) -> BidsLayout:
    """The scans and carried files of the BIDS dataset at ``root`` (see the module docstring).

    ``participants``: labels with or without ``sub-`` (default: every subject). Raises
    :class:`InputError` when ``root`` is not a BIDS dataset or a requested participant is missing.
    """
    root = Path(root)
    carry_suffixes = frozenset(carry_suffixes)
    if not (root / "dataset_description.json").is_file():
        raise InputError(f"{root}: not a BIDS dataset (no dataset_description.json)")
    subjects = sorted(p for p in root.glob("sub-*") if p.is_dir())
    if participants:
        wanted = {label[4:] if label.startswith("sub-") else label for label in participants}
        missing = sorted(wanted - {p.name[4:] for p in subjects})
        if missing:
            raise InputError(f"{root}: no participant {', '.join(missing)} in the dataset")
        subjects = [p for p in subjects if p.name[4:] in wanted]
    left_out: List[str] = []
    files: List[str] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("sub-") and entry.is_dir():
            continue
        if entry.name in NOT_CARRIED or entry.name.startswith(".") and entry.name not in CARRIED_HIDDEN:
            left_out.append(entry.name)
        elif entry.is_dir():
            files.extend(_files_under(entry, root, left_out))
        elif entry.is_file():
            files.append(entry.name)
    references: List[Scan] = []
    others: List[Scan] = []
    for subject in subjects:
        files.extend(_files_under(subject, root, left_out))
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
                          for path, parsed in found if parsed and parsed[1] in carry_suffixes)
    if not references:
        raise InputError(f"{root}: no T1w image found (sub-*/[ses-*/]anat/*_T1w.nii[.gz])")
    from .scan import output_names

    written = {name for scan in references + others
               for key, name in output_names(scan).items() if key in ("image", "sidecar")}
    carried = [f for f in files if f not in written]
    return BidsLayout(root, tuple(references), tuple(others),
                      carried_images=tuple(f for f in carried if is_image(f)),
                      carried_files=tuple(f for f in carried if not is_image(f)),
                      left_out=tuple(left_out), subjects=tuple(p.name[4:] for p in subjects))
