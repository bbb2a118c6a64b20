"""Distance maps (AnonMRILib.transforms.distance) against scipy's exact Euclidean transform."""
import numpy as np
import pytest
from scipy import ndimage

from AnonMRILib.transforms.distance import bounding_box, depth, signed_distance


def _blobs(shape=(40, 50, 30), seed=0):
    rng = np.random.default_rng(seed)
    return ndimage.gaussian_filter(rng.random(shape), 3) > 0.5


@pytest.mark.parametrize("spacing", [None, (1.0, 1.0, 1.0), (0.8, 0.9, 3.0), (0.5, 6.5, 0.5)])
def test_depth_and_signed_distance_equal_scipy(spacing):
    mask = _blobs()
    sampling = np.ones(3) if spacing is None else spacing
    inside = ndimage.distance_transform_edt(mask, sampling=sampling)
    outside = ndimage.distance_transform_edt(~mask, sampling=sampling)
    assert mask.any() and (~mask).any()
    result = depth(mask, spacing)
    assert result.dtype == np.float32 and result.shape == mask.shape
    assert np.abs(result - inside).max() < 1e-4
    assert np.all(result[~mask] == 0)
    assert np.abs(signed_distance(mask, spacing) - (inside - outside)).max() < 1e-4


def test_depth_of_empty_and_full_masks():
    assert not depth(np.zeros((5, 6, 7), bool)).any()
    full = np.ones((5, 6, 7), bool)
    assert np.allclose(depth(full), ndimage.distance_transform_edt(full))


def test_bounding_box_matches_the_voxel_list():
    mask = np.zeros((30, 20, 10), bool)
    mask[3:7, 11, 2:9] = True
    mask[25, 4, 5] = True
    low, high = bounding_box(mask)
    indices = np.argwhere(mask)
    assert np.array_equal(low, indices.min(axis=0)) and np.array_equal(high, indices.max(axis=0))
    assert bounding_box(np.zeros((3, 3, 3))) is None


def test_bounding_slices_grow_by_the_margin_and_stay_inside_the_array():
    from AnonMRILib.transforms.distance import bounding_slices

    mask = np.zeros((10, 12, 14), bool)
    mask[2:5, 6:8, 12] = True
    assert bounding_slices(mask) == (slice(2, 5), slice(6, 8), slice(12, 13))
    assert bounding_slices(mask, 3) == (slice(0, 8), slice(3, 11), slice(9, 14))
    assert bounding_slices(mask, (1, 0, 2)) == (slice(1, 6), slice(6, 8), slice(10, 14))
    assert bounding_slices(np.zeros((3, 3, 3), bool), 2) is None
