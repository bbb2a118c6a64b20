"""Head mask: the binarisation 1[x >= delta] of CP-GAN's surface representation (sec. 3.1).

The threshold delta is chosen from the image itself so that it works whatever the intensity
scale or offset of the scanner:

* ``"otsu"`` (default): Otsu's threshold (skimage, 256 bins between the minimum and the 99.5th
  percentile of the image, values above it clipped so that a few hot voxels do not squash the
  histogram), then moved halfway towards the background level (the image's median, which in a
  whole-head scan lies in the air). Otsu alone sits between air and *tissue* and cuts dark skin
  and fat at the nose tip; halfway to the background keeps the skin while rejecting air noise.
* ``"percentile"``: ``background + 0.1 * (p99.5 - background)``.
* a number: that intensity.

Both automatic rules are affine-equivariant: for ``a * x + b`` (a > 0) the threshold is
``a * delta + b``, so the mask is the same for x, 1000x or 0.001x + offset (tested).

The binarised image is cleaned: only the largest 26-connected component is kept (drops air
noise and ghosting) and enclosed cavities are filled (sinuses, ventricles below threshold).
"""
from typing import Union

import numpy as np

from ..errors import InputError
from ..io.volume import Volume

ThresholdMethod = Union[str, float]
THRESHOLD_METHODS = ("otsu", "percentile")

#: upper robust percentile used to clip the histogram / scale the percentile rule
HIGH_PERCENTILE = 99.5


def sample_values(array: np.ndarray, max_values: int = 2_000_000) -> np.ndarray:
    """Every n-th voxel value (float64, at most ~``max_values``) for robust statistics."""
    flat = np.asarray(array).ravel(order="K")  # no copy for C- or Fortran-ordered arrays
    step = max(1, flat.size // max_values)
    return flat[::step].astype(np.float64)


def head_threshold(array: np.ndarray, method: ThresholdMethod = "otsu") -> float:
    """The intensity delta above which a voxel counts as head (same units as ``array``)."""
    if not isinstance(method, str):
        value = float(method)
        if not np.isfinite(value):
            raise InputError("the head threshold must be a finite number")
        return value
    values = sample_values(array)
    values = values[np.isfinite(values)]
    background = float(np.median(values))
    high = float(np.percentile(values, HIGH_PERCENTILE))
    if high <= background:
        high = float(values.max())
    if high <= background:
        raise InputError("the image has no intensity above its background; there is no head in it")
    if method == "otsu":
        from skimage.filters import threshold_otsu

        low = float(values.min())
        clipped = np.clip(values, low, high)
        # Otsu on the histogram normalised to [0, 1] (exactly equivariant to a*x+b)
        otsu = low + (high - low) * float(threshold_otsu((clipped - low) / (high - low), nbins=256))
        return background + 0.5 * (max(otsu, background) - background)
    if method == "percentile":
        return background + 0.1 * (high - background)
    raise InputError(f"unknown head threshold method {method!r} (use one of {', '.join(THRESHOLD_METHODS)} "
                     "or a number)")


def clean_binary_head(binary: np.ndarray) -> np.ndarray:
    """Largest 26-connected component of ``binary`` with its enclosed cavities filled (bool)."""
    from scipy import ndimage

    labels, count = ndimage.label(binary, structure=np.ones((3, 3, 3), bool))
    if count == 0:
        raise InputError("no voxel is above the head threshold; there is no head in the image")
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    largest = labels == int(np.argmax(sizes))
    return ndimage.binary_fill_holes(largest)


def head_mask_array(array: np.ndarray, method: ThresholdMethod = "otsu") -> np.ndarray:
    """Boolean head mask of a 3-D intensity array (threshold, largest component, holes filled)."""
    delta = head_threshold(array, method)
    return clean_binary_head(np.asarray(array) >= delta)


def head_mask(volume: Volume, method: ThresholdMethod = "otsu") -> Volume:
    """uint8 0/1 head mask of ``volume`` on its own grid (see the module docstring)."""
    return volume.with_array(head_mask_array(volume.array, method).astype(np.uint8))
