"""Generated population (determinism, rigid brain, consistent masks, splits) and real-folder loaders."""
import numpy as np
import pytest

from AnonMRILib.datasets.population import (HeadSource, PopulationConfig, generate_population, generate_scan,
                                            parse_subject_id, scan_id, split_by_head, split_scan_ids,
                                            split_subjects, subject_id, subject_variation)
from AnonMRILib.datasets.t1_folders import find_t1w_images, group_by_patient, split_by_patient
from AnonMRILib.errors import InputError
from AnonMRILib.io import Volume

SPACING = 4.0


def synthetic_head(name: str = "synth") -> HeadSource:
    """A 4 mm ellipsoid head (scalp 1.0, skull 0.2, brain 0.6) with a nose, RAS, brain mask."""
    shape = (40, 48, 48)
    affine = np.diag([SPACING, SPACING, SPACING, 1.0])
    affine[:3, 3] = -np.asarray(shape) * SPACING / 2
    ijk = np.indices(shape).astype(np.float64)
    world = np.einsum("ab,bxyz->axyz", affine[:3, :3], ijk) + affine[:3, 3, None, None, None]
    x, y, z = world
    head = (x / 70) ** 2 + (y / 90) ** 2 + (z / 85) ** 2 < 1
    skull = (x / 62) ** 2 + (y / 82) ** 2 + (z / 77) ** 2 < 1
    brain = (x / 55) ** 2 + ((y + 5) / 72) ** 2 + ((z - 15) / 55) ** 2 < 1
    nose = (x / 10) ** 2 + ((y - 92) / 14) ** 2 + ((z + 10) / 20) ** 2 < 1
    image = np.where(head | nose, 1.0, 0.0)
    image = np.where(skull, 0.2, image)
    image = np.where(brain, 0.6, image).astype(np.float32) * 1000
    return HeadSource(name, Volume(image, affine), Volume(brain.astype(np.uint8), affine))


@pytest.fixture(scope="module")
def head():
    return synthetic_head()


def test_ids_round_trip():
    assert subject_id("mni305", 7) == "mni305-s0007"
    assert scan_id("mni305", 7, 1) == "mni305-s0007-scan01"
    assert parse_subject_id("mni305-s0007-scan01") == ("mni305", 7)
    assert parse_subject_id("robex_atlas-s0012") == ("robex_atlas", 12)
    with pytest.raises(InputError):
        parse_subject_id("not-an-id")
    with pytest.raises(InputError):
        HeadSource("bad-name", synthetic_head().volume, synthetic_head().brain_mask)


def test_same_seed_same_scan_and_different_subjects_differ(head):
    config = PopulationConfig(seed=3)
    a = generate_scan(head, 1, 0, config)
    b = generate_scan(head, 1, 0, config)
    assert np.array_equal(a.volume.array, b.volume.array)
    assert np.array_equal(a.brain_mask.array, b.brain_mask.array)
    other_subject = generate_scan(head, 2, 0, config)
    other_seed = generate_scan(head, 1, 0, PopulationConfig(seed=4))
    assert not np.array_equal(a.volume.array, other_subject.volume.array)
    assert not np.array_equal(a.volume.array, other_seed.volume.array)
    assert a.volume.same_grid(head.volume) and a.volume.dtype == np.float32
    assert a.scan_id == "synth-s0001-scan00"


def test_displacement_is_zero_on_and_near_the_brain_and_nonzero_on_the_face(head):
    config = PopulationConfig(seed=0)
    variation = subject_variation(head, 0, config)
    brain = head.brain_mask.array != 0
    magnitude = np.linalg.norm(variation.displacement_voxels, axis=0)
    assert np.all(magnitude[brain] == 0)
    face = head.volume.array > 900  # scalp and nose
    assert magnitude[face].max() * SPACING > 0.5


def test_without_pose_change_the_brain_is_rigid_and_the_face_changes(head):
    config = PopulationConfig(seed=1, scan_rotation_deg=0.0, scan_translation_mm=0.0)
    scan = generate_scan(head, 0, 0, config)
    assert np.array_equal(scan.brain_mask.array, head.brain_mask.array)
    outside = (head.brain_mask.array == 0) & (head.volume.array > 0)
    assert np.mean(np.abs(scan.volume.array[outside] - head.volume.array[outside]) > 100) > 0.01


def test_mask_follows_the_image_under_pose_changes(head):
    config = PopulationConfig(seed=2, scan_rotation_deg=4.0, scan_translation_mm=6.0, noise_fraction=0.0,
                              bias_amplitude=0.0, gamma_range=(1.0, 1.0), scale_range=(1.0, 1.0),
                              scan_intensity_jitter=0.0)
    scan = generate_scan(head, 0, 1, config)
    mask = scan.brain_mask.array != 0
    assert not np.array_equal(mask, head.brain_mask.array != 0)  # it moved
    assert abs(int(mask.sum()) - int((head.brain_mask.array != 0).sum())) < 0.05 * mask.sum()
    # the brain intensity (600) is what lies under the moved mask
    inside = scan.volume.array[mask]
    assert np.median(inside) == pytest.approx(600, rel=0.05)
    assert np.mean(np.abs(inside - 600) < 60) > 0.9


def test_population_and_subject_level_splits(head):
    config = PopulationConfig(subjects_per_head=3, scans_per_subject=2, seed=0)
    scans = list(generate_population([head], config, subject_indices=[0, 1, 2]))
    assert len(scans) == 6
    ids = [s.scan_id for s in scans]
    assert len(set(ids)) == 6
    train, test = split_scan_ids(ids + ["other-s0000-scan00", "other-s0001-scan00"], 0.4, seed=5)
    train_subjects = {parse_subject_id(i) for i in train}
    test_subjects = {parse_subject_id(i) for i in test}
    assert train and test and not (train_subjects & test_subjects)
    assert (train, test) == split_scan_ids(ids + ["other-s0000-scan00", "other-s0001-scan00"], 0.4, seed=5)

    subjects = [subject_id("h", i) for i in range(20)]
    tr, te = split_subjects(subjects, 0.25, seed=1)
    assert len(te) == 5 and not set(tr) & set(te) and set(tr) | set(te) == set(subjects)
    assert split_subjects(subjects, 0.25, seed=2) != (tr, te)
    by_head_train, by_head_test = split_by_head(ids + ["other-s0000-scan00"], ["other"])
    assert by_head_test == ["other-s0000-scan00"] and len(by_head_train) == 6


def _touch_nifti(path, value: int = 1) -> None:
    import nibabel as nib

    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(np.full((4, 4, 4), value, np.int16), np.eye(4)), str(path))


def test_bids_tree_split_by_patient(tmp_path):
    root = tmp_path / "oasis3"
    for subject, sessions in (("OAS30001", ("d0129", "d0757")), ("OAS30002", ("d0371",)),
                              ("OAS30003", ("d0001", "d0002")), ("OAS30004", ("d0010",))):
        for session in sessions:
            _touch_nifti(root / f"sub-{subject}" / f"ses-{session}" / "anat" /
                         f"sub-{subject}_ses-{session}_run-01_T1w.nii.gz")
            _touch_nifti(root / f"sub-{subject}" / f"ses-{session}" / "anat" /
                         f"sub-{subject}_ses-{session}_T2w.nii.gz")
    _touch_nifti(root / "derivatives" / "x" / "sub-OAS30001" / "anat" / "sub-OAS30001_T1w.nii.gz")
    records = find_t1w_images(root)
    assert len(records) == 6
    assert {r.patient for r in records} == {"sub-OAS30001", "sub-OAS30002", "sub-OAS30003", "sub-OAS30004"}
    assert group_by_patient(records)["sub-OAS30001"][1].session == "ses-d0757"
    train, test = split_by_patient(records, 0.25, seed=0)
    assert len(train) + len(test) == 6 and test
    assert not {r.patient for r in train} & {r.patient for r in test}
    assert (train, test) == split_by_patient(records, 0.25, seed=0)
    assert records[0].load().shape == (4, 4, 4)


def test_adni_and_flat_folders(tmp_path):
    adni = tmp_path / "ADNI"
    _touch_nifti(adni / "002_S_0295" / "MPRAGE" / "2006-04-18_08_20_30.0" / "I13722" / "scan.nii")
    _touch_nifti(adni / "002_S_0295" / "MPRAGE" / "2007-05-01_08_00_00.0" / "I50000" / "scan.nii")
    _touch_nifti(adni / "011_S_0002" / "MPRAGE" / "2005-09-08_09_00_00.0" / "I7025" / "scan.nii.gz")
    records = find_t1w_images(adni)
    assert [r.patient for r in records] == ["002_S_0295", "002_S_0295", "011_S_0002"]
    train, test = split_by_patient(records, 0.5, seed=0)
    assert len({r.patient for r in test}) == 1 and not {r.patient for r in train} & {r.patient for r in test}

    flat = tmp_path / "flat"
    _touch_nifti(flat / "patient_a.nii.gz")
    _touch_nifti(flat / "patient_b.nii")
    assert [r.patient for r in find_t1w_images(flat)] == ["patient_a", "patient_b"]
    with pytest.raises(InputError):
        find_t1w_images(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError):
        find_t1w_images(tmp_path / "empty")


# --- face-shaped identities (MakeHuman targets) -----------------------------------------------
def test_face_targets_pair_opposites_and_weights_are_deterministic():
    from AnonMRILib.datasets.face_shape import load_face_shape_model, random_target_weights, target_pairs

    model = load_face_shape_model()
    names = model.target_names
    assert {"nose-hump-incr", "chin-prominent-decr", "l-ear-lobe-incr", "forehead-temple-decr"} <= set(names)
    pairs = target_pairs(names)
    by_name = {(names[a] if a >= 0 else None, names[b]) for a, b in pairs}
    assert ("nose-hump-decr", "nose-hump-incr") in by_name and ("nose-trans-down", "nose-trans-up") in by_name
    assert sorted(i for pair in pairs for i in pair if i >= 0) == list(range(len(names)))  # each target once
    weights = random_target_weights(model, np.random.default_rng(5), 0.5)
    assert np.array_equal(weights, random_target_weights(model, np.random.default_rng(5), 0.5))
    assert np.all(weights >= 0) and np.all(weights <= 1)
    for a, b in pairs:  # one side of a pair at a time
        assert a < 0 or weights[a] == 0 or weights[b] == 0
    nose = model.displacement(np.array([n == "nose-scale-depth-incr" for n in names], dtype=float))
    moved = np.linalg.norm(nose, axis=1) > 0.5
    # the nose moves, in front of the face (mesh +z = front), nothing far behind it
    assert moved.any() and model.vertices[moved, 2].min() > 80.0


def test_face_shape_identity_moves_the_face_only(head):
    config = PopulationConfig(seed=0, face_shape_amplitude=0.5)
    plain = subject_variation(head, 0, PopulationConfig(seed=0))
    shaped = subject_variation(head, 0, config)
    other = subject_variation(head, 1, config)
    difference = np.linalg.norm(shaped.displacement_voxels - plain.displacement_voxels, axis=0) * SPACING
    brain = head.brain_mask.array != 0
    assert np.all(difference[brain] == 0)  # exactly zero on the brain
    anterior = head.volume.world_axis(1)
    assert difference[anterior > 60.0].max() > 1.0  # the face and nose (the head reaches A = 90 mm)
    # most of the change is in front (face targets; forehead targets also reach the crown)
    assert np.sum(difference * anterior) / np.sum(difference) > 10.0  # measured: 17 mm
    assert not np.allclose(shaped.displacement_voxels, other.displacement_voxels)
    assert shaped.contrast_exponent == plain.contrast_exponent  # its own random stream
