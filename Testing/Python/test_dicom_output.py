"""DICOM in -> DICOM out under PS3.15: no planted identifying byte survives, the de-identification codes are
there, UIDs are new (and keyed), geometry and brain voxels are the input's; unsupported series are refused."""
import shutil

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom")
pytest.importorskip("dicomanonymizer")

from AnonMRILib.cli.main import main  # noqa: E402
from AnonMRILib.errors import InputError  # noqa: E402
from AnonMRILib.io import load_volume, save_volume  # noqa: E402
from AnonMRILib.io.dicom_writer import UidMapper, stored_values  # noqa: E402

from dicom_fixtures import PLANTED_UID_ROOT, small_sample, write_planted_series  # noqa: E402

UID_KEYWORDS = ("StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "FrameOfReferenceUID")


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """A 35-slice MR series of the sample head (7.5 mm voxels), every 4th slice with the whole profile planted,
    and its brain mask as NIfTI."""
    folder = tmp_path_factory.mktemp("dicom")
    head, mask = small_sample(step=5)
    tokens = write_planted_series(head, folder / "in", profile_every=4)
    mask_path = save_volume(mask, folder / "brain_mask.nii.gz")
    return folder / "in", mask_path, tokens


@pytest.fixture(scope="module")
def plain_series(tmp_path_factory, series):
    """The same head with only the patient, UID and private attributes planted (for the faster tests)."""
    folder = tmp_path_factory.mktemp("dicom_plain")
    head, _ = small_sample(step=5)
    tokens = write_planted_series(head, folder / "in", plant_profile=False)
    return folder / "in", series[1], tokens


def deface_black(source, out, mask, *extra):
    return main(["deface", str(source), str(out), "--method", "black", "--brain-mask", str(mask),
                 "--no-before-after", "--quiet", *extra])


def read_all(folder):
    return [pydicom.dcmread(str(path)) for path in sorted(folder.iterdir())]


def test_dicom_out_leaks_no_planted_byte_and_says_how_it_was_deidentified(series, tmp_path):
    source, mask_path, tokens = series
    out = tmp_path / "nested" / "out"
    assert deface_black(source, out, mask_path, "--pseudonym", "SUBJ-007") == 0
    files = sorted(out.iterdir())
    assert len(files) == len(list(source.iterdir())) and all(p.name.startswith("IM") for p in files)
    leaks = {token for path in files for token in tokens if token.encode() in path.read_bytes()}
    assert not leaks, sorted(leaks)[:10]
    originals = read_all(source)
    outputs = read_all(out)
    for dataset in outputs:
        assert dataset.PatientIdentityRemoved == "YES" and dataset.RecognizableVisualFeatures == "NO"
        codes = [(item.CodeValue, item.CodingSchemeDesignator) for item in dataset.DeidentificationMethodCodeSequence]
        assert codes == [("113100", "DCM"), ("113102", "DCM")]
        assert "black" in dataset.DeidentificationMethod[0]
        assert str(dataset.PatientName) == "SUBJ-007" and dataset.PatientID == "SUBJ-007"
        assert not any(element.tag.is_private for element in dataset.iterall())
        assert all(not value for value in (dataset.get("StudyDate"), dataset.get("InstitutionName")))
        assert dataset.file_meta.MediaStorageSOPInstanceUID == dataset.SOPInstanceUID
        assert "SourceApplicationEntityTitle" not in dataset.file_meta
    # new UIDs: none of the input's, one study/series/frame of reference, one SOP per file
    for keyword in UID_KEYWORDS:
        old = {str(d.get(keyword)) for d in originals}
        new = {str(d.get(keyword)) for d in outputs}
        assert not old & new and all(u.startswith("2.25.") and len(u) <= 64 for u in new)
        assert len(new) == (len(outputs) if keyword == "SOPInstanceUID" else 1)
    # geometry and pixel representation: SimpleITK (load_volume) and pydicom agree with the input
    head, written = load_volume(source), load_volume(out)
    assert written.shape == head.shape and np.allclose(written.affine, head.affine, atol=1e-4)
    assert written.dtype == head.dtype
    brain = load_volume(mask_path).array != 0
    assert np.array_equal(written.array[brain], head.array[brain])
    assert not np.array_equal(written.array, head.array)  # the black method did change the non-brain voxels
    by_position = {tuple(np.round(d.ImagePositionPatient, 3)): d for d in originals}
    for dataset in outputs:
        original = by_position[tuple(np.round(dataset.ImagePositionPatient, 3))]
        assert list(dataset.ImageOrientationPatient) == list(original.ImageOrientationPatient)
        assert list(dataset.PixelSpacing) == list(original.PixelSpacing)
        for keyword in ("Rows", "Columns", "BitsAllocated", "BitsStored", "PixelRepresentation"):
            assert dataset.get(keyword) == original.get(keyword)


def test_keyed_uids_keep_a_study_together_across_runs(plain_series, tmp_path):
    source, mask_path, _ = plain_series
    key = tmp_path / "secret.key"
    assert deface_black(source, tmp_path / "a", mask_path, "--new-uid-key", str(key)) == 0
    assert key.stat().st_mode & 0o077 == 0
    assert deface_black(source, tmp_path / "b", mask_path, "--uid-key", str(key)) == 0
    assert deface_black(source, tmp_path / "c", mask_path) == 0  # random key
    first, again, random = (read_all(tmp_path / name)[0] for name in "abc")
    for keyword in UID_KEYWORDS:
        assert first.get(keyword) == again.get(keyword) and first.get(keyword) != random.get(keyword)
    assert first.PatientID == again.PatientID != random.PatientID
    # a second series of the same study: same study and frame of reference, its own series
    other = tmp_path / "other"
    head, _ = small_sample(step=5)
    write_planted_series(head, other, series_uid=f"{PLANTED_UID_ROOT}.1.77", plant_profile=False)
    assert deface_black(other, tmp_path / "d", mask_path, "--uid-key", str(key)) == 0
    second = read_all(tmp_path / "d")[0]
    assert second.StudyInstanceUID == first.StudyInstanceUID
    assert second.FrameOfReferenceUID == first.FrameOfReferenceUID
    assert second.SeriesInstanceUID != first.SeriesInstanceUID
    assert deface_black(source, tmp_path / "e", mask_path, "--new-uid-key", str(key)) == 2  # never overwritten
    # another method on the same series with the same key: same study, but its own series and instances
    assert main(["deface", str(source), str(tmp_path / "f"), "--method", "skullstrip", "--brain-mask", str(mask_path),
                 "--no-before-after", "--quiet", "--uid-key", str(key)]) == 0
    other_method = read_all(tmp_path / "f")[0]
    assert other_method.StudyInstanceUID == first.StudyInstanceUID
    assert other_method.FrameOfReferenceUID == first.FrameOfReferenceUID
    assert other_method.SeriesInstanceUID != first.SeriesInstanceUID
    assert other_method.SOPInstanceUID != first.SOPInstanceUID


def test_unsupported_series_are_refused_before_any_output(plain_series, tmp_path, capsys):
    from pydicom.uid import RLELossless

    source, mask_path, _ = plain_series
    cases = {}
    for case in ("compressed", "multiframe", "mixed", "burned_in"):
        folder = tmp_path / case
        shutil.copytree(source, folder)
        path = sorted(folder.iterdir())[3]
        dataset = pydicom.dcmread(str(path))
        if case == "compressed":
            del dataset[0x50003000]  # an implicit-VR 'OB or OW' curve element cannot be re-encoded explicitly
            dataset.compress(RLELossless)
        elif case == "multiframe":
            dataset.NumberOfFrames = 2
        elif case == "mixed":
            dataset.PixelRepresentation = 0
        else:
            dataset.BurnedInAnnotation = "YES"
        dataset.save_as(str(path))
        cases[case] = folder
    messages = {"compressed": "transfer syntax", "multiframe": "multi-frame", "mixed": "mixed series",
                 "burned_in": "burned-in"}
    for case, folder in cases.items():
        out = tmp_path / f"out_{case}"
        capsys.readouterr()
        assert deface_black(folder, out, mask_path) == 2, case
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and messages[case] in error[0], (case, error)
        assert not out.exists()
    # DICOM-only options with an image output are refused too
    assert deface_black(source, tmp_path / "x.nii.gz", mask_path, "--pseudonym", "P") == 2


def test_stored_values_invert_each_slice_rescale():
    dataset = pydicom.Dataset()
    dataset.RescaleSlope, dataset.RescaleIntercept = 2.0, -100.0
    dataset.BitsStored, dataset.BitsAllocated, dataset.PixelRepresentation = 12, 16, 0
    stored = np.array([[0, 7, 4095]], np.uint16)
    values = stored * 2.0 - 100.0
    assert np.array_equal(stored_values(values, dataset), stored)
    assert stored_values(np.array([[-1e6, 1e6]]), dataset).tolist() == [[0, 4095]]  # clipped to 12 bits


def test_uid_mapper_is_keyed_and_valid():
    key = b"k" * 32
    a, b = UidMapper(key), UidMapper(key)
    assert a("1.2.3") == b("1.2.3") != a("1.2.4") and UidMapper(b"j" * 32)("1.2.3") != a("1.2.3")
    assert len(a("1.2.3")) <= 64 and all(part.isdigit() for part in a("1.2.3").split("."))
    from AnonMRILib.io.dicom_writer import DicomDeidentificationConfig

    with pytest.raises(InputError):
        DicomDeidentificationConfig(uid_key=b"short")


def test_remodel_dicom_dir_to_dicom_dir_with_the_shipped_weights(plain_series, tmp_path):
    """The issue's command: ``anonmri remodel DICOM_DIR OUT_DIR`` (shipped CP-GAN weights, the user's brain mask)."""
    source, mask_path, tokens = plain_series
    out = tmp_path / "remodeled"
    assert main(["remodel", str(source), str(out), "--brain-mask", str(mask_path), "--device", "cpu", "--rotations", "2",
                 "--quiet"]) == 0
    head, written = load_volume(source), load_volume(out)
    assert np.allclose(written.affine, head.affine, atol=1e-4) and written.dtype == head.dtype
    brain = load_volume(mask_path).array != 0
    assert np.array_equal(written.array[brain], head.array[brain]) and not np.array_equal(written.array, head.array)
    dataset = read_all(out)[0]
    assert [item.CodeValue for item in dataset.DeidentificationMethodCodeSequence] == ["113100", "113102"]
    assert "remodel" in dataset.DeidentificationMethod[0] and dataset.RecognizableVisualFeatures == "NO"
    assert not str(dataset.StudyInstanceUID).startswith(PLANTED_UID_ROOT)
    assert not {token for path in out.iterdir() for token in tokens if token.encode() in path.read_bytes()}


def test_a_dicom_series_slice_thickness_reaches_the_anatomical_prior(series, tmp_path, monkeypatch):
    """5 mm slices every 7.5 mm: the series' SliceThickness (read from its header, that tag alone)
    is the slab REFACE and CP-GAN's prior average over, unless --slice-thickness says otherwise."""
    import AnonMRILib.pipelines.baselines as baselines
    from AnonMRILib.io.readers import dicom_slice_thickness

    head, _ = small_sample(step=5)
    folder = tmp_path / "gapped"
    write_planted_series(head, folder, plant_profile=False, slice_thickness=5.0)
    assert dicom_slice_thickness(folder) == 5.0
    assert dicom_slice_thickness(series[0]) == pytest.approx(head.spacing[2])
    assert dicom_slice_thickness(tmp_path / "no_such_folder") is None
    seen = []

    def fake_deface(volume, method, brain_mask=None, config=None, **kwargs):
        seen.append(config)
        return volume

    monkeypatch.setattr(baselines, "deface", fake_deface)
    args = ["deface", str(folder), str(tmp_path / "out.nii.gz"), "--method", "reface", "--brain-mask", str(series[1]),
            "--output-format", "image", "--no-before-after", "--quiet"]
    assert main(args) == 0 and seen[-1].slice_thickness_mm == 5.0
    assert main(args + ["--slice-thickness", "6"]) == 0 and seen[-1].slice_thickness_mm == 6.0
