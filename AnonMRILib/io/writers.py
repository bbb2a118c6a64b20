"""Write :class:`Volume`s atomically, with headers that carry no identifying text.

Every output header is built from scratch from the voxels and the affine: NIfTI ``descrip``,
``aux_file``, ``intent_name`` and ``db_name`` are empty and no extension is written; NRRD and
MetaImage files carry only the geometry keys; a DICOM header is never copied wholesale (DICOM output
is built by :mod:`~AnonMRILib.io.dicom_writer` under DICOM PS3.15's confidentiality profile). A file
is first written under a temporary name in the destination folder, then renamed into place, so a
failure never leaves a half-written output; an :class:`OutputTransaction` does the same for all the
outputs of one command together.
"""
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Union

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
    """Validate any output file path: not a folder, in a folder that exists or can be created, not one of
    ``inputs``."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected an output file name")
    parent = path.parent if str(path.parent) else Path(".")
    ancestor = parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent  # missing folders are created when the output is written
    if not ancestor.is_dir():
        raise InputError(f"{ancestor}: is not a folder, cannot hold the output {path.name}")
    if not os.access(str(ancestor), os.W_OK | os.X_OK):
        raise InputError(f"{ancestor}: output folder is not writable")
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


def volume_array_for_output(volume: Volume, like: Union[Volume, np.dtype, None] = None) -> np.ndarray:
    """The voxel array as it will be stored: ``like``'s voxel type (default: the volume's own)."""
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
    return array


def write_volume_file(volume: Volume, path: PathLike, like: Union[Volume, np.dtype, None] = None) -> None:
    """Write ``volume`` to ``path`` directly (not atomic; used inside an :class:`OutputTransaction`)."""
    path = Path(path)
    array = volume_array_for_output(volume, like)
    if image_suffix(path) in NIBABEL_SUFFIXES:
        _write_nibabel(array, volume.affine, path, image_suffix(path))
    else:
        _write_simpleitk(array, volume.affine, path)


class OutputTransaction:
    """Several outputs written all together or not at all.

    Each output is first written into a hidden scratch folder inside its destination folder (same
    file system), by :meth:`add_volume`, :meth:`add_file` or :meth:`add_folder`; leaving the
    ``with`` block without an exception moves every one into place (renames only), an exception
    deletes the scratch folders and nothing appears. A file of the same name is replaced; if a
    rename fails midway the outputs already moved are removed again.

        with OutputTransaction() as outputs:
            outputs.add_volume(defaced, out, like=volume, protect=[source])
            outputs.add_file(png, lambda path: save_png(figure, path))
    """

    def __init__(self) -> None:
        self._staged = []  # (scratch folder, [(staged path, final path)])
        self._scratch = {}
        self._created = []  # folders made for the outputs, innermost first

    def __enter__(self) -> "OutputTransaction":
        return self

    def __exit__(self, kind, value, traceback) -> bool:
        if kind is None:
            self.commit()
        else:
            self.discard()
        return False

    def _scratch_for(self, folder: Path) -> Path:
        key = str(folder.resolve())
        if key not in self._scratch:
            missing = []
            ancestor = folder
            while not ancestor.exists():
                missing.append(ancestor)
                ancestor = ancestor.parent
            folder.mkdir(parents=True, exist_ok=True)
            self._created.extend(missing)  # innermost first: removed again if nothing is committed
            self._scratch[key] = Path(tempfile.mkdtemp(prefix=".anonmri-", dir=str(folder)))
        return self._scratch[key]

    def _stage(self, path: Path) -> Path:
        parent = path.parent if str(path.parent) else Path(".")
        scratch = self._scratch_for(parent)
        staged = scratch / path.name
        if staged.exists():
            raise InputError(f"{path}: named twice among the outputs of one command")
        self._staged.append((staged, path))
        return staged

    def add_volume(self, volume: Volume, path: PathLike, like: Union[Volume, np.dtype, None] = None,
                   protect: Iterable[PathLike] = ()) -> Path:
        """Stage ``volume`` for ``path`` (checked like :func:`save_volume`)."""
        path = check_output_path(path, [p for p in protect if p is not None])
        staged = self._stage(path)
        write_volume_file(volume, staged, like)
        if image_suffix(path) in DETACHED_HEADER_SUFFIXES:  # its data file (.raw/.zraw) lands beside it
            known = {staged_path for staged_path, _ in self._staged}
            for part in sorted(staged.parent.iterdir()):
                if part not in known and part.name.startswith(stem_of(path.name)):
                    self._staged.insert(len(self._staged) - 1, (part, path.parent / part.name))
        return path

    def add_file(self, path: PathLike, write: Callable[[Path], object], protect: Iterable[PathLike] = ()) -> Path:
        """Stage a file written by ``write(staged_path)`` for ``path``."""
        path = check_destination(path, [p for p in protect if p is not None])
        write(self._stage(path))
        return path

    def add_folder(self, path: PathLike, write: Callable[[Path], object]) -> Path:
        """Stage a folder filled by ``write(staged_folder)`` for ``path`` (which must not exist or be empty)."""
        path = Path(path)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise InputError(f"{path}: output folder exists and is not empty")
        staged = self._stage(path)
        staged.mkdir()
        write(staged)
        return path

    def commit(self) -> None:
        """Move every staged output into place (renames only); on failure remove those already moved."""
        moved = []
        try:
            for staged, final in self._staged:
                if staged.is_dir() and final.is_dir():
                    final.rmdir()  # empty (checked when staged)
                os.replace(staged, final)
                moved.append(final)
        except BaseException:
            for final in moved:
                if final.is_dir():
                    shutil.rmtree(final, ignore_errors=True)
                elif final.exists():
                    final.unlink()
            self.discard()
            raise
        self._created = []  # the folders now hold outputs
        self.discard()

    def discard(self) -> None:
        """Delete every staged output (and the folders made for them); nothing appears."""
        for scratch in self._scratch.values():
            shutil.rmtree(scratch, ignore_errors=True)
        self._scratch.clear()
        self._staged = []
        for folder in self._created:
            try:
                folder.rmdir()
            except OSError:
                break
        self._created = []


def stem_of(name: str) -> str:
    suffix = image_suffix(name)
    return name[: len(name) - len(suffix)] if suffix else name


def save_volume(volume: Volume, path: PathLike, like: Union[Volume, np.dtype, None] = None,
                protect: Iterable[PathLike] = ()) -> Path:
    """Write ``volume`` to ``path`` atomically, in ``like``'s voxel type (default: its own).

    ``like`` is the input Volume (its dtype is used; its grid must match) or a dtype. ``protect``
    lists input paths that must never be overwritten. Returns the written path.
    """
    with OutputTransaction() as outputs:
        path = outputs.add_volume(volume, path, like=like, protect=protect)
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
    """A SimpleITK image (LPS geometry, no metadata) from voxels [i, j, k] (or vectors [i, j, k, c])
    and a RAS affine."""
    import SimpleITK as sitk

    array = np.asarray(array)
    vector = array.ndim == 4
    axes = (2, 1, 0, 3) if vector else (2, 1, 0)
    image = sitk.GetImageFromArray(np.ascontiguousarray(np.transpose(array, axes)), isVector=vector)
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


#: NIfTI header text fields emptied by :func:`write_scrubbed_nifti_copy`
NIFTI_TEXT_FIELDS = ("descrip", "aux_file", "intent_name", "db_name")


def write_scrubbed_nifti_copy(source: PathLike, path: PathLike) -> Path:
    """Copy the NIfTI-1/2 image ``source`` to ``path`` with its header text fields emptied and its
    extensions dropped; every other header field (geometry, TR, units, scaling, slice timing) and
    the stored voxel bytes are kept as they are (not atomic: stage it). A ``.gz`` output carries no
    file name and a zero time stamp in its gzip header, so the same input gives the same bytes."""
    import gzip

    import nibabel as nib

    source, path = Path(source), Path(path)
    try:
        image = nib.load(str(source))
    except Exception as error:  # noqa: BLE001 - nibabel raises many kinds on bad files
        raise InputError(f"{source.name}: cannot be read as NIfTI ({type(error).__name__})") from None
    if not isinstance(image, (nib.Nifti1Image, nib.Nifti2Image)):  # a .hdr/.img pair loads as a Nifti1Pair
        raise InputError(f"{source.name}: not a single-file NIfTI image")
    header = image.header.copy()
    for name in NIFTI_TEXT_FIELDS:
        if name in header:
            header[name] = b""
    old_offset = int(image.dataobj.offset)  # the loaded header's vox_offset is not the file's
    block_size = header.sizeof_hdr + 4  # the header, then the 4-byte extension flag (all zero: none)
    header["vox_offset"] = block_size
    opener = gzip.open if source.name.endswith(".gz") else open
    with opener(str(source), "rb") as stream, open(str(path), "wb") as raw:
        target = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) \
            if path.name.endswith(".gz") else raw
        try:
            stream.read(old_offset)
            target.write(header.binaryblock + b"\x00" * 4)
            shutil.copyfileobj(stream, target, 1 << 20)
        finally:
            if target is not raw:
                target.close()
    return path
