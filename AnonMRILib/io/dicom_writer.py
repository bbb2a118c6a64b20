"""DICOM series out: the de-identified volume written back into a copy of the input series, de-identified
under DICOM PS3.15 Annex E.

    config = DicomDeidentificationConfig(method="remodel", pseudonym="SUBJ-001", uid_key=read_uid_key(path))
    write_dicom_series(volume, source_folder, out_folder, config)      # one file per input slice

What each output file is (pydicom, no hand-written encoder):

* **Basic Application Level Confidentiality Profile** (code 113100): every attribute of PS3.15
  Table E.1-1 gets its action, in the dataset and in every nested sequence item. The table is read
  from the ``dicom-anonymizer`` package's transcription of the standard (pure data, loaded by file
  path; its code is not used). Actions: D -> a dummy value of the attribute's VR, Z -> empty,
  X -> removed, U -> a new UID; for the combined actions the most private choice that keeps the
  IOD valid: Z/D, X/Z, X/Z/D -> empty, X/D -> removed, X/Z/U* -> UIDs replaced, other values
  emptied. Dates and times are handled by the profile itself (no date option is used, so none is
  retained), private attributes are removed, the file meta header is rebuilt from scratch, and
  (0028,0303) Longitudinal Temporal Information Modified = REMOVED.
* **Clean Recognizable Visual Features option** (113102): the pixels are the de-identified volume's
  (face remodeled or removed), (0028,0302) Recognizable Visual Features = NO.
* (0012,0062) Patient Identity Removed = YES, (0012,0063) De-identification Method (text),
  (0012,0064) De-identification Method Code Sequence = 113100, 113102 (+ options given).
* Patient's Name and Patient ID = the pseudonym: the user's, or derived from the UID key and the
  original Patient ID (same patient, same pseudonym), or random when there is no key.
* New UIDs ``2.25.<128-bit integer>``: HMAC-SHA-256 of the old UID under the user's key file
  (:func:`read_uid_key`), so that the series of one study processed at different times keep one
  Study UID and one Frame of Reference UID, and references between them stay consistent; the other
  UIDs (series, SOP instances, references to them) also depend on the method, so that two different
  de-identifications of one image never share a UID; without a key, a random key per run
  (consistent within the run only).

Geometry (position, orientation, spacing, slice order), the transfer syntax and the pixel
representation (bits, sign, rescale) are the input's; each slice's stored values are the volume's
values mapped back through that slice's rescale slope/intercept, so brain voxels are the input's
stored values bit for bit. Refused with a clear :class:`InputError`: enhanced / multi-frame images,
compressed or big-endian transfer syntaxes, burned-in annotation, and series whose slices differ in
size, orientation, pixel representation or SOP class.
"""
import hashlib
import hmac
import importlib.util
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DependencyError, InputError
from .deidentification import method_codes
from .formats import PathLike
from .readers import LPS_TO_RAS
from .volume import Volume

#: single-frame uncompressed little-endian transfer syntaxes accepted for output
SUPPORTED_TRANSFER_SYNTAXES = ("1.2.840.10008.1.2", "1.2.840.10008.1.2.1")
#: the Table E.1-1 transcription used (module of dicom-anonymizer's databases)
PROFILE_TABLE = "dicomfields_2026c"
#: action name of each category of the table
_CATEGORY_ACTIONS = {"D_TAGS": "D", "Z_TAGS": "Z", "X_TAGS": "X", "U_TAGS": "U", "Z_D_TAGS": "Z",
                     "X_Z_TAGS": "Z", "X_D_TAGS": "X", "X_Z_D_TAGS": "Z", "X_Z_U_STAR_TAGS": "ZU"}
MIN_KEY_BYTES = 16


def _pydicom():
    try:
        import pydicom
    except ImportError:
        raise DependencyError("DICOM output needs pydicom (pip install 'anonmri[dicom]')") from None
    return pydicom


@dataclass(frozen=True)
class DicomDeidentificationConfig:
    """How a DICOM series is de-identified on output."""

    #: AnonMRI method applied to the pixels (for (0012,0063)); see :mod:`~AnonMRILib.io.deidentification`
    method: str = "remodel"
    #: Patient's Name / Patient ID of the output; None: from the key (or random without one)
    pseudonym: Optional[str] = None
    #: secret of the keyed UID / pseudonym mapping (>= 16 bytes); None: a random key per run
    uid_key: Optional[bytes] = None
    #: further PS3.16 CID 7050 option codes applied by the caller (e.g. "113101")
    extra_codes: Tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.uid_key is not None and len(self.uid_key) < MIN_KEY_BYTES:
            raise InputError(f"the UID key must hold at least {MIN_KEY_BYTES} bytes")
        if self.pseudonym is not None and not (0 < len(self.pseudonym) <= 64 and self.pseudonym.isprintable()
                                               and "\\" not in self.pseudonym):
            raise InputError("the pseudonym must be 1-64 printable characters without a backslash")


def read_uid_key(path: PathLike) -> bytes:
    """The secret in the key file ``path`` (kept by the user; the same file gives the same UIDs)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such UID key file (create one with --new-uid-key)")
    key = path.read_bytes().strip()
    if len(key) < MIN_KEY_BYTES:
        raise InputError(f"{path}: a UID key file must hold at least {MIN_KEY_BYTES} bytes")
    return key


def new_uid_key(path: PathLike) -> Path:
    """Write a new random key (64 hex characters) to ``path``, readable by its owner only; never overwrites."""
    path = Path(path)
    if path.exists():
        raise InputError(f"{path}: exists; refusing to overwrite a UID key (it would break the mapping)")
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    return path


class UidMapper:
    """Old UID -> new ``2.25.`` UID by HMAC-SHA-256 under a key (deterministic for one key)."""

    def __init__(self, key: Optional[bytes] = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def digest(self, text: str, purpose: str = "uid") -> bytes:
        return hmac.new(self._key, f"{purpose}:{text}".encode("utf-8"), hashlib.sha256).digest()

    def __call__(self, uid: str, salt: str = "") -> str:
        uid = str(uid).strip().rstrip("\x00")
        return "2.25." + str(int.from_bytes(self.digest(f"{salt}|{uid}" if salt else uid)[:16], "big"))

    def pseudonym(self, patient_id: str) -> str:
        return "ANON-" + self.digest(str(patient_id), "patient").hex()[:12].upper()


def profile_actions() -> Tuple[Dict[Tuple[int, int], str], List[Tuple[Tuple[int, int, int, int], str]]]:
    """PS3.15 Table E.1-1 as (tag -> action, [(group, element, group mask, element mask), action])."""
    spec = importlib.util.find_spec("dicomanonymizer")
    if spec is None or not spec.submodule_search_locations:
        raise DependencyError("DICOM output needs the PS3.15 table of dicom-anonymizer "
                              "(pip install 'anonmri[dicom]'; Python >= 3.10)")
    path = Path(list(spec.submodule_search_locations)[0]) / "dicom_anonymization_databases" / f"{PROFILE_TABLE}.py"
    table_spec = importlib.util.spec_from_file_location(f"_anonmri_{PROFILE_TABLE}", str(path))
    module = importlib.util.module_from_spec(table_spec)
    table_spec.loader.exec_module(module)  # a data module: lists of tag tuples
    single: Dict[Tuple[int, int], str] = {}
    ranges: List[Tuple[Tuple[int, int, int, int], str]] = []
    for category, action in _CATEGORY_ACTIONS.items():
        for tag in getattr(module, category):
            if len(tag) == 2:
                single[(int(tag[0]), int(tag[1]))] = action
            else:
                ranges.append(((int(tag[0]), int(tag[1]), int(tag[2]), int(tag[3])), action))
    return single, ranges


def _dummy(vr: str, uid_map: UidMapper, old):
    """A non-empty placeholder of ``vr`` (action D)."""
    if vr == "UI":
        return _map_uids(old, uid_map)
    if vr == "DA":
        return "19000101"
    if vr == "TM":
        return "000000"
    if vr == "DT":
        return "19000101000000"
    if vr in ("US", "SS", "UL", "SL", "FL", "FD", "IS", "DS", "UV", "SV"):
        return 0
    if vr == "SQ":
        return []
    if vr in ("OB", "OW", "OF", "OD", "OL", "OV", "UN"):
        return b"\x00\x00"
    if vr == "AT":
        return 0
    if vr == "AS":
        return "000Y"
    return "ANONYMIZED"


def _map_uids(value, uid_map: UidMapper, salt: str = ""):
    if value is None or value == "":
        return value
    if isinstance(value, (list, tuple)) or type(value).__name__ == "MultiValue":
        return [uid_map(v, salt) for v in value]
    return uid_map(value, salt)


#: UIDs mapped from the old UID and the key only: one study, one frame of reference whatever the method
KEY_ONLY_UIDS = ((0x0020, 0x000D), (0x0020, 0x0052))


def _known_vr(tag) -> Optional[str]:
    """The data dictionary's VR of a standard ``tag`` (None when unknown: the element is then inspected)."""
    from pydicom.datadict import dictionary_VR

    try:
        return dictionary_VR(tag)
    except KeyError:
        return None


def deidentify_dataset(dataset, uid_map: UidMapper, actions=None, instance_salt: str = "") -> None:
    """Apply the Basic Profile's actions to ``dataset`` and every nested item, in place; remove private tags.

    New UIDs: Study Instance and Frame of Reference UIDs from the old UID and the key; every other UID
    also from ``instance_salt`` (the method), so that two different de-identifications of one image
    never share a SOP Instance or Series UID."""
    single, ranges = actions if actions is not None else profile_actions()

    def action_of(tag) -> Optional[str]:
        key = (tag.group, tag.element)
        if key in single:
            return single[key]
        for (group, element, group_mask, element_mask), action in ranges:
            if tag.group & group_mask == group & group_mask and tag.element & element_mask == element & element_mask:
                return action
        return None

    def visit(item) -> None:
        for tag in list(item.keys()):
            if tag.is_private or tag.group == 0x0000:  # private attributes; command elements never belong here
                del item[tag]
                continue
            action = action_of(tag)
            if action is None and _known_vr(tag) not in (None, "SQ"):
                continue  # a standard attribute outside the table and not a sequence: kept as it is
            if action == "X":
                del item[tag]
                continue
            known = _known_vr(tag)
            if action == "Z" and known is not None:  # emptied without decoding the old value
                vr = known.split(" or ")[0]
                item.add_new(tag, vr, [] if vr == "SQ" else None)
                continue
            element = item[tag]
            if action is None:
                if element.VR == "SQ":
                    for child in element.value:
                        visit(child)
                continue
            if action == "Z":
                element.value = [] if element.VR == "SQ" else None
            elif action == "D":
                element.value = _dummy(element.VR, uid_map, element.value) if element.VR != "UI" else \
                    _map_uids(element.value, uid_map, instance_salt)
            elif action == "U":
                salt = "" if (tag.group, tag.element) in KEY_ONLY_UIDS else instance_salt
                element.value = _map_uids(element.value, uid_map, salt)
            elif action == "ZU":  # X/Z/U*: keep the references, with new instance UIDs; empty anything else
                if element.VR == "UI":
                    element.value = _map_uids(element.value, uid_map, instance_salt)
                elif element.VR == "SQ":
                    for child in element.value:
                        visit(child)
                else:
                    element.value = None

    visit(dataset)


def dicom_method_description(method: str, codes: Sequence[Dict[str, str]]) -> List[str]:
    """(0012,0063) values (LO, at most 64 characters each): the AnonMRI method, then each code's meaning."""
    from .. import __version__

    return [f"AnonMRI {__version__} {method}"[:64]] + [code["CodeMeaning"][:64] for code in codes]


def dicom_series_files(folder: PathLike, series_uid: Optional[str] = None) -> List[Path]:
    """The files of the series :func:`~AnonMRILib.io.readers.load_volume` reads from ``folder`` (GDCM order)."""
    import SimpleITK as sitk

    from .readers import list_dicom_series

    series = list_dicom_series(folder)
    if not series:
        raise InputError(f"{folder}: a folder without a DICOM series")
    if series_uid is None:
        series_uid = max(series, key=lambda uid: series[uid])
    elif series_uid not in series:
        raise InputError(f"{folder}: no DICOM series with that UID ({len(series)} series found)")
    return [Path(p) for p in sitk.ImageSeriesReader.GetGDCMSeriesFileNames(str(folder), series_uid)]


def _float_attribute(dataset, keyword: str, default: float) -> float:
    value = dataset.get(keyword, None)
    return default if value in (None, "") else float(value)


def read_series_for_output(files: Sequence[Path], headers_only: bool = False):
    """The datasets of a series, checked to be writable back (single-frame, uncompressed, homogeneous)."""
    pydicom = _pydicom()
    datasets = []
    for path in files:
        try:
            dataset = pydicom.dcmread(str(path), stop_before_pixels=headers_only)
        except Exception as error:  # pydicom raises several types for broken files
            raise InputError(f"{path.name}: cannot be read as DICOM ({type(error).__name__})") from None
        datasets.append(dataset)
    first = datasets[0]
    for dataset in datasets:
        syntax = str(getattr(dataset.file_meta, "TransferSyntaxUID", "1.2.840.10008.1.2"))
        if syntax not in SUPPORTED_TRANSFER_SYNTAXES:
            raise InputError(f"transfer syntax {syntax} (compressed or big endian) is not supported for DICOM output; "
                             "decompress the series first (e.g. gdcmconv --raw) or write NIfTI")
        if int(dataset.get("NumberOfFrames", 1) or 1) > 1 or "PerFrameFunctionalGroupsSequence" in dataset:
            raise InputError("enhanced / multi-frame DICOM is not supported for DICOM output; convert it to "
                             "single-frame images (e.g. emf2sf) or write NIfTI")
        if str(dataset.get("BurnedInAnnotation", "NO")).upper() == "YES":
            raise InputError("the series has burned-in annotation (0028,0301 = YES); its pixel text would "
                             "need the Clean Pixel Data option, which AnonMRI does not do")
        for keyword in ("SOPClassUID", "Rows", "Columns", "BitsAllocated", "BitsStored", "PixelRepresentation",
                        "SamplesPerPixel"):
            if dataset.get(keyword) != first.get(keyword):
                raise InputError(f"mixed series: the slices differ in {keyword}; give a folder with one "
                                 "homogeneous series (or --series-uid)")
        if not np.allclose([float(v) for v in dataset.ImageOrientationPatient],
                           [float(v) for v in first.ImageOrientationPatient], atol=1e-4):
            raise InputError("mixed series: the slices differ in orientation")
    if int(first.SamplesPerPixel) != 1:
        raise InputError("only grey-scale DICOM (1 sample per pixel) can be written back")
    return datasets


def _slice_index(volume: Volume, dataset) -> int:
    """The volume's k index of ``dataset``'s slice, checked to lie on the volume's grid."""
    lps = np.array([float(v) for v in dataset.ImagePositionPatient] + [1.0])
    ijk = np.linalg.solve(volume.affine, LPS_TO_RAS @ lps)[:3]
    k = int(round(ijk[2]))
    if np.abs(ijk[:2]).max() > 1e-2 or abs(ijk[2] - k) > 1e-2 or not 0 <= k < volume.shape[2]:
        raise InputError("the volume does not lie on the DICOM series' grid (slice positions differ)")
    orientation = np.array([float(v) for v in dataset.ImageOrientationPatient]).reshape(2, 3)
    ras = orientation * np.array([-1.0, -1.0, 1.0])
    if not np.allclose(ras, volume.direction[:, :2].T, atol=1e-3):
        raise InputError("the volume does not lie on the DICOM series' grid (orientation differs)")
    return k


def stored_values(values: np.ndarray, dataset) -> np.ndarray:
    """Volume values of one slice -> the slice's stored integers (inverse rescale, rounded, clipped to
    BitsStored in the series' pixel representation)."""
    slope = _float_attribute(dataset, "RescaleSlope", 1.0)
    intercept = _float_attribute(dataset, "RescaleIntercept", 0.0)
    bits = int(dataset.BitsStored)
    signed = int(dataset.PixelRepresentation) == 1
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    stored = np.rint((values.astype(np.float64) - intercept) / slope)
    dtype = np.dtype(f"{'i' if signed else 'u'}{int(dataset.BitsAllocated) // 8}")
    return np.clip(stored, low, high).astype(dtype)


def check_dicom_output(source_folder: PathLike, series_uid: Optional[str] = None) -> int:
    """Refuse, before any work, a series that cannot be written back as DICOM; returns its number of files."""
    profile_actions()  # the table is there
    return len(read_series_for_output(dicom_series_files(source_folder, series_uid), headers_only=True))


def write_dicom_series(volume: Volume, source_folder: PathLike, out_folder: PathLike,
                       config: DicomDeidentificationConfig = DicomDeidentificationConfig(),
                       series_uid: Optional[str] = None, progress: Optional[Callable] = None) -> List[Path]:
    """Write ``volume`` (on the grid of the series read from ``source_folder``) as a de-identified DICOM
    series into the existing folder ``out_folder``: one file per input slice, named IM00001.dcm, ...
    Not atomic by itself: use :meth:`~AnonMRILib.io.writers.OutputTransaction.add_folder`."""
    pydicom = _pydicom()
    from pydicom.dataset import FileMetaDataset
    from pydicom.sequence import Sequence as DicomSequence

    files = dicom_series_files(source_folder, series_uid)
    datasets = read_series_for_output(files)
    actions = profile_actions()
    uid_map = UidMapper(config.uid_key)
    pseudonym = config.pseudonym
    if pseudonym is None:
        original_id = str(datasets[0].get("PatientID", ""))
        pseudonym = uid_map.pseudonym(original_id) if config.uid_key is not None and original_id else \
            "ANON-" + secrets.token_hex(6).upper()
    codes = method_codes(config.extra_codes)
    description = dicom_method_description(config.method, codes)
    out_folder = Path(out_folder)
    written = []
    for number, dataset in enumerate(datasets, start=1):
        k = _slice_index(volume, dataset)
        pixels = stored_values(volume.array[:, :, k].T, dataset)  # [row, column] = [j, i]
        syntax = str(getattr(dataset.file_meta, "TransferSyntaxUID", "1.2.840.10008.1.2"))
        deidentify_dataset(dataset, uid_map, actions, instance_salt=config.method)
        for keyword in ("SmallestImagePixelValue", "LargestImagePixelValue", "SmallestPixelValueInSeries",
                        "LargestPixelValueInSeries"):
            if keyword in dataset:
                del dataset[keyword]
        dataset.PatientName = pseudonym
        dataset.PatientID = pseudonym
        dataset.PatientIdentityRemoved = "YES"
        dataset.DeidentificationMethod = description
        items = []
        for code in codes:
            item = pydicom.Dataset()
            item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = (
                code["CodeValue"], code["CodingSchemeDesignator"], code["CodeMeaning"])
            items.append(item)
        dataset.DeidentificationMethodCodeSequence = DicomSequence(items)
        dataset.RecognizableVisualFeatures = "NO"
        dataset.LongitudinalTemporalInformationModified = "REMOVED"
        image_type = list(dataset.get("ImageType", ["ORIGINAL", "PRIMARY"]))
        dataset.ImageType = ["DERIVED", "SECONDARY"] + image_type[2:]
        dataset.PixelData = pixels.tobytes()
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = dataset.SOPClassUID
        meta.MediaStorageSOPInstanceUID = dataset.SOPInstanceUID
        meta.TransferSyntaxUID = syntax
        dataset.file_meta = meta
        path = out_folder / f"IM{number:05d}.dcm"
        dataset.save_as(str(path), enforce_file_format=True)
        written.append(path)
        if progress is not None:
            progress(number / len(datasets), "writing DICOM")
    return written
