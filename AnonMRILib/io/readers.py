"""Read 3-D images into :class:`~AnonMRILib.io.volume.Volume`.

NIfTI (.nii, .nii.gz) and FreeSurfer (.mgz, .mgh) are read with nibabel; NRRD (.nrrd, .nhdr),
MetaImage (.mha, .mhd) and DICOM series folders with SimpleITK, whose LPS geometry is converted to
RAS. Only voxels and geometry are kept: no header text, no DICOM tag survives reading.
"""
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from ..errors import InputError
from .formats import NIBABEL_SUFFIXES, READ_SUFFIXES, SIMPLEITK_SUFFIXES, PathLike, image_suffix
from .volume import Volume

#: flips the first two world axes: LPS (ITK, DICOM) <-> RAS (NIfTI, Slicer)
LPS_TO_RAS = np.diag([-1.0, -1.0, 1.0, 1.0])


def load_volume(path: PathLike, series_uid: Optional[str] = None) -> Volume:
    """Read a 3-D image file or DICOM series folder as a :class:`Volume` in RAS mm.

    A 4-D image holding one volume is squeezed to 3-D. 2-D images, images with several volumes or
    vector components, empty images and unreadable files raise :class:`InputError`.
    ``series_uid`` picks one series in a DICOM folder holding several (default: the largest).
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    if path.is_dir():
        array, affine = _read_dicom_series(path, series_uid)
    else:
        suffix = image_suffix(path)
        if suffix in NIBABEL_SUFFIXES:
            array, affine = _read_nibabel(path)
        elif suffix in SIMPLEITK_SUFFIXES or path.suffix.lower() == ".dcm":
            array, affine = _read_simpleitk(path)
        else:
            raise InputError(
                f"{path}: not a supported image file (expected one of {', '.join(READ_SUFFIXES)} "
                "or a DICOM series folder)")
    return Volume(_to_3d(array, path), affine)


def _to_3d(array: np.ndarray, path: Path) -> np.ndarray:
    if array.size == 0:
        raise InputError(f"{path}: the image is empty (no voxels)")
    while array.ndim > 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim > 3:
        raise InputError(
            f"{path}: a {array.ndim}-D image with {int(np.prod(array.shape[3:]))} volumes; "
            "AnonMRI needs one 3-D volume (extract it first)")
    if array.ndim < 3 or min(array.shape) < 2:
        raise InputError(f"{path}: a 2-D image of shape {array.shape}; AnonMRI needs a 3-D volume")
    return array


def _read_nibabel(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    import nibabel as nib

    try:
        image = nib.load(str(path))
        array = np.asanyarray(image.dataobj)
    except Exception as error:  # nibabel raises many types for broken files
        raise InputError(f"{path}: cannot be read as an image ({type(error).__name__}: {error})") from None
    if array.dtype.fields is not None or array.dtype.kind not in "biuf":
        raise InputError(f"{path}: voxel type {array.dtype} is not a scalar intensity type")
    array = np.asarray(array)
    if not array.dtype.isnative:  # e.g. MGH files are big-endian on disk
        array = array.astype(array.dtype.newbyteorder("="))
    return array, np.asarray(image.affine, dtype=np.float64)


def simpleitk_to_numpy(image) -> Tuple[np.ndarray, np.ndarray]:
    """Voxels indexed [i, j, k] and the RAS affine of a SimpleITK image (any dimension <= 4)."""
    import SimpleITK as sitk

    if image.GetNumberOfComponentsPerPixel() != 1:
        raise InputError(f"the image has {image.GetNumberOfComponentsPerPixel()} components per voxel; "
                         "AnonMRI needs a scalar image")
    dimension = image.GetDimension()
    array = sitk.GetArrayFromImage(image)  # indexed [..., k, j, i]
    array = np.transpose(array, tuple(range(array.ndim))[::-1])
    if dimension < 3:
        return array, np.eye(4)
    spacing = np.array(image.GetSpacing()[:3], dtype=np.float64)
    direction = np.array(image.GetDirection(), dtype=np.float64).reshape(dimension, dimension)[:3, :3]
    affine_lps = np.eye(4)
    affine_lps[:3, :3] = direction * spacing
    affine_lps[:3, 3] = image.GetOrigin()[:3]
    return array, LPS_TO_RAS @ affine_lps


def _read_simpleitk(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    import SimpleITK as sitk

    try:
        image = sitk.ReadImage(str(path))
    except RuntimeError as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else "unreadable"
        raise InputError(f"{path}: cannot be read as an image ({reason})") from None
    return simpleitk_to_numpy(image)


def list_dicom_series(folder: PathLike) -> dict:
    """Map each DICOM SeriesInstanceUID found directly in ``folder`` to its number of files."""
    import SimpleITK as sitk

    reader = sitk.ImageSeriesReader()
    return {uid: len(reader.GetGDCMSeriesFileNames(str(folder), uid))
            for uid in reader.GetGDCMSeriesIDs(str(folder))}


def dicom_slice_thickness(folder: PathLike, series_uid: Optional[str] = None) -> Optional[float]:
    """``SliceThickness`` (0018,0050; mm) of the DICOM series :func:`load_volume` reads from
    ``folder``, from its first file's header (that tag alone is read), when it is a positive number
    below 100; None otherwise (no series, no such tag, not a number)."""
    import SimpleITK as sitk

    from .dicom_writer import dicom_series_files

    try:
        files = dicom_series_files(folder, series_uid)
        reader = sitk.ImageFileReader()
        reader.SetFileName(str(files[0]))
        reader.ReadImageInformation()
        value = float(reader.GetMetaData("0018|0050").strip()) if reader.HasMetaDataKey("0018|0050") else None
    except (InputError, RuntimeError, ValueError, IndexError):
        return None
    return value if value is not None and 0.0 < value < 100.0 else None


def _read_dicom_series(folder: Path, series_uid: Optional[str]) -> Tuple[np.ndarray, np.ndarray]:
    import SimpleITK as sitk

    series = list_dicom_series(folder)
    if not series:
        raise InputError(f"{folder}: a folder without a DICOM series (give an image file or a DICOM folder)")
    if series_uid is None:
        series_uid = max(series, key=lambda uid: series[uid])
    elif series_uid not in series:
        raise InputError(f"{folder}: no DICOM series with that UID ({len(series)} series found)")
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(folder), series_uid))
    reader.MetaDataDictionaryArrayUpdateOff()  # never load patient tags
    try:
        image = reader.Execute()
    except RuntimeError:
        raise InputError(f"{folder}: the DICOM series cannot be read as one volume") from None
    return simpleitk_to_numpy(image)
