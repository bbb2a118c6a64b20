"""BraTS2020 loader on a miniature in the real layout, synthetic lesion slices, anonymity criterion."""
import csv

import numpy as np
import pytest

from AnonMRILib.datasets.brats import find_brats_cases, load_brats_slices, load_case_slices, read_grades
from AnonMRILib.datasets.slices import LesionSliceSet, normalize_intensity, patient_split
from AnonMRILib.errors import InputError

SHAPE = (24, 24, 10)


def write_miniature(root, grades=("HGG", "LGG", "HGG", "LGG", "HGG"), skip_seg_of=None):
    import nibabel as nib

    rng = np.random.default_rng(0)
    with open(root / "name_mapping.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Grade", "BraTS_2017_subject_ID", "BraTS_2018_subject_ID", "TCGA_TCIA_subject_ID",
                         "BraTS_2019_subject_ID", "BraTS_2020_subject_ID"])
        for number, grade in enumerate(grades, start=1):
            writer.writerow([grade, "NA", "NA", "NA", "NA", f"BraTS20_Training_{number:03d}"])
    for number, grade in enumerate(grades, start=1):
        case = f"BraTS20_Training_{number:03d}"
        folder = root / case
        folder.mkdir()
        brain = np.zeros(SHAPE, np.float32)
        brain[4:20, 4:20, 1:9] = 1
        seg = np.zeros(SHAPE, np.uint8)
        seg[8:12, 8:12, 3:6] = 1
        seg[12:14, 8:12, 3:6] = 4 if grade == "HGG" else 2
        for modality, scale in (("t1", 500), ("t1ce", 700), ("t2", 900), ("flair", 300)):
            data = (brain * (scale + rng.normal(0, 10, SHAPE)) + seg * 100 * number).astype(np.int16)
            nib.save(nib.Nifti1Image(data, np.diag([-1.0, -1.0, 1.0, 1.0])), str(folder / f"{case}_{modality}.nii.gz"))
        if number != skip_seg_of:
            nib.save(nib.Nifti1Image(seg, np.diag([-1.0, -1.0, 1.0, 1.0])), str(folder / f"{case}_seg.nii.gz"))
    (root / "not_a_case").mkdir()


def test_brats_miniature_cases_grades_slices_and_patient_split(tmp_path):
    write_miniature(tmp_path, skip_seg_of=5)
    assert read_grades(tmp_path / "name_mapping.csv")["BraTS20_Training_002"] == 0
    cases = find_brats_cases(tmp_path)
    assert [c.case_id for c in cases] == [f"BraTS20_Training_{n:03d}" for n in range(1, 5)]  # 005 lacks seg
    assert [c.grade for c in cases] == [1, 0, 1, 0]
    slices = load_case_slices(cases[0], modality="flair")
    assert slices.images.shape == (8, 24, 24) and slices.images.max() <= 1.0 and slices.images.min() >= 0.0
    assert slices.masks.sum() == 6 * 4 * 3 and set(slices.patients.tolist()) == {1}
    assert np.allclose(slices.depths, np.arange(1, 9) / 9.0)
    lesion_only = load_case_slices(cases[1], modality="t1ce", lesion_only=True, image_size=16)
    assert lesion_only.images.shape == (3, 16, 16) and lesion_only.masks.reshape(3, -1).any(1).all()
    everything = load_brats_slices(cases, modality="t2")
    train, test = patient_split(everything.patients, (0.5, 0.5), seed=1)
    assert set(train) | set(test) == {1, 2, 3, 4} and not set(train) & set(test)
    assert len(everything.of_patients(train)) + len(everything.of_patients(test)) == len(everything)
    with pytest.raises(InputError, match="modality"):
        load_case_slices(cases[0], modality="dwi")
    with pytest.raises(InputError, match="no BraTS20"):
        find_brats_cases(tmp_path / "not_a_case")


def test_slice_set_save_load_and_normalization(tmp_path):
    rng = np.random.default_rng(0)
    s = LesionSliceSet(rng.random((4, 8, 8)), rng.random((4, 8, 8)) > 0.5, [0, 1, 0, 1], [0, 0.3, 0.6, 1], [1, 1, 2, 2])
    s.save(tmp_path / "s.npz")
    loaded = LesionSliceSet.load(tmp_path / "s.npz")
    assert np.array_equal(loaded.images, s.images) and np.array_equal(loaded.patients, s.patients)
    assert len(s.of_patients([2])) == 2 and s.resized(16).images.shape == (4, 16, 16)
    normalized = normalize_intensity(np.array([0.0, 10.0, 20.0, 1000.0]))
    assert normalized[0] == 0.0 and normalized[-1] == 1.0


def ball_head(radii=(1.0, 1.0, 1.0), name="ball"):
    """A synthetic base head: an ellipsoidal 'brain' with a striped texture, 2.5 mm voxels."""
    from AnonMRILib.datasets.synthetic_lesions import prepare_base_head
    from AnonMRILib.io import Volume

    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in (60, 70, 60)], indexing="ij"))
    brain = sum((g / r) ** 2 for g, r in zip(grid, radii)) < 0.7
    image = np.where(brain, 1.0 + 0.2 * np.sin(8 * grid[0]), 0.0)
    return prepare_base_head(Volume(image, np.diag([2.5, 2.5, 2.5, 1.0])), brain, name=name)


def test_synthetic_lesion_slices_are_deterministic_and_graded():
    from AnonMRILib.datasets.synthetic_lesions import BRATS_LABELS, SyntheticLesionConfig, make_synthetic_lesion_slices

    head = ball_head()
    config = SyntheticLesionConfig(image_size=32, num_patients=3, lesion_slices_per_patient=4,
                                   healthy_slices_per_patient=1, hgg_fraction=0.5)
    a = make_synthetic_lesion_slices([head], config, seed=7)
    b = make_synthetic_lesion_slices([head], config, seed=7)
    c = make_synthetic_lesion_slices([head], config, seed=8)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.masks, b.masks)
    assert not np.array_equal(a.images, c.images) if a.images.shape == c.images.shape else True
    assert a.images.shape[1:] == (32, 32) and 0 <= a.images.min() and a.images.max() <= 1
    assert a.masks.any() and set(np.unique(a.patients)) == {0, 1, 2}
    assert set(np.unique(a.grades)) <= {0, 1} and np.all((a.depths >= 0) & (a.depths <= 1))
    assert set(BRATS_LABELS.values()) == {1, 2, 4}


def test_coregistration_puts_every_head_at_one_brain_size_and_level():
    from AnonMRILib.datasets.synthetic_lesions import (BRAIN_TOP_ABOVE_CENTRE_MM, FIELD_OF_VIEW_MM, NUM_AXIAL_SLICES,
                                                       SubjectVariationConfig, brain_box_mm, coregistration_target_mm,
                                                       head_frame, synthesize_patient)

    heads = [ball_head((0.8, 1.0, 0.9), "small"), ball_head((1.0, 1.2, 1.1), "large")]
    target = coregistration_target_mm(heads)
    widths = [np.subtract(*brain_box_mm(h)[::-1]) for h in heads]
    assert np.allclose(target, (widths[0][:2] + widths[1][:2]) / 2)
    still = SubjectVariationConfig(rotation_deg=(0, 0, 0), scale_range=(1, 1), displacement_mm=0, fine_displacement_mm=0,
                                   gamma_range=(1, 1), bias=0, contrast_knot_shift=0)
    pixel = FIELD_OF_VIEW_MM / 48
    for head in heads:
        _, _, brain = synthesize_patient(head, np.random.default_rng(0), 48, 0, still, head_frame(head, target))
        rows, columns, levels = (np.flatnonzero(brain.any(axis=axes)) for axes in ((1, 2), (0, 2), (0, 1)))
        assert abs((rows[-1] - rows[0] + 1) * pixel - target[0]) <= 2 * pixel
        assert abs((columns[-1] - columns[0] + 1) * pixel - target[1]) <= 2 * pixel
        assert abs(levels[-1] - ((NUM_AXIAL_SLICES - 1) / 2 + BRAIN_TOP_ABOVE_CENTRE_MM)) <= 2
        _, _, unregistered = synthesize_patient(head, np.random.default_rng(0), 48, 0, still)
        assert abs(np.flatnonzero(unregistered.any(axis=(0, 1)))[-1] - levels[-1]) > 3  # the frame moved


def test_subject_variation_config_checks_and_monotone_contrast():
    from AnonMRILib.datasets.synthetic_lesions import SubjectVariationConfig, _contrast_curve

    for bad in ({"scale_range": (1.1, 0.9)}, {"gamma_range": (0, 1)}, {"fine_displacement_mm": -1},
                {"contrast_knot_shift": 0.1}):
        with pytest.raises(ValueError):
            SubjectVariationConfig(**bad)
    values = np.linspace(0, 1.3, 200)
    for seed in range(20):
        curve = _contrast_curve(np.random.default_rng(seed), values, 0.08)
        assert np.all(np.diff(curve) > 0) and curve[0] == 0
        assert np.allclose(curve[values >= 1], values[values >= 1])
        assert np.abs(curve - values).max() <= 0.08 + 1e-9


def test_make_lesion_slices_workers_give_the_same_data(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "Training"))
    from make_lesion_slices import make_slices

    from AnonMRILib.datasets.synthetic_lesions import SyntheticLesionConfig

    heads = [ball_head((0.8, 1.0, 0.9), "small"), ball_head((1.0, 1.2, 1.1), "large")]
    config = SyntheticLesionConfig(image_size=24, num_patients=3, lesion_slices_per_patient=2, healthy_slices_per_patient=1)
    one, two = make_slices(heads, config, seed=3, workers=1), make_slices(heads, config, seed=3, workers=2)
    assert np.array_equal(one.images, two.images) and np.array_equal(one.patients, two.patients)
    assert set(one.patients.tolist()) == {0, 1, 2}


def test_anonymity_criterion_formula_and_paper_threshold():
    from AnonMRILib.evaluation.anonymity import DEFAULT_THRESHOLD_DB, anonymity_score, is_anonymized, threshold_db

    # paper (eq. 21-23): Anony = 20 log10(MSE(x^, x_j) / MSE(x^, x_i)) < 20 log10(p / (1 - p)) = 7.36 for p = 0.7
    assert 20 * np.log10(0.7 / 0.3) == pytest.approx(7.36, abs=0.005)
    assert 2 * DEFAULT_THRESHOLD_DB == pytest.approx(7.36, abs=0.005) and threshold_db(0.7) == DEFAULT_THRESHOLD_DB
    original = np.zeros((8, 8))
    other = np.ones((8, 8))
    for ratio in (1.0, 2.0, 2.5, 4.0):
        # anonymized = a x^ with MSE(x^, x_i) = a^2 and MSE(x^, x_j) = (1 - a)^2 -> ratio = ((1 - a) / a)^2
        a = 1.0 / (1.0 + np.sqrt(ratio))
        anonymized = np.full((8, 8), a)
        score = anonymity_score(anonymized, original, other)
        assert 2 * score == pytest.approx(20 * np.log10(ratio), abs=1e-9)
        assert is_anonymized(score) == (ratio <= 0.7 / 0.3)
