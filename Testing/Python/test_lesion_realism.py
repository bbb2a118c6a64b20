"""Realism guard: sharpness and brain-area ratios, and the sharpness constraint of source repulsion."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.evaluation.realism import (RealismCriterion, area_ratio, is_realistic, realism_summary, sharpness,
                                           sharpness_ratio, volume_ratios)


def textured_brains(count=4, size=48, seed=0):
    """Disc-shaped 'brains' with fine texture in [0.2, 0.9] on a zero background."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    disc = (yy - size / 2) ** 2 + (xx - size / 2) ** 2 < (0.4 * size) ** 2
    return np.where(disc, 0.2 + 0.7 * rng.random((count, size, size)), 0.0).astype(np.float32)


def test_blur_lowers_and_identity_keeps_the_sharpness_ratio():
    from scipy import ndimage

    real = textured_brains()
    blurred = np.stack([ndimage.gaussian_filter(image, 1.5) for image in real])
    assert sharpness_ratio(real, real) == pytest.approx(np.ones(len(real)))
    assert np.all(sharpness_ratio(blurred, real) < 0.5)
    assert not is_realistic(blurred, real).any() and is_realistic(real, real).all()
    # a darker copy is half as sharp in intensity units: the ratio measures gradients, not structure
    assert sharpness_ratio(0.5 * real + 0.05 * (real > 0), real) == pytest.approx(np.full(len(real), 0.5), rel=1e-4)


def test_noise_is_not_realistic_and_shrunken_brain_is_caught_by_area():
    real = textured_brains(seed=1)
    noisy = np.clip(real + 0.5 * np.random.default_rng(2).standard_normal(real.shape), 0, 1)
    assert np.all(sharpness_ratio(noisy, real) > RealismCriterion().max_sharpness_ratio)
    assert not is_realistic(noisy, real).any()
    shrunken = real.copy()
    shrunken[:, :, :24] = 0.0  # half the brain gone, the rest equally sharp
    assert area_ratio(shrunken, real) == pytest.approx(np.full(len(real), 0.5), abs=0.05)
    assert not is_realistic(shrunken, real).any()


def test_sharpness_ignores_the_brain_edge_and_empty_slices():
    flat = np.zeros((2, 32, 32), np.float32)
    flat[0, 4:28, 4:28] = 0.7  # a flat brain: only its edge has gradient
    assert sharpness(flat)[0] == 0.0 and np.isnan(sharpness(flat)[1])
    assert np.isnan(sharpness_ratio(flat, flat)[1]) and np.isnan(area_ratio(flat, flat)[1])
    with pytest.raises(InputError):
        sharpness_ratio(flat, flat[:1])


def test_summary_per_slice_per_volume_and_combined_rate():
    from scipy import ndimage

    real = textured_brains(count=6, seed=3)
    mixed = real.copy()
    mixed[3:] = np.stack([ndimage.gaussian_filter(image, 2.0) for image in real[3:]])
    anonymized = np.array([True, False, True, True, True, False])
    summary = realism_summary(mixed, real, anonymized=anonymized, groups=np.array([0, 0, 0, 1, 1, 1]))
    assert summary["fraction_sharpness_ok"] == pytest.approx(0.5)
    assert summary["fraction_realistic"] == pytest.approx(0.5)
    assert summary["rate_anonymized_and_realistic"] == pytest.approx(2 / 6)
    volume_sharp = volume_ratios(mixed[3:], real[3:])["sharpness_ratio"]
    assert volume_sharp < 0.5
    assert summary["median_volume_sharpness_ratio"] == pytest.approx((1.0 + volume_sharp) / 2)


def test_repulsion_keeps_a_sharp_draw_where_one_exists():
    """Draw 0 is blurred (and so farther from the source by 1 - correlation), draw 1 is sharp: the
    constraint keeps draw 1; without it (or with every draw blurred) the farthest draw is kept."""
    import torch
    from scipy import ndimage

    from AnonMRILib.pipelines.lesion import SourceRepulsionConfig, repelled_choice

    real = textured_brains(count=1, seed=4)[0]
    other = textured_brains(count=1, seed=5)[0]
    blurred = ndimage.gaussian_filter(other, 2.0)
    sharp = 0.9 * real + 0.1 * other  # much closer to the source, about as sharp
    as_tensor = lambda a: torch.from_numpy(np.asarray(a, np.float32))[None, None]  # noqa: E731
    draws = torch.stack([as_tensor(blurred), as_tensor(sharp)])
    source, lesion = as_tensor(real), torch.zeros(1, 1, *real.shape)
    loose = dict(candidates=2, area_tolerance=10.0, brightness_tolerance=10.0)
    assert repelled_choice(draws, source, lesion, SourceRepulsionConfig(**loose, min_sharpness_ratio=0.0)).tolist() == [0]
    assert repelled_choice(draws, source, lesion, SourceRepulsionConfig(**loose)).tolist() == [1]
    both_blurred = torch.stack([as_tensor(blurred), as_tensor(ndimage.gaussian_filter(sharp, 2.0))])
    assert repelled_choice(both_blurred, source, lesion, SourceRepulsionConfig(**loose)).tolist() == \
        repelled_choice(both_blurred, source, lesion, SourceRepulsionConfig(**loose, min_sharpness_ratio=0.0)).tolist()
