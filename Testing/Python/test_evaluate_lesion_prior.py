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
