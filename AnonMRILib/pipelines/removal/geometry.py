"""World-coordinate helpers shared by the removal baselines.

Every baseline decides *where* the face is in RAS world coordinates (the Volume's affine), never
from the voxel axis order, so images stored RAS, LAS, LIA or oblique are treated alike. The head
is assumed upright in the scanner frame (superior = +S, face towards +A), as scanners report it.
"""
import numpy as np

from ...io.volume import Volume

#: RAS world axes
R_AXIS, A_AXIS, S_AXIS = 0, 1, 2


def world_coordinate(volume: Volume, axis: int, dtype=np.float32) -> np.ndarray:
    """The RAS world coordinate (mm) along ``axis`` (0 = R, 1 = A, 2 = S) of every voxel, full array."""
    row = volume.affine[axis]
    ni, nj, nk = volume.shape
    i = (row[0] * np.arange(ni, dtype=np.float64) + row[3]).astype(dtype)
    j = (row[1] * np.arange(nj, dtype=np.float64)).astype(dtype)
    k = (row[2] * np.arange(nk, dtype=np.float64)).astype(dtype)
    return i[:, None, None] + j[None, :, None] + k[None, None, :]


def mask_world_points(mask: np.ndarray, volume: Volume) -> np.ndarray:
    """(N, 3) RAS mm of the nonzero voxels of ``mask`` (on ``volume``'s grid)."""
    return volume.world_coordinates(np.argwhere(mask))


def sigma_voxels(volume: Volume, sigma_mm: float) -> np.ndarray:
    """A Gaussian width of ``sigma_mm`` expressed in voxels along i, j, k."""
    return float(sigma_mm) / volume.spacing
