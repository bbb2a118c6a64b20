"""Skull stripping and BLACK: keep the brain, set everything else to 0.

* ``skullstrip`` is what a skull-stripping tool (MRI WATERSHED in the CP-GAN paper) outputs: the
  brain with the CSF in its sulci and ventricles, i.e. the brain mask closed with a ball of
  ``closing_mm`` and its enclosed holes filled; skull, scalp, face and neck are 0.
* ``black`` keeps strictly the brain-mask voxels and zeroes every other voxel: the least that
  still satisfies the brain invariant (the "optimal privacy" reference of the paper's studies).
"""
from dataclasses import dataclass

import numpy as np

from ...io.volume import Volume


@dataclass(frozen=True)
class SkullStripConfig:
    """Radius in mm of the morphological closing that adds sulcal CSF to the brain mask."""

    closing_mm: float = 3.0


def skull_stripped_region(brain: np.ndarray, volume: Volume, config: SkullStripConfig = SkullStripConfig()) -> np.ndarray:
    """Boolean array: brain mask closed with a ``closing_mm`` ball and hole-filled (always contains it)."""
    from scipy import ndimage

    radius = np.maximum(np.round(config.closing_mm / volume.spacing).astype(int), 0)
    if radius.max() > 0:
        grid = np.ogrid[tuple(slice(-r, r + 1) for r in radius)]
        ball = sum((g * s) ** 2 for g, s in zip(grid, volume.spacing)) <= config.closing_mm ** 2 + 1e-6
        padded = np.pad(brain, [(r, r) for r in radius])
        closed = ndimage.binary_closing(padded, structure=ball)
        closed = closed[tuple(slice(r, r + n) for r, n in zip(radius, brain.shape))]
    else:
        closed = brain
    return ndimage.binary_fill_holes(closed | brain)
