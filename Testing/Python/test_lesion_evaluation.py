"""Training/evaluate_lesion.py: a tiny configuration end to end, and the segmentation utility model learns."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from lesion_fixtures import save_tiny_weights
from test_lesion_training import tiny_data

TRAINING = Path(__file__).resolve().parents[2] / "Training"
sys.path.insert(0, str(TRAINING))


def test_evaluate_lesion_tiny_end_to_end(tmp_path):
    import evaluate_lesion

    data, weights, out = tmp_path / "slices.npz", tmp_path / "weights", tmp_path / "report"
    tiny_data(data)
    data.with_suffix(".json").write_text(json.dumps({"heads": ["a", "b", "c", "d"]}))  # data card: 4 base heads
    weights.mkdir()
    save_tiny_weights(weights)
    assert evaluate_lesion.main([
        "--data", str(data), "--weights", str(weights), "--out", str(out), "--steps", "2", "--candidates", "3",
        "--parts", "reconstruction,anonymity,utility", "--utility-patients", "4",
        "--segmentation-steps", "2", "--classification-steps", "2", "--threads", "1"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["setup"]["test_patients"] >= 1 and results["setup"]["train_patients"] >= 4
    assert set(results["reconstruction"]) >= {"background", "lesion", "whole"}
    rows = {row["method"]: row for row in results["anonymity"]["rows"]}
    assert {"latent diffusion (ours)", "latent diffusion + exact lesion", "latent diffusion, plain sampling (1 draw)",
            "reference: random training patient + x_i's lesion", "gaussian_blur", "noise_0.5"} <= set(rows)
    assert results["anonymity"]["candidates"] == 3
    for row in rows.values():
        assert row["median_area_ratio"] >= 0.0 and 0.0 <= row["fraction_area_below_60"] <= 1.0
    assert rows["horizontal_flip"]["median_area_ratio"] == 1.0 and rows["horizontal_flip"]["median_brightness_ratio"] == 1.0
    for row in rows.values():  # realism guard next to every anonymity rate
        assert 0.0 <= row["rate_anonymized_and_realistic"] <= min(row["rate_random"], row["fraction_realistic"])
        assert "median_volume_sharpness_ratio" in row and "fraction_sharpness_ok" in row
    assert rows["horizontal_flip"]["median_sharpness_ratio"] == 1.0 and rows["gaussian_blur"]["median_sharpness_ratio"] < 0.8
    assert rows["gaussian_blur"]["rate_anonymized_and_realistic"] == 0.0
    heads = results["anonymity"]["head_analysis"]
    assert set(heads) == set(rows) - {"latent diffusion + exact lesion", "gaussian_blur", "horizontal_flip",
                                      "crop_resize", "noise_0.1", "noise_0.5"}
    for analysis in heads.values():
        assert 0.0 <= analysis["nearest_head_is_own"] <= 1.0 and len(analysis["nearest_head_histogram"]) == 4
        assert analysis["fraction_x_j_same_head"] + analysis["fraction_x_j_other_head"] == 1.0
    for row in rows.values():
        for rule in ("random", "nearest_to_original", "nearest_to_anonymized"):
            assert 0.0 <= row[f"rate_{rule}"] <= 1.0
    assert results["anonymity"]["exact_lesion_bit_exact"] is True
    utility = results["utility"]
    assert [row["set"] for row in utility["rows"]] == [
        "real", "anonymized", "anonymized + exact lesion", "mixed (half real + half anonymized)", "half real"]
    assert utility["segmentation_learning_rate"] == evaluate_lesion.SEGMENTATION_LEARNING_RATE
    report = (out / "README.md").read_text()
    assert "Table 7 analogue" in report and "Tables 4 and 5 analogues" in report and "Adam lr 0.003" in report
    assert "of 3 background draws, the typical one least like x_i" in report and "Failure analysis by base head" in report
    assert "anonymized and realistic" in report
    assert (out / "anonymity_rates.png").is_file() and (out / "examples.png").is_file()


def test_population_reference_pastes_the_lesion_into_a_training_patients_slice():
    import evaluate_lesion

    from AnonMRILib.datasets.slices import LesionSliceSet

    train = LesionSliceSet(np.stack([np.full((4, 4), v, np.float32) for v in (0.1, 0.2, 0.3, 0.4)]),
                           np.zeros((4, 4, 4), bool), np.zeros(4, int), np.array([0.1, 0.9, 0.1, 0.9]),
                           np.array([0, 0, 1, 1]))
    mask = np.zeros((1, 4, 4), bool)
    mask[0, 1, 1] = True
    test = LesionSliceSet(np.ones((1, 4, 4), np.float32), mask, np.zeros(1, int), np.array([0.8]), np.array([5]))
    out = evaluate_lesion.population_reference(train, test, seed=0)
    assert out[0, 1, 1] == 1.0  # the test slice's lesion
    assert set(np.unique(out[0][~mask[0]]).tolist()) <= {np.float32(0.2), np.float32(0.4)}  # a deep training slice


def _separable_lesions(n: int, size: int, side: int, every: int, seed: int = 0):
    """(images, masks): noise slices, every ``every``-th with a bright ``side`` x ``side`` lesion somewhere."""
    rng = np.random.default_rng(seed)
    images = rng.normal(0.3, 0.05, (n, size, size)).astype(np.float32)
    masks = np.zeros((n, size, size), np.uint8)
    for i in range(0, n, every):
        r, c = rng.integers(4, size - side - 4, 2)
        masks[i, r:r + side, c:c + side] = 1
    images[masks > 0] += 0.5
    return images, masks


def test_segmentation_utility_model_learns_a_separable_lesion():
    """The paper path's segmenter (whole 64 x 64-style slices, uniform batches) converges on a small,
    imbalanced task (lesions ~3 % of pixels; ~1.5 % in the generated data) within a CPU-sized budget."""
    import dataclasses

    import torch

    from AnonMRILib.evaluation.tumour_segmentation import PAPER_PATH_SEGMENTER, train_tumour_segmenter, tumour_iou

    torch.set_num_threads(1)
    images, masks = _separable_lesions(64, 32, 8, 2)
    model = train_tumour_segmenter(images[:48], masks[:48], dataclasses.replace(PAPER_PATH_SEGMENTER, steps=300), 0)
    scores = tumour_iou(model, images[48:], masks[48:])
    assert scores["iou_tumour"] > 0.5, scores


def test_crop_trained_segmenter_finds_rare_small_lesions_on_whole_slices():
    """The population's segmenter: crops, half of them centred on tumour, scored on whole slices of
    a side that is not a multiple of its stride. Lesions on one slice in eight, 0.4 % of its pixels:
    uniform whole-slice batches stay at the all-background solution in the same budget, the
    tumour-weighted crops learn them."""
    import torch

    from AnonMRILib.evaluation.tumour_segmentation import (PAPER_PATH_SEGMENTER, TumourSegmenterConfig,
                                                           train_tumour_segmenter, tumour_iou)

    torch.set_num_threads(1)
    images, masks = _separable_lesions(96, 60, 4, 8, seed=1)
    train, test = slice(0, 64), slice(64, 96)
    config = TumourSegmenterConfig(channels=(8, 16, 32), strides=(2, 2), crop=32, steps=150, batch=16)
    weighted = tumour_iou(train_tumour_segmenter(images[train], masks[train], config, 0), images[test], masks[test])
    uniform_config = TumourSegmenterConfig(channels=(8, 16, 32), strides=(2, 2), crop=None, tumour_fraction=0.0,
                                           norm=PAPER_PATH_SEGMENTER.norm, steps=150, batch=16)
    uniform = tumour_iou(train_tumour_segmenter(images[train], masks[train], uniform_config, 0), images[test],
                         masks[test])
    assert weighted["iou_tumour"] > 0.5, weighted
    assert uniform["iou_tumour"] < weighted["iou_tumour"] - 0.2, (uniform, weighted)


def test_segmenter_crops_are_centred_on_tumour_at_the_configured_share():
    """The batch sampler: with tumour_fraction 1 every crop holds tumour; with 0 they fall anywhere."""
    from AnonMRILib.evaluation.tumour_segmentation import TumourSegmenterConfig, _batch_index

    _, masks = _separable_lesions(40, 60, 4, 8, seed=2)
    tumour_slices = np.flatnonzero(masks.reshape(40, -1).any(1))
    rng = np.random.default_rng(0)
    config = TumourSegmenterConfig(crop=32, tumour_fraction=1.0, batch=64)
    index, rows, cols = _batch_index(masks > 0, config, rng, tumour_slices)
    assert all(masks[i, r:r + 32, c:c + 32].any() for i, r, c in zip(index, rows, cols))
    assert rows.min() >= 0 and rows.max() <= 60 - 32 and cols.max() <= 60 - 32
    index, rows, cols = _batch_index(masks > 0, TumourSegmenterConfig(crop=32, tumour_fraction=0.0, batch=64), rng,
                                     tumour_slices)
    assert np.mean([masks[i, r:r + 32, c:c + 32].any() for i, r, c in zip(index, rows, cols)]) < 0.4
    index, rows, _ = _batch_index(masks > 0, TumourSegmenterConfig(crop=None, tumour_fraction=1.0, batch=16), rng,
                                  tumour_slices)
    assert rows is None and np.isin(index, tumour_slices).all()


def test_segmenter_config_and_inputs_are_validated():
    import pytest

    from AnonMRILib.evaluation.tumour_segmentation import TumourSegmenterConfig, train_tumour_segmenter

    for bad in ({"strides": (2,)}, {"norm": "group"}, {"crop": 30}, {"tumour_fraction": 1.5}, {"batch": 0}):
        with pytest.raises(ValueError):
            TumourSegmenterConfig(**bad)
    with pytest.raises(ValueError, match="smaller than the crop"):
        train_tumour_segmenter(np.zeros((2, 32, 32)), np.zeros((2, 32, 32)), TumourSegmenterConfig(crop=64))
    with pytest.raises(ValueError, match="one shape"):
        train_tumour_segmenter(np.zeros((2, 32, 32)), np.zeros((2, 32, 31)))


def test_consistency_part_reports_real_independent_and_consistent(tmp_path, monkeypatch):
    """evaluate_lesion's consistency part on two tiny volumes (the heads are replaced by a fixture)."""
    import argparse

    import evaluate_lesion

    from lesion_fixtures import TINY_SIZE, tiny_models

    rng = np.random.default_rng(0)
    volumes = []
    for _ in range(2):
        brain = np.zeros((TINY_SIZE, TINY_SIZE, 12), bool)
        brain[6:26, 6:26, 2:10] = True
        image = np.where(brain, 0.4 + 0.1 * rng.random(brain.shape), 0.0).astype(np.float32)
        labels = np.zeros(brain.shape, np.uint8)
        labels[12:16, 12:16, 4:8] = 1
        volumes.append((image, labels, brain))
    monkeypatch.setattr(evaluate_lesion, "generated_volumes", lambda args, size: volumes)
    from AnonMRILib.pipelines.lesion import SourceRepulsionConfig

    args = argparse.Namespace(steps=1, seed=0, out=tmp_path)
    result = evaluate_lesion.consistency(args, tiny_models(), SourceRepulsionConfig(candidates=2))
    assert result["volumes"] == 2 and result["slices"] == 16
    for name in ("independent", "consistent"):
        assert result[name]["real"] == pytest.approx(result["consistent"]["real"])
        assert len(result[name]["per_volume_generated"]) == 2
    evaluate_lesion.write_report(tmp_path, {"consistency": result})
    assert "adjacent-slice correlation" in (tmp_path / "README.md").read_text()
    assert (tmp_path / "consistency.png").is_file()


def test_real_case_helpers_resample_and_head_metrics():
    """The whole-head real case: resampling to more slices keeps the extent; identical output scores
    Dice 1 and sharpness ratio 1, a blurred brain a lower sharpness ratio."""
    import evaluate_lesion
    from scipy import ndimage

    from test_lesion_head import head_with_lesion

    head, lesion, brain = head_with_lesion()
    longer = evaluate_lesion.resample_slices(head, 28, 1)
    assert longer.shape == (44, 48, 28) and longer.dtype == head.dtype
    first = lambda v: v.affine[:3, :3] @ np.array([0, 0, -0.5]) + v.affine[:3, 3]  # noqa: E731 (slab edge)
    assert np.allclose(first(longer), first(head))
    inside, in_lesion = brain.array != 0, lesion.array != 0
    same = evaluate_lesion.head_metrics(head, head, inside, in_lesion)
    assert same["head_outline_dice"] == 1.0 and same["sharpness_ratio_volume"] == pytest.approx(1.0)
    blurred = head.with_array(np.where(inside, ndimage.gaussian_filter(head.array.astype(float), (2, 2, 0)),
                                       head.array).astype(head.dtype))
    assert evaluate_lesion.head_metrics(head, blurred, inside, in_lesion)["sharpness_ratio_volume"] < 0.8


def test_population_utility_is_compared_seed_by_seed_and_on_the_means():
    """``evaluate_lesion_population.utility_comparisons``: the two utility goals of issue 26 on the mean
    IoUs and, with several seeds, seed by seed (a segmenter's IoU moved by 0.05 between two identical
    runs, so one draw cannot decide either goal)."""
    import evaluate_lesion_population as population

    one = {"real": {"iou_tumour": 0.3}, "anonymized (exact lesion)": {"iou_tumour": 0.15},
           "half real + half anonymized": {"iou_tumour": 0.2}, "half real": {"iou_tumour": 0.25}}
    assert population.utility_comparisons(one) == {"anonymized_over_real": 0.5, "mixed_minus_half_real": -0.05}
    seeds = {"real": {"iou_tumour": 0.3, "iou_tumour_per_seed": [0.2, 0.4]},
             "anonymized (exact lesion)": {"iou_tumour": 0.25, "iou_tumour_per_seed": [0.3, 0.2]},
             "half real + half anonymized": {"iou_tumour": 0.2, "iou_tumour_per_seed": [0.1, 0.3]},
             "half real": {"iou_tumour": 0.2, "iou_tumour_per_seed": [0.2, 0.2]}}
    out = population.utility_comparisons(seeds)
    assert out["anonymized_over_real"] == pytest.approx(0.833, abs=1e-3)
    assert out["anonymized_over_real_per_seed"] == [1.5, 0.5]
    assert out["seeds_anonymized_at_least_0.68_of_real"] == 1
    assert out["mixed_minus_half_real_per_seed"] == [-0.1, 0.1]
    assert out["seeds_mixed_at_least_half_real"] == 1


def test_utility_halves_share_every_head_and_grade():
    """``evaluate_lesion_population.balanced_halves``: with the population's patient p on base head
    p % 4 and grade p % 2, each half gets every head and both grades (halves by parity got one grade
    and two heads each), and together they are the training patients, once each."""
    import evaluate_lesion_population as population

    for train in (list(range(11)), [p for p in range(16) if p % 4 != 3]):
        half, other = population.balanced_halves(train, [(p % 4, p % 2) for p in train])
        assert sorted(half + other) == sorted(train) and abs(len(half) - len(other)) <= 1
        for part in (half, other):
            assert {p % 2 for p in part} == {p % 2 for p in train}
            assert {p % 4 for p in part} == {p % 4 for p in train}
