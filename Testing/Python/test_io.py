"""Volume, readers and writers: formats, geometry, dtype handling, atomicity, refusals."""
import os
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

from AnonMRILib.errors import InputError
from AnonMRILib.io import Volume, cast_to_dtype, load_volume, save_volume
from AnonMRILib.io.readers import list_dicom_series

from synthetic_volumes import synthetic_head

FORMATS = [".nii", ".nii.gz", ".mgz", ".nrrd", ".nhdr", ".mha", ".mhd"]


def test_volume_derives_geometry_from_affine(head):
    assert np.allclose(head.spacing, [1.5, 1.2, 1.4])
    assert np.allclose(np.linalg.norm(head.direction, axis=0), 1.0)
    assert np.allclose(head.direction @ np.diag(head.spacing), head.affine[:3, :3])
    assert np.allclose(head.origin, [-30.0, -25.5, -20.25])
    assert np.allclose(head.world_coordinates([[0, 0, 0], [1, 0, 0]])[1] - head.origin,
                       head.affine[:3, 0])
    assert not hasattr(head, "__dict__") or "spacing" not in vars(head)


def test_volume_refuses_non_3d_and_singular_affine():
    with pytest.raises(InputError):
        Volume(np.zeros((4, 4)), np.eye(4))
    with pytest.raises(InputError):
        Volume(np.zeros((4, 4, 4, 2)), np.eye(4))
    with pytest.raises(InputError):
        Volume(np.zeros((4, 4, 4)), np.diag([1.0, 0.0, 1.0, 1.0]))


@pytest.mark.parametrize("suffix", FORMATS)
def test_round_trip_keeps_voxels_geometry_and_dtype(tmp_path, head, suffix):
    path = save_volume(head, tmp_path / f"head{suffix}")
    loaded = load_volume(path)
    assert loaded.dtype == head.dtype
    assert np.array_equal(loaded.array, head.array)
    assert np.allclose(loaded.affine, head.affine, atol=1e-4)


def test_float_results_are_rounded_and_clipped_to_the_input_type(tmp_path, head):
    values = head.array.astype(np.float32) + 0.6
    values[0, 0, 0] = 1e9
    values[0, 0, 1] = -1e9
    out = save_volume(head.with_array(values), tmp_path / "out.nii.gz", like=head)
    loaded = load_volume(out).array
    assert loaded.dtype == np.int16
    assert loaded[0, 0, 0] == np.iinfo(np.int16).max and loaded[0, 0, 1] == np.iinfo(np.int16).min
    assert np.array_equal(loaded[1:], np.rint(values[1:]).astype(np.int16))
    assert cast_to_dtype(np.array([2.5, 3.5, -0.4]), np.uint8).tolist() == [2, 4, 0]


def test_save_refuses_to_overwrite_the_input_and_leaves_it_untouched(tmp_path, head):
    source = save_volume(head, tmp_path / "in.nii.gz")
    before = source.read_bytes()
    with pytest.raises(InputError, match="overwrite the input"):
        save_volume(head, source, protect=[source])
    with pytest.raises(InputError, match="overwrite the input"):
        save_volume(head, tmp_path / "." / "in.nii.gz", protect=[str(source)])
    assert source.read_bytes() == before


def test_save_refuses_unknown_format_and_creates_missing_folders(tmp_path, head):
    with pytest.raises(InputError, match="unknown output format"):
        save_volume(head, tmp_path / "out.png")
    written = save_volume(head, tmp_path / "missing" / "deeper" / "out.nii.gz")
    assert np.array_equal(load_volume(written).array, head.array)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is not a folder"):
        save_volume(head, tmp_path / "file" / "out.nii.gz")


def test_output_transaction_writes_all_or_nothing(tmp_path, head):
    from AnonMRILib.io.writers import OutputTransaction

    target = tmp_path / "new" / "folder"
    with pytest.raises(RuntimeError):
        with OutputTransaction() as outputs:
            outputs.add_volume(head, target / "a.nii.gz")
            outputs.add_volume(head, target / "b.nhdr")
            outputs.add_file(target / "c.txt", lambda path: path.write_text("c"))
            raise RuntimeError("the figure failed after the volumes were written")
    assert not (tmp_path / "new").exists()  # nothing, not even the folders made for the outputs
    with OutputTransaction() as outputs:
        outputs.add_volume(head, target / "a.nii.gz")
        outputs.add_volume(head, target / "b.nhdr")
        outputs.add_folder(target / "series", lambda folder: (folder / "1.dcm").write_bytes(b"x"))
        outputs.add_file(target / "c.txt", lambda path: path.write_text("c"))
    assert sorted(p.name for p in target.iterdir()) == ["a.nii.gz", "b.nhdr", "b.raw", "c.txt", "series"]
    assert np.array_equal(load_volume(target / "b.nhdr").array, head.array)
    assert (target / "series" / "1.dcm").read_bytes() == b"x"
    with pytest.raises(InputError, match="not empty"):
        OutputTransaction().add_folder(target / "series", lambda folder: None)


def test_save_is_atomic_no_partial_file_on_failure(tmp_path, head, monkeypatch):
    import nibabel

    def broken(*args, **kwargs):
        Path(args[1] if len(args) > 1 else kwargs["filename"]).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(nibabel.Nifti1Image, "to_filename", lambda self, name: broken(self, name))
    with pytest.raises(OSError):
        save_volume(head, tmp_path / "out.nii.gz")
    assert os.listdir(tmp_path) == []


def test_four_d_with_one_volume_is_squeezed_others_refused(tmp_path, head):
    nib.save(nib.Nifti1Image(head.array[..., None], head.affine), tmp_path / "one.nii.gz")
    assert load_volume(tmp_path / "one.nii.gz").shape == head.shape
    nib.save(nib.Nifti1Image(np.stack([head.array] * 3, -1), head.affine), tmp_path / "three.nii.gz")
    with pytest.raises(InputError, match="3 volumes"):
        load_volume(tmp_path / "three.nii.gz")


def test_two_d_empty_and_garbage_files_are_refused(tmp_path):
    nib.save(nib.Nifti1Image(np.ones((10, 12), np.int16), np.eye(4)), tmp_path / "flat.nii.gz")
    with pytest.raises(InputError, match="2-D"):
        load_volume(tmp_path / "flat.nii.gz")
    nib.save(nib.Nifti1Image(np.ones((10, 12, 1), np.int16), np.eye(4)), tmp_path / "slice.nii.gz")
    with pytest.raises(InputError, match="2-D"):
        load_volume(tmp_path / "slice.nii.gz")
    (tmp_path / "junk.nii.gz").write_bytes(b"this is not an image")
    with pytest.raises(InputError, match="cannot be read"):
        load_volume(tmp_path / "junk.nii.gz")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match="not a supported image"):
        load_volume(tmp_path / "notes.txt")
    with pytest.raises(InputError, match="no such file"):
        load_volume(tmp_path / "absent.nii.gz")
    with pytest.raises(InputError, match="without a DICOM series"):
        load_volume(tmp_path)


def test_world_axis_matches_world_coordinates_of_every_voxel(head):
    small = Volume(np.asarray(head.array)[:5, :6, :7].copy(), head.affine)
    indices = np.argwhere(np.ones(small.shape, bool))
    expected = small.world_coordinates(indices)
    for axis in range(3):
        assert np.allclose(small.world_axis(axis).ravel(), expected[:, axis], atol=1e-3)


def test_simpleitk_lps_geometry_is_converted_to_ras(tmp_path, head):
    path = save_volume(head, tmp_path / "head.nrrd")
    image = sitk.ReadImage(str(path))
    # the same physical point: voxel (2, 3, 4) in ITK's LPS equals our RAS with x, y negated
    lps = np.array(image.TransformIndexToPhysicalPoint((2, 3, 4)))
    ras = head.world_coordinates([[2, 3, 4]])[0]
    assert np.allclose(lps * [-1, -1, 1], ras, atol=1e-4)
    assert sitk.GetArrayFromImage(image)[4, 3, 2] == head.array[2, 3, 4]


def write_dicom_series(folder: Path, volume: Volume, series_uid: str, tags: dict) -> None:
    from AnonMRILib.io.writers import numpy_to_simpleitk

    folder.mkdir(parents=True, exist_ok=True)
    image = numpy_to_simpleitk(volume.array.astype(np.int16), volume.affine)
    writer = sitk.ImageFileWriter()
    writer.KeepOriginalImageUIDOn()
    for k in range(image.GetDepth()):
        slice_image = image[:, :, k]
        for tag, value in tags.items():
            slice_image.SetMetaData(tag, value)
        slice_image.SetMetaData("0020|000e", series_uid)
        slice_image.SetMetaData("0020|0013", str(k + 1))
        slice_image.SetMetaData("0020|0032", "\\".join(map(str, image.TransformIndexToPhysicalPoint((0, 0, k)))))
        d = image.GetDirection()
        slice_image.SetMetaData("0020|0037", "\\".join(map(str, (d[0], d[3], d[6], d[1], d[4], d[7]))))
        slice_image.SetMetaData("0008|0060", "MR")
        writer.SetFileName(str(folder / f"{series_uid[-4:]}_{k:03d}.dcm"))
        writer.Execute(slice_image)


def test_dicom_folder_picks_the_largest_series_or_the_requested_one(tmp_path):
    big = synthetic_head(shape=(16, 18, 12), spacing=(1.0, 1.0, 2.0))
    small = synthetic_head(shape=(16, 18, 6), spacing=(1.0, 1.0, 2.0), seed=3)
    big = Volume(big.array, np.diag([1.0, 1.0, 2.0, 1.0]))
    small = Volume(small.array, np.diag([1.0, 1.0, 2.0, 1.0]))
    write_dicom_series(tmp_path, big, "1.2.826.0.1.3680043.2.1125.1111", {})
    write_dicom_series(tmp_path, small, "1.2.826.0.1.3680043.2.1125.2222", {})
    assert sorted(list_dicom_series(tmp_path).values()) == [6, 12]
    loaded = load_volume(tmp_path)
    assert loaded.shape == (16, 18, 12)
    assert np.array_equal(loaded.array, big.array)
    assert np.allclose(loaded.spacing, [1.0, 1.0, 2.0], atol=1e-4)
    chosen = load_volume(tmp_path, series_uid="1.2.826.0.1.3680043.2.1125.2222")
    assert np.array_equal(chosen.array, small.array)
    with pytest.raises(InputError, match="no DICOM series with that UID"):
        load_volume(tmp_path, series_uid="9.9.9")
