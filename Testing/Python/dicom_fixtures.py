"""A small MR DICOM series built from the embedded sample head, with identifying values planted in every
attribute of DICOM PS3.15 Table E.1-1 and in private tags (for the DICOM output tests)."""
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from AnonMRILib.io import Volume, load_volume
from AnonMRILib.io.readers import LPS_TO_RAS
from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path

#: every planted text contains this; planted UIDs start with PLANTED_UID_ROOT
MARK = "PLNT"
PLANTED_UID_ROOT = "1.2.826.0.1.3680043.10.999"
MR_IMAGE_STORAGE = "1.2.840.10008.5.1.4.1.1.4"


def small_sample(step: int = 2) -> Tuple[Volume, Volume]:
    """The sample head and its brain mask decimated by ``step`` (3 mm voxels for step 2)."""
    head, mask = load_volume(sample_head_path()), load_volume(sample_brain_mask_path())
    affine = head.affine @ np.diag([step, step, step, 1.0])
    return (Volume(np.ascontiguousarray(head.array[::step, ::step, ::step]), affine),
            Volume(np.ascontiguousarray(mask.array[::step, ::step, ::step]), affine))


def _planted_value(vr: str, number: int, tokens: List[str]):
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    vr = vr.split(" or ")[0]
    text = f"{MARK}{number:04d}"
    if vr == "UI":
        uid = f"{PLANTED_UID_ROOT}.{number}"
        tokens.append(uid)
        return uid
    if vr == "DA":
        return "20200229"
    if vr == "TM":
        return "131415"
    if vr == "DT":
        return "20200229131415"
    if vr in ("US", "SS", "UL", "SL", "FL", "FD", "UV", "SV"):
        return 4321
    if vr in ("IS", "DS"):
        return "4321"
    if vr == "AT":
        return None
    if vr in ("OB", "OW", "OF", "OD", "OL", "OV", "UN"):
        tokens.append(text)
        return text.encode()
    if vr == "SQ":
        item = Dataset()
        item.PatientName = f"{text}^SEQ"
        item.add_new(0x00091010, "LO", f"{text}PRIV")
        tokens.append(text)
        return Sequence([item])
    if vr == "AS":
        return "042Y"
    if vr == "CS":
        tokens.append(f"PLNT{number:04d}")
        return f"PLNT{number:04d}"
    tokens.append(text)
    return text if vr != "PN" else f"{text}^GIVEN"


def planted_attributes() -> Tuple[Dict[int, Tuple[str, object]], List[str]]:
    """tag -> (VR, value) for every single-tag attribute of the Basic Profile table, and the text tokens."""
    from pydicom.datadict import dictionary_VR

    from AnonMRILib.io.dicom_writer import profile_actions

    single, _ = profile_actions()
    planted, tokens = {}, []
    for number, (group, element) in enumerate(sorted(single)):
        if group in (0x0000, 0x0002, 0xFFFA, 0xFFFC) or group & 1:
            continue
        tag = (group << 16) | element
        try:
            vr = dictionary_VR(tag)
        except KeyError:
            continue
        value = _planted_value(vr, number, tokens)
        if value is not None:
            planted[tag] = (vr.split(" or ")[0], value)
    return planted, tokens


def write_planted_series(volume: Volume, folder: Path, study_uid: str = f"{PLANTED_UID_ROOT}.1.1",
                         series_uid: str = f"{PLANTED_UID_ROOT}.1.2", frame_uid: str = f"{PLANTED_UID_ROOT}.1.3",
                         slope: float = 1.0, intercept: float = 0.0, plant_profile: bool = True,
                         profile_every: int = 1, slice_thickness: Optional[float] = None) -> List[str]:
    """Write ``volume`` (int16 values) as an Implicit-VR MR series into ``folder``; returns the planted tokens.
    ``plant_profile=False`` plants only the patient, institution, UID and private attributes (faster);
    ``profile_every=n`` plants the whole profile table in every n-th slice only; ``slice_thickness``
    (mm): the SliceThickness written (default: the slice spacing)."""
    import pydicom
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ImplicitVRLittleEndian

    folder.mkdir(parents=True, exist_ok=True)
    planted, tokens = planted_attributes() if plant_profile else ({}, [])
    tokens += [study_uid, series_uid, frame_uid, "Doe^Jane", "PID-123456789", "St Elsewhere Hospital"]
    lps = LPS_TO_RAS @ volume.affine
    spacing = volume.spacing
    direction = lps[:3, :3] / spacing
    stored = np.rint((volume.array.astype(np.float64) - intercept) / slope).astype(np.int16)
    for k in range(volume.shape[2]):
        dataset = Dataset()
        for tag, (vr, value) in (planted.items() if k % profile_every == 0 else ()):
            dataset.add_new(tag, vr, value)
        # private tags, a private creator and a curve/overlay group with identifying text
        dataset.add_new(0x00290010, "LO", "SIEMENS CSA HEADER")
        dataset.add_new(0x00291010, "OB", b"PLNTPRIVATE0")
        dataset.add_new(0x00190010, "LO", f"{MARK}CREATOR")
        dataset.add_new(0x50000010, "US", 7)
        dataset.add_new(0x50003000, "OB", b"PLNTCURVE000")
        tokens += [f"{MARK}CREATOR"]
        dataset.PatientName = "Doe^Jane"
        dataset.PatientID = "PID-123456789"
        dataset.InstitutionName = "St Elsewhere Hospital"
        dataset.SOPClassUID = MR_IMAGE_STORAGE
        sop_uid = f"{PLANTED_UID_ROOT}.2.{k + 1}"
        tokens.append(sop_uid)
        dataset.SOPInstanceUID = sop_uid
        dataset.StudyInstanceUID = study_uid
        dataset.SeriesInstanceUID = series_uid
        dataset.FrameOfReferenceUID = frame_uid
        dataset.Modality = "MR"
        dataset.ImageType = ["ORIGINAL", "PRIMARY", "M"]
        dataset.InstanceNumber = k + 1
        dataset.ImagePositionPatient = [float(v) for v in (lps @ np.array([0, 0, k, 1.0]))[:3]]
        dataset.ImageOrientationPatient = [float(v) for v in np.concatenate([direction[:, 0], direction[:, 1]])]
        dataset.PixelSpacing = [float(spacing[1]), float(spacing[0])]  # row spacing (j), column spacing (i)
        dataset.SliceThickness = float(spacing[2] if slice_thickness is None else slice_thickness)
        dataset.Rows, dataset.Columns = volume.shape[1], volume.shape[0]
        dataset.SamplesPerPixel = 1
        dataset.PhotometricInterpretation = "MONOCHROME2"
        dataset.BitsAllocated, dataset.BitsStored, dataset.HighBit = 16, 16, 15
        dataset.PixelRepresentation = 1
        dataset.RescaleSlope, dataset.RescaleIntercept = slope, intercept
        dataset.BurnedInAnnotation = "NO"
        dataset.PixelData = np.ascontiguousarray(stored[:, :, k].T).tobytes()
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = MR_IMAGE_STORAGE
        meta.MediaStorageSOPInstanceUID = sop_uid
        meta.TransferSyntaxUID = ImplicitVRLittleEndian
        meta.SourceApplicationEntityTitle = "PLNTAET"
        dataset.file_meta = meta
        pydicom.dcmwrite(str(folder / f"{MARK}_slice_{k:03d}.dcm"), dataset, enforce_file_format=True)
    tokens.append("PLNTAET")
    return sorted(set(tokens))
