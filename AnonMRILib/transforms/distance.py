"""Euclidean distance maps of binary masks (mm), on SimpleITK's multi-threaded Maurer transform.

:func:`depth` equals ``scipy.ndimage.distance_transform_edt(mask, sampling=spacing)`` (distance
from each inside voxel's centre to the nearest outside voxel's centre; 0 outside) to float32
rounding, 3-5x faster on 2 cores (a 174 x 219 x 218 template head: 1.74 s -> 0.37 s): the
anatomical prior takes several of them per head. Arrays are indexed like their Volume (i, j, k);
``spacing`` is the voxel size in mm along those axes.
"""
from typing import Optional, Sequence, Tuple, Union

import numpy as np


def bounding_box(mask: np.ndarray) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(low, high) inclusive voxel indices of the nonzero voxels of ``mask``, or None when it is
    empty (projections along each axis: no index list of every voxel)."""
    mask = np.asarray(mask) != 0
    low, high = [], []
    for axis in range(mask.ndim):
        others = tuple(a for a in range(mask.ndim) if a != axis)
        present = np.flatnonzero(mask.any(axis=others))
        if present.size == 0:
            return None
        low.append(int(present[0]))
        high.append(int(present[-1]))
    return np.array(low), np.array(high)


def bounding_slices(mask: np.ndarray, margin: Union[int, Sequence[int]] = 0) -> Optional[Tuple[slice, ...]]:
    """Slices of the box around the nonzero voxels of ``mask`` grown by ``margin`` voxels (one
    number, or one per axis) and clipped to the array, or None when it is empty."""
    extent = bounding_box(mask)
    if extent is None:
        return None
    shape = np.shape(mask)
    margin = np.broadcast_to(np.asarray(margin, int), (len(shape),))
    return tuple(slice(max(0, int(a) - int(m)), min(int(n), int(b) + 1 + int(m)))
                 for a, b, m, n in zip(extent[0], extent[1], margin, shape))


def depth(mask: np.ndarray, spacing: Optional[Sequence[float]] = None) -> np.ndarray:
    """float32 distance (mm) of every nonzero voxel of ``mask`` to the nearest zero voxel, 0 at zero
    voxels (``spacing``: mm per voxel along the array's axes, None = 1). A mask without zero voxels
    falls back to scipy (whose convention for it is kept)."""
    import SimpleITK as sitk

    inside = np.asarray(mask) != 0
    spacing = np.ones(inside.ndim) if spacing is None else np.asarray(spacing, np.float64)
    if not inside.any():
        return np.zeros(inside.shape, np.float32)
    if inside.all():
        from scipy import ndimage

        return ndimage.distance_transform_edt(inside, sampling=spacing).astype(np.float32)
    outside = sitk.GetImageFromArray(np.ascontiguousarray((~inside).transpose()).astype(np.uint8))
    outside.SetSpacing(tuple(float(s) for s in spacing))
    distance = sitk.SignedMaurerDistanceMap(outside, insideIsPositive=False, squaredDistance=False,
                                            useImageSpacing=True)
    out = np.array(sitk.GetArrayViewFromImage(distance).transpose(), np.float32, order="C")
    return np.maximum(out, 0.0, out=out)  # the outside voxels' own (negative or 0) distances


def signed_distance(mask: np.ndarray, spacing: Optional[Sequence[float]] = None) -> np.ndarray:
    """float32 signed distance (mm), positive inside: ``depth(mask) - depth(~mask)``."""
    inside = np.asarray(mask) != 0
    return depth(inside, spacing) - depth(~inside, spacing)
