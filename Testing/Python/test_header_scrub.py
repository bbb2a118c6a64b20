"""No output header carries identifying text planted in an input's header fields."""
import gzip
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

from AnonMRILib.io import load_volume, save_volume

from synthetic_volumes import synthetic_head
from test_io import FORMATS, write_dicom_series

SECRETS = {
    "descrip": b"DOE^JOHN MRN0042",
    "aux_file": b"JDOE_aux",
    "intent_name": b"JDOE_int",
    "db_name": b"JDOE_db_name",
}
EXTENSION_SECRET = b"PatientName=DOE^JOHN BirthDate=19470101"
NRRD_SECRET = "PatientID 555-12-3456"
DICOM_TAGS = {
    "0010|0010": "DOE^JANE",            # PatientName
    "0010|0020": "PID7788990",          # PatientID
    "0010|0030": "19510203",            # PatientBirthDate
    "0008|0080": "Saint Example Hospital",  # InstitutionName
    "0008|1030": "HeadStudyXYZ",        # StudyDescription
    "0008|0090": "DR^WHO",              # ReferringPhysicianName
}


def all_secrets():
    secrets = [value.decode() for value in SECRETS.values()]
    secrets += [EXTENSION_SECRET.decode(), NRRD_SECRET] + list(DICOM_TAGS.values())
    return secrets


def planted_nifti(path: Path):
    volume = synthetic_head()
    image = nib.Nifti1Image(volume.array, volume.affine)
    for field, value in SECRETS.items():
        image.header[field] = value
    image.header.extensions.append(nib.nifti1.Nifti1Extension(6, EXTENSION_SECRET))
    nib.save(image, str(path))
    raw = gzip.decompress(path.read_bytes())
    for secret in list(SECRETS.values()) + [EXTENSION_SECRET]:
        assert secret in raw  # the plant took
    return path


def planted_nrrd(path: Path):
    from AnonMRILib.io.writers import numpy_to_simpleitk

    volume = synthetic_head()
    image = numpy_to_simpleitk(volume.array, volume.affine)
    image.SetMetaData("PatientID", NRRD_SECRET)
    sitk.WriteImage(image, str(path))
    assert NRRD_SECRET.encode() in path.read_bytes()
    return path


def planted_dicom(folder: Path):
    volume = synthetic_head(shape=(12, 14, 6))
    volume = type(volume)(volume.array, np.diag([1.0, 1.0, 2.0, 1.0]))
    write_dicom_series(folder, volume, "1.2.826.0.1.3680043.2.1125.4242", DICOM_TAGS)
    first = sorted(folder.iterdir())[0].read_bytes()
    assert b"DOE^JANE" in first and b"PID7788990" in first
    return folder


def output_bytes(path: Path) -> bytes:
    """Every byte of an output as stored, decompressed where the format compresses."""
    data = path.read_bytes()
    if path.name.endswith((".gz", ".mgz")):
        data += gzip.decompress(data)
    sidecar = [p for p in path.parent.iterdir() if p != path and p.stem == path.name.split(".")[0]]
    for extra in sidecar:
        data += extra.read_bytes()
    return data


@pytest.mark.parametrize("planter,name", [(planted_nifti, "in.nii.gz"), (planted_nrrd, "in.nrrd"),
                                          (planted_dicom, "dicom")])
@pytest.mark.parametrize("suffix", FORMATS)
def test_no_planted_text_reaches_any_output(tmp_path, planter, name, suffix):
    source = planter(tmp_path / name)
    volume = load_volume(source)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    written = save_volume(volume.with_array(volume.array), out_dir / f"result{suffix}", like=volume,
                          protect=[source])
    data = output_bytes(written)
    for secret in all_secrets():
        assert secret.encode() not in data, f"{secret!r} leaked into {written.name}"
    if suffix in (".nii", ".nii.gz"):
        header = nib.load(str(written)).header
        for field in SECRETS:
            assert header[field].item() in (b"", "")
        assert len(header.extensions) == 0


def test_loaded_volume_holds_no_header_text(tmp_path):
    volume = load_volume(planted_nifti(tmp_path / "in.nii.gz"))
    assert set(vars(volume)) == {"array", "affine"}
