"""The one image type that crosses every boundary of AnonMRI.

A :class:`Volume` is a 3-D voxel array plus its affine, the 4x4 matrix that maps voxel indices
``(i, j, k, 1)`` to RAS world coordinates in millimetres (the NIfTI / nibabel / Slicer-RAS
convention). Spacing, direction and origin are derived from the affine and never stored twice.
A Volume carries nothing else: no file name, no header text, no patient information.
"""
from dataclasses import dataclass
from typing import Tuple

import numpy as np

from ..errors import InputError


@dataclass(frozen=True, eq=False)
class Volume:
    """A 3-D image: ``array[i, j, k]`` with ``affine`` mapping voxel (i, j, k) to RAS mm."""

    array: np.ndarray
    affine: np.ndarray

    def __post_init__(self) -> None:
        array = np.asarray(self.array)
        affine = np.asarray(self.affine, dtype=np.float64)
        if array.ndim != 3:
            raise InputError(f"a Volume must be 3-D, got an array of shape {array.shape}")
        if affine.shape != (4, 4) or not np.all(np.isfinite(affine)):
            raise InputError("a Volume's affine must be a finite 4x4 matrix")
        if abs(np.linalg.det(affine[:3, :3])) < 1e-12:
            raise InputError("the voxel size is (nearly) zero or the axes are degenerate (singular affine); a wrong header?")
        object.__setattr__(self, "array", array)
        object.__setattr__(self, "affine", affine)

    # --- derived geometry -------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, int, int]:
        return tuple(int(n) for n in self.array.shape)  # type: ignore[return-value]

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def spacing(self) -> np.ndarray:
        """Voxel size in mm along i, j, k (norms of the affine's columns)."""
        return np.linalg.norm(self.affine[:3, :3], axis=0)

    @property
    def direction(self) -> np.ndarray:
        """3x3 matrix whose columns are the unit RAS directions of the i, j, k axes."""
        return self.affine[:3, :3] / self.spacing

    @property
    def origin(self) -> np.ndarray:
        """RAS position in mm of voxel (0, 0, 0)."""
        return self.affine[:3, 3].copy()

    # --- helpers ----------------------------------------------------------------------------
    def with_array(self, array: np.ndarray) -> "Volume":
        """A new Volume on the same grid with another array of the same shape."""
        array = np.asarray(array)
        if array.shape != self.array.shape:
            raise InputError(f"array shape {array.shape} does not match the grid {self.shape}")
        return Volume(array, self.affine.copy())

    def cropped(self, region: Tuple[slice, ...]) -> "Volume":
        """The voxels of ``region`` (three slices with starts) with the affine that keeps them in place."""
        start = np.array([r.start or 0 for r in region], dtype=np.float64)
        affine = self.affine.copy()
        affine[:3, 3] = self.affine[:3, :3] @ start + self.affine[:3, 3]
        return Volume(np.asarray(self.array)[tuple(region)], affine)

    def same_grid(self, other: "Volume", atol_mm: float = 1e-3) -> bool:
        """True when ``other`` has the same shape and an affine equal within ``atol_mm``."""
        return self.shape == other.shape and bool(np.allclose(self.affine, other.affine, atol=atol_mm))

    def world_coordinates(self, indices: np.ndarray) -> np.ndarray:
        """RAS mm of voxel indices given as an (N, 3) array."""
        indices = np.asarray(indices, dtype=np.float64)
        return indices @ self.affine[:3, :3].T + self.affine[:3, 3]

    def world_axis(self, axis: int) -> np.ndarray:
        """RAS coordinate ``axis`` (0 = R, 1 = A, 2 = S; mm) of every voxel centre, float32, the array's shape.

        Computed separably (A = a0 i + a1 j + a2 k + t), without an (N, 3) index array.
        """
        i, j, k = (np.arange(n, dtype=np.float32) for n in self.shape)
        row = self.affine[int(axis)]
        return (row[0] * i[:, None, None] + row[1] * j[None, :, None] + row[2] * k[None, None, :]
                + row[3]).astype(np.float32)

    def __repr__(self) -> str:
        spacing = ", ".join(f"{s:.3g}" for s in self.spacing)
        return f"Volume(shape={self.shape}, dtype={self.dtype}, spacing=({spacing}) mm)"


def require_same_grid(image: Volume, mask: Volume, what: str = "mask") -> None:
    """Raise :class:`InputError` unless ``mask`` lies on ``image``'s grid."""
    if image.shape != mask.shape:
        raise InputError(f"the {what} has shape {mask.shape} but the image has shape {image.shape}")
    if not np.allclose(image.affine, mask.affine, atol=1e-3):
        raise InputError(f"the {what} does not lie on the image's grid (its affine differs)")


def as_binary_mask(mask: Volume, what: str = "mask") -> Volume:
    """A uint8 0/1 Volume from any nonzero-is-inside mask; refuses NaNs and empty masks."""
    data = mask.array
    if np.issubdtype(data.dtype, np.floating) and not np.all(np.isfinite(data)):
        raise InputError(f"the {what} contains NaN or infinite values")
    binary = (data != 0).astype(np.uint8)
    if not binary.any():
        raise InputError(f"the {what} is empty (no nonzero voxel)")
    return mask.with_array(binary)


def require_usable_image(volume: Volume, what: str = "image") -> None:
    """Raise :class:`InputError` for NaN/Inf voxels or an image with a single value everywhere."""
    data = volume.array
    if data.size == 0:
        raise InputError(f"the {what} is empty (no voxels)")
    if np.issubdtype(data.dtype, np.floating) and not np.all(np.isfinite(data)):
        raise InputError(f"the {what} contains NaN or infinite voxel values")
    if np.all(data == data.flat[0]):
        raise InputError(f"the {what} is constant (every voxel is {data.flat[0]}); there is no head in it")
