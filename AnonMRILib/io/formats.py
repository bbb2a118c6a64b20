"""File formats AnonMRI reads and writes, recognised by name."""
from pathlib import Path
from typing import Union

PathLike = Union[str, Path]

NIBABEL_SUFFIXES = (".nii.gz", ".nii", ".mgz", ".mgh")
SIMPLEITK_SUFFIXES = (".nrrd", ".nhdr", ".mha", ".mhd")
READ_SUFFIXES = NIBABEL_SUFFIXES + SIMPLEITK_SUFFIXES
WRITE_SUFFIXES = READ_SUFFIXES
#: formats stored as a header file plus a separate data file
DETACHED_HEADER_SUFFIXES = (".nhdr", ".mhd")


def image_suffix(path: PathLike) -> str:
    """The recognised image suffix of ``path`` (lower case, '.nii.gz' as one), or '' if none."""
    name = Path(path).name.lower()
    for suffix in READ_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return ""


def stem(path: PathLike) -> str:
    """File name without its image suffix ('sub-01_T1w.nii.gz' -> 'sub-01_T1w')."""
    name = Path(path).name
    suffix = image_suffix(path)
    return name[: len(name) - len(suffix)] if suffix else Path(path).stem
