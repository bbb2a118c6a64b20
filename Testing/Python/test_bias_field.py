"""N4 shading estimate and correction (AnonMRILib.transforms.bias_field)."""
import numpy as np
import pytest

from AnonMRILib.io.volume import Volume
from AnonMRILib.transforms.bias_field import n4_corrected, n4_field, shrink_factors


def test_shrink_factors_keep_thick_slices():
    assert shrink_factors((0.78, 0.78, 6.5)) == (2, 2, 1)
    assert shrink_factors((1.0, 1.0, 1.0), 4) == (4, 4, 4)


def test_n4_removes_a_smooth_shading_and_keeps_the_pattern():
    rng = np.random.default_rng(0)
    shape = (48, 48, 12)
    x, y, z = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    mask = x ** 2 + y ** 2 < 0.8
    tissue = np.where(rng.random(shape) < 0.5, 100.0, 160.0)  # two classes, no spatial trend
    from scipy import ndimage
    tissue = ndimage.gaussian_filter(tissue, (1, 1, 0)) + rng.normal(0, 2, shape)
    shading = np.exp(0.25 * x + 0.15 * y)
    volume = Volume((tissue * shading).astype(np.float32), np.diag([1.0, 1.0, 4.0, 1.0]))
    field = n4_field(volume, mask)
    ratio = field[mask] / shading[mask]
    assert ratio.std() / ratio.mean() < 0.03  # the shading is found up to a constant
    corrected = np.asarray(n4_corrected(volume, mask).array, np.float64)
    left, right = mask & (x < -0.4), mask & (x > 0.4)
    assert abs(np.log(corrected[right].mean() / corrected[left].mean())) < 0.05
    assert abs(np.log((tissue * shading)[right].mean() / (tissue * shading)[left].mean())) > 0.2
    assert np.corrcoef(corrected[mask], tissue[mask])[0, 1] > 0.95


def test_n4_needs_a_mask_on_the_grid():
    volume = Volume(np.ones((8, 8, 8), np.float32), np.eye(4))
    with pytest.raises(ValueError, match="mask"):
        n4_field(volume, np.zeros((8, 8, 8), bool))
