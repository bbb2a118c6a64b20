"""Write :class:`Volume`s atomically, with headers that carry no identifying text.

Every output header is built from scratch from the voxels and the affine: NIfTI ``descrip``,
``aux_file``, ``intent_name`` and ``db_name`` are empty and no extension is written; NRRD and
MetaImage files carry only the geometry keys; nothing of a DICOM header is ever copied (AnonMRI
does not write DICOM). A file is first written under a temporary name in the destination folder,
then renamed into place, so a failure never leaves a half-written output.
"""
import os
import tempfile
from pathlib import Path
from typing import Iterable, Union

import numpy as np

from ..errors import InputError
from .formats import DETACHED_HEADER_SUFFIXES, NIBABEL_SUFFIXES, WRITE_SUFFIXES, PathLike, image_suffix
from .readers import LPS_TO_RAS
from .volume import Volume


def check_output_path(path: PathLike, inputs: Iterable[PathLike] = ()) -> Path:
    """Validate an image output path before any work: known suffix, writable folder, not an input."""
    path = Path(path)
    if not image_suffix(path):
        raise InputError(f"{path}: unknown output format (use one of {', '.join(WRITE_SUFFIXES)})")
    return check_destination(path, inputs)


def check_destination(path: PathLike, inputs: Iterable[PathLike] = ()) -> Path:
    """Validate any output file path: not a folder, in an existing folder, not one of ``inputs``."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected an output file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{parent}: output folder does not exist")
    for source in inputs:
        if source is not None and _same_file(path, Path(source)):
            raise InputError(f"{path}: refusing to overwrite the input; choose another output path")
    return path


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def cast_to_dtype(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast to ``dtype``; float values going to an integer type are rounded and clipped to its range."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return array != 0
    if np.issubdtype(dtype, np.integer) and not np.issubdtype(array.dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(np.rint(array), info.min, info.max).astype(dtype)
    if np.issubdtype(dtype, np.integer) and np.issubdtype(array.dtype, np.integer):
        info = np.iinfo(dtype)
        return np.clip(array, info.min, info.max).astype(dtype)
    return array.astype(dtype)


def save_volume(volume: Volume, path: PathLike, like: Union[Volume, np.dtype, None] = None,
                protect: Iterable[PathLike] = ()) -> Path:
    """Write ``volume`` to ``path`` atomically, in ``like``'s voxel type (default: its own).

    ``like`` is the input Volume (its dtype is used; its grid must match) or a dtype. ``protect``
    lists input paths that must never be overwritten. Returns the written path.
    """
    path = check_output_path(path, protect)
    dtype = volume.dtype
    if isinstance(like, Volume):
        if not like.same_grid(volume):
            raise InputError("the output does not lie on the input's grid")
        dtype = like.dtype
    elif like is not None:
        dtype = np.dtype(like)
    array = cast_to_dtype(volume.array, dtype)
    if array.dtype == np.bool_:
        array = array.astype(np.uint8)
    if array.dtype == np.float64:
        array = array.astype(np.float32) if np.all(np.abs(array) < 3e38) else array
    suffix = image_suffix(path)
    with tempfile.TemporaryDirectory(prefix=".anonmri-", dir=str(path.parent)) as scratch:
        temporary = Path(scratch) / path.name
        if suffix in NIBABEL_SUFFIXES:
            _write_nibabel(array, volume.affine, temporary, suffix)
        else:
            _write_simpleitk(array, volume.affine, temporary)
        written = sorted(Path(scratch).iterdir(), key=lambda p: p.name == path.name)
        for part in written:  # data file(s) first, the named header last
            os.replace(part, path.parent / part.name)
    return path


def _write_nibabel(array: np.ndarray, affine: np.ndarray, path: Path, suffix: str) -> None:
    import nibabel as nib

    if suffix in (".mgz", ".mgh"):
        if array.dtype not in (np.uint8, np.int16, np.int32, np.float32):
            array = array.astype(np.float32)
        nib.MGHImage(array, affine).to_filename(str(path))
        return
    header = nib.Nifti1Header()
    header.set_data_dtype(array.dtype)
    image = nib.Nifti1Image(array, affine, header=header)
    image.set_qform(affine, code=1)
    image.set_sform(affine, code=1)
    image.header.set_xyzt_units("mm")
    image.header["descrip"] = b""
    image.header["aux_file"] = b""
    image.header["intent_name"] = b""
    image.header["db_name"] = b""
    image.header.extensions.clear()
    image.to_filename(str(path))


def numpy_to_simpleitk(array: np.ndarray, affine: np.ndarray):
    """A SimpleITK image (LPS geometry, no metadata) from voxels [i, j, k] and a RAS affine."""
    import SimpleITK as sitk

    image = sitk.GetImageFromArray(np.ascontiguousarray(np.transpose(array, (2, 1, 0))))
    affine_lps = LPS_TO_RAS @ affine
    spacing = np.linalg.norm(affine_lps[:3, :3], axis=0)
    image.SetSpacing([float(s) for s in spacing])
    image.SetDirection([float(d) for d in (affine_lps[:3, :3] / spacing).ravel()])
    image.SetOrigin([float(o) for o in affine_lps[:3, 3]])
    return image


def _write_simpleitk(array: np.ndarray, affine: np.ndarray, path: Path) -> None:
    import SimpleITK as sitk

    writer = sitk.ImageFileWriter()
    writer.SetFileName(str(path))
    writer.SetUseCompression(image_suffix(path) not in DETACHED_HEADER_SUFFIXES)
    writer.KeepOriginalImageUIDOff()
    writer.Execute(numpy_to_simpleitk(array, affine))
