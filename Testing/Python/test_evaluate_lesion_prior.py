"""The lesion evaluation's fair comparison: another brain placed on a patient from the masks alone
(Training/evaluate_lesion_prior.py :func:`placed_by_masks`)."""
import sys
from pathlib import Path

import numpy as np

from AnonMRILib.io.volume import Volume

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "Training"))
import evaluate_lesion_prior as evaluation  # noqa: E402


def _brain(shape, radii, seed):
    from scipy import ndimage

    grid = np.meshgrid(*[np.arange(n) - n / 2 for n in shape], indexing="ij")
    brain = sum((g / r) ** 2 for g, r in zip(grid, radii)) < 1.0
    texture = ndimage.gaussian_filter(np.random.default_rng(seed).standard_normal(shape), 4.0)
    return brain, np.where(brain, 100.0 + 400.0 * texture, 0.0).astype(np.float32)


def test_a_brain_placed_on_its_own_masks_is_itself_and_another_is_not():
    shape, affine = (64, 72, 56), np.diag([1.0, 1.0, 1.0, 1.0])
    brain, patient = _brain(shape, (24, 28, 20), seed=1)
    other_brain, other = _brain(shape, (22, 30, 19), seed=2)
    lesion = np.zeros(shape, bool)
    image = Volume(patient, affine)
    inside = brain & ~lesion
    itself = evaluation.placed_by_masks(image, brain, lesion, image, brain, seed=0)
    placed = evaluation.placed_by_masks(image, brain, lesion, Volume(other, affine), other_brain, seed=0)
    assert evaluation.ncc(patient, itself, inside) > 0.6  # only the seeded variation moves it
    assert abs(evaluation.ncc(patient, placed, inside)) < 0.3  # another texture: unrelated
    filled = (placed != 0)[inside].mean()
    assert filled > 0.97  # the other brain fills this patient's outline


def test_the_outline_dice_reads_each_slice_outline_not_cavities_open_at_the_cut():
    """A head cut by the field of view: a cavity reaching the cut stays outside a 3-D filled mask, so
    3-D Dice punishes a changed cavity although the outline is the same; the slice outline does not.
    A smaller head fails it."""
    from AnonMRILib.transforms.head_mask import head_mask_array

    yy, xx = np.mgrid[:96, :96] - 47.5
    disc = (yy ** 2 + xx ** 2) < 20 ** 2
    head = np.repeat(disc[None], 12, axis=0).astype(np.float32) * 100.0
    cavity_in, cavity_out = head.copy(), head.copy()
    cavity_in[:6, 38:58, 38:58] = 0.0   # a dark cavity open onto the lowest slice (the cut)
    cavity_out[:6, 42:54, 42:54] = 0.0  # another cavity, same outline
    a, b = head_mask_array(cavity_in), head_mask_array(cavity_out)
    dice_3d = 2.0 * (a & b).sum() / (a.sum() + b.sum())
    assert dice_3d < 0.95
    assert evaluation.slice_outline_dice(a, b) == 1.0
    smaller = np.repeat(((yy ** 2 + xx ** 2) < 14 ** 2)[None], 12, axis=0)
    assert evaluation.slice_outline_dice(a, smaller) < 0.7


def test_the_smoothed_gradient_ratio_is_not_passed_by_noise():
    """Pixel noise on a blurred copy lifts the plain gradient ratio to the input's, not the smoothed one."""
    from scipy import ndimage

    from AnonMRILib.transforms.appearance import mean_gradient

    rng = np.random.default_rng(0)
    edges = np.zeros((4, 64, 64), np.float64)
    edges[:, :, ::8] = 100.0
    sharp = ndimage.gaussian_filter(edges, (0, 0.7, 0.7))
    region = np.ones(sharp.shape, bool)
    blurred = ndimage.gaussian_filter(edges, (0, 4.0, 4.0))
    sigma = 1.0
    while mean_gradient(blurred + rng.normal(0, sigma, blurred.shape), region) < mean_gradient(sharp, region):
        sigma *= 1.5
    noisy = blurred + rng.normal(0, sigma, blurred.shape)
    assert mean_gradient(noisy, region) / mean_gradient(sharp, region) >= 1.0
    assert evaluation.smoothed_gradient_ratio(sharp, noisy, region) < 0.8
    assert evaluation.smoothed_gradient_ratio(sharp, sharp + rng.normal(0, 0.5, sharp.shape), region) > 0.95
