"""Training/evaluate_head_analyses.py: the downstream-analysis figures of issue 27 measure what they say."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "Training"))

from evaluate_head_analyses import (PROFILE_MM, gradient_ratio, intensity_profile, markdown,  # noqa: E402
                                    registration_difference)

from AnonMRILib.io import Volume  # noqa: E402
from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head  # noqa: E402


def _ball_head(spacing=(1.0, 1.0, 2.0)):
    """A textured ball 'head' (radius 40 mm) around a ball 'brain' (radius 20 mm) on an anisotropic grid."""
    shape = (100, 100, 50)
    affine = np.diag(list(spacing) + [1.0])
    affine[:3, 3] = [-50.0 * spacing[0], -50.0 * spacing[1], -25.0 * spacing[2]]
    grids = np.meshgrid(*[(np.arange(n) - n / 2) * s for n, s in zip(shape, spacing)], indexing="ij")
    radius = np.sqrt(sum(g * g for g in grids))
    texture = 100.0 + 40.0 * np.sin(grids[0] / 2.0) * np.cos(grids[1] / 3.0)
    array = np.where(radius < 40.0, texture, 0.0).astype(np.float32)
    return Volume(array, affine), radius < 20.0, radius


def test_gradient_ratio_is_one_for_the_input_and_falls_with_blur():
    from scipy import ndimage

    volume, brain, _ = _ball_head()
    assert gradient_ratio(volume, volume, brain, 3.0) == pytest.approx(1.0)
    blurred = np.where(brain, volume.array, ndimage.gaussian_filter(volume.array, 2.0))
    assert gradient_ratio(volume, volume.with_array(blurred), brain, 3.0) < 0.7
    doubled = np.where(brain, volume.array, 2.0 * volume.array)
    assert gradient_ratio(volume, volume.with_array(doubled), brain, 3.0) == pytest.approx(2.0, rel=0.05)
    # a head 5 mm larger: over the input's head its skin edge is not counted, over its own head it is
    _, _, radius = _ball_head()
    larger = np.where(radius < 45.0, 100.0 + 40.0 * np.sin(np.indices(radius.shape)[0] / 2.0), 0.0)
    larger = np.where(brain, volume.array, larger).astype(np.float32)
    assert gradient_ratio(volume, volume.with_array(larger), brain, 3.0) < gradient_ratio(
        volume, volume.with_array(larger), brain, 3.0, own_heads=True)
    assert gradient_ratio(volume, volume, brain, 3.0, own_heads=True) == pytest.approx(1.0)


def test_intensity_profile_is_the_mean_in_mm_shells_outside_the_brain():
    volume, brain, radius = _ball_head()
    shells = np.where(radius < 40.0, np.floor(radius - 20.0) + 1.0, 0.0)  # shell d holds distance (d - 1, d]
    output = volume.with_array(np.where(brain, volume.array, 10.0 * shells).astype(np.float32))
    profile = intensity_profile(volume, output, brain)
    assert profile["distance_mm"] == list(PROFILE_MM)
    # the voxel-centre distance to the brain mask is within a voxel of the radial distance
    for d, value in zip(PROFILE_MM, profile["output"]):
        assert 10.0 * (d - 1.0) <= value <= 10.0 * (d + 2.0)
    assert np.allclose(profile["input"], profile["input"][0], rtol=0.2)  # the texture's mean everywhere


def test_registration_difference_is_zero_for_the_input_and_the_shift_for_a_shifted_head():
    head, mask = load_sample_head(), load_sample_brain_mask()
    brain = np.asarray(mask.array) != 0
    same = registration_difference(head, head, brain)
    assert same["mean_mm"] < 0.01  # the same registration twice (threads may round differently)
    # the head moved by two voxels along its first axis on the same grid: its brain moved by as much
    shifted = head.with_array(np.roll(np.asarray(head.array), 2, axis=0))
    moved = registration_difference(head, shifted, brain)
    expected = 2.0 * float(head.spacing[0])
    assert abs(moved["mean_mm"] - expected) < 0.5, moved
    assert moved["max_mm"] < expected + 1.0


def test_markdown_has_a_row_per_method_and_the_profile():
    row = {"method": "reface", "seed": 0, "brain_bit_exact": True, "gradient_ratio": 0.8,
           "gradient_ratio_own_heads": 0.85, "hdbet_dice": 0.99,
           "robex_dice": None, "tissue_dice": {"CSF": 0.9, "GREY": 0.95, "WHITE": 0.99},
           "registration": {"mean_mm": 1.0, "max_mm": 2.0},
           "profile": {"distance_mm": list(PROFILE_MM), "input": [1.0] * len(PROFILE_MM),
                       "output": [2.0] * len(PROFILE_MM)}}
    text = markdown([{"head": "h", "spacing_mm": [1.0, 1.0, 1.0], "rows": [row]}], 3.0)
    assert "| REFACE | 0 | 0.800 / 0.850 | 0.9900 | - | 0.900 | 0.950 | 0.990 | 1.00 / 2.00 | yes |" in text
    assert text.count("\n| 12 |") == 1
