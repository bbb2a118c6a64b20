"""Smooth intensity shading (the receive field) of an MR volume: N4 estimate and correction.

Used where two scans are compared voxel by voxel and the scanner's shading, which is not anatomy,
would dominate the low spatial frequencies (the lesion evaluation's similarity figures), and to
flatten donors before they enter a bank. SimpleITK's N4 (Tustison et al. 2010) does the work.
"""
from typing import Sequence, Tuple

import numpy as np

from ..io.volume import Volume

__all__ = ["shrink_factors", "n4_field", "n4_corrected"]


def shrink_factors(spacing_mm: Sequence[float], shrink: int = 2) -> Tuple[int, ...]:
    """Per-axis shrink for N4's fit: ``shrink`` on axes within twice the finest spacing, 1 on thick
    (slice) axes, so a 6.5 mm stack of 25 slices keeps every slice."""
    finest = float(min(spacing_mm))
    return tuple(int(shrink) if float(s) < 2.0 * finest else 1 for s in spacing_mm)


def n4_field(volume: Volume, mask: np.ndarray, shrink: int = 2,
             iterations: Sequence[int] = (40, 30, 20)) -> np.ndarray:
    """Multiplicative bias field (float64, volume's grid, > 0) fitted by N4 inside ``mask`` (bool,
    volume's grid) at :func:`shrink_factors` and evaluated at full resolution."""
    import SimpleITK as sitk

    from ..io.writers import numpy_to_simpleitk

    mask = np.asarray(mask, dtype=bool)
    if mask.shape != volume.shape or not mask.any():
        raise ValueError("n4_field needs a non-empty mask on the volume's grid")
    image = numpy_to_simpleitk(np.asarray(volume.array, dtype=np.float32), volume.affine)
    mask_image = numpy_to_simpleitk(mask.astype(np.uint8), volume.affine)
    factors = list(shrink_factors(volume.spacing, shrink))
    corrector = sitk.N4BiasFieldCorrectionImageFilter()
    corrector.SetMaximumNumberOfIterations([int(i) for i in iterations])
    corrector.Execute(sitk.Shrink(image, factors), sitk.Shrink(mask_image, factors))
    log_field = corrector.GetLogBiasFieldAsImage(image)
    return np.exp(sitk.GetArrayFromImage(log_field).transpose(2, 1, 0).astype(np.float64))


def n4_corrected(volume: Volume, mask: np.ndarray, shrink: int = 2,
                 iterations: Sequence[int] = (40, 30, 20)) -> Volume:
    """``volume`` divided by its :func:`n4_field` (float32 Volume, same grid and units scale)."""
    field = n4_field(volume, mask, shrink, iterations)
    return volume.with_array((np.asarray(volume.array, dtype=np.float64) / field).astype(np.float32))
