"""One face treatment for every contrast: the T1's de-identified face reaches a moved T2-like image, whose
brain voxels stay its own."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.io import Volume
from AnonMRILib.pipelines.baselines import deface
from AnonMRILib.pipelines.multicontrast import carry_face_with_details, contrast_table, apply_table

from dicom_fixtures import small_sample
from multicontrast_fixtures import t2_like


@pytest.fixture(scope="module")
def session():
    t1, brain = small_sample(step=2)  # 3 mm
    t2, truth = t2_like(t1, spacing_factor=1.2)
    return t1, brain, t2, truth


def test_registration_recovers_the_motion_and_the_face_is_carried(session):
    t1, brain, t2, truth = session
    t1_out = deface(t1, "black", brain_mask=brain)
    t2_out, details = carry_face_with_details(t1, t1_out, brain, t2)
    # the registered transform maps T2 points where the true one does (within 1.5 mm over the head's box)
    corners = [t2.world_coordinates(np.array([[i, j, k]]))[0] * [-1, -1, 1]
               for i in (0, t2.shape[0] - 1) for j in (0, t2.shape[1] - 1) for k in (0, t2.shape[2] - 1)]
    transform = details["transform"]
    errors = [np.linalg.norm(np.subtract(transform.TransformPoint(tuple(p)), truth.TransformPoint(tuple(p))))
              for p in corners]
    assert max(errors) < 1.5, errors
    # brain voxels exact (carried mask), the face region changed to the T2's air level
    kept = details["brain_mask"].array != 0
    assert np.array_equal(t2_out.array[kept], t2.array[kept]) and t2_out.dtype == t2.dtype
    changed = t2_out.array != t2.array
    assert details["treated_fraction"] > 0.05 and changed.mean() > 0.05
    air = float(np.median(t2.array[t2.array < np.percentile(t2.array, 30)]))
    assert abs(float(np.median(t2_out.array[changed])) - air) < 60
    # same inputs, same output bit for bit (one-thread registration)
    again, _ = carry_face_with_details(t1, t1_out, brain, t2)
    assert np.array_equal(again.array, t2_out.array)


def test_contrast_table_maps_monotone_and_reversed_contrasts():
    rng = np.random.default_rng(0)
    source = rng.uniform(0, 100, 5000)
    edges, table = contrast_table(source, 1000 - 5 * source, bins=32)
    mapped = apply_table(np.array([5.0, 50.0, 95.0]), edges, table)
    assert np.all(np.abs(mapped - (1000 - 5 * np.array([5.0, 50.0, 95.0]))) < 20)


def test_other_contrast_masks_and_grids_are_checked(session):
    t1, brain, t2, _ = session
    with pytest.raises(InputError, match="grid|shape"):
        carry_face_with_details(t1, t1, brain, t2, other_brain=Volume(brain.array, brain.affine))
    with pytest.raises(InputError, match="constant"):
        carry_face_with_details(t1, t1, brain, t2.with_array(np.zeros(t2.shape, np.int16)))


def test_cli_apply_to_writes_every_contrast_or_none(session, tmp_path):
    from AnonMRILib.cli.main import main
    from AnonMRILib.io import load_volume, save_volume

    t1, brain, t2, _ = session
    paths = {name: save_volume(v, tmp_path / f"{name}.nii.gz") for name, v in
             (("t1", t1), ("brain", brain), ("t2", t2))}
    out, t2_out = tmp_path / "o" / "t1_out.nii.gz", tmp_path / "o" / "t2_out.nii.gz"
    argv = ["deface", str(paths["t1"]), str(out), "--method", "black", "--brain-mask", str(paths["brain"]),
            "--no-before-after", "--quiet", "--apply-to", str(paths["t2"]), str(t2_out)]
    assert main(argv + ["--bids-sidecar"]) == 0
    written = load_volume(t2_out)
    assert written.same_grid(t2) and written.dtype == t2.dtype and not np.array_equal(written.array, t2.array)
    assert (tmp_path / "o" / "t2_out.json").is_file()
    # an --apply-to image that is not a head: nothing at all is written
    noise = save_volume(Volume(np.random.default_rng(0).normal(0, 1, (64, 64, 64)).astype(np.float32), np.eye(4)),
                        tmp_path / "noise.nii.gz")
    argv[argv.index(str(paths["t2"]))] = str(noise)
    argv[argv.index(str(out))] = str(tmp_path / "p" / "t1.nii.gz")
    argv[argv.index(str(t2_out))] = str(tmp_path / "p" / "t2.nii.gz")
    assert main(argv) == 2 and not (tmp_path / "p").exists()
