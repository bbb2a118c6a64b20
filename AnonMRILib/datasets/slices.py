"""A set of 2-D axial lesion slices: the common format of training and evaluation data.

Images are float32 in [0, 1] (see :func:`normalize_intensity`), masks uint8 in {0, 1} (any
tumour label = 1), grades int64 (0 = LGG, 1 = HGG), depths float32 in [0, 1] (slice index /
(number of slices - 1) in the source volume, inferior -> superior), patients int64 (one id per
source volume; splits are always by patient).
"""
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import numpy as np

GRADES = ("LGG", "HGG")


@dataclass
class LesionSliceSet:
    """N slices of one size S: images (N, S, S) float32, masks (N, S, S) uint8, grades, depths, patients."""

    images: np.ndarray
    masks: np.ndarray
    grades: np.ndarray
    depths: np.ndarray
    patients: np.ndarray

    def __post_init__(self) -> None:
        self.images = np.asarray(self.images, dtype=np.float32)
        self.masks = np.asarray(self.masks, dtype=np.uint8)
        self.grades = np.asarray(self.grades, dtype=np.int64)
        self.depths = np.asarray(self.depths, dtype=np.float32)
        self.patients = np.asarray(self.patients, dtype=np.int64)
        n = len(self.images)
        if self.images.ndim != 3 or self.masks.shape != self.images.shape:
            raise ValueError(f"images {self.images.shape} and masks {self.masks.shape} must be (N, S, S) alike")
        for name in ("grades", "depths", "patients"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} must have shape ({n},)")

    def __len__(self) -> int:
        return len(self.images)

    @property
    def image_size(self) -> int:
        return int(self.images.shape[-1])

    def subset(self, indices: Union[np.ndarray, Sequence[int]]) -> "LesionSliceSet":
        indices = np.asarray(indices)
        return LesionSliceSet(*(getattr(self, f.name)[indices] for f in fields(self)))

    def of_patients(self, patient_ids: Sequence[int]) -> "LesionSliceSet":
        return self.subset(np.flatnonzero(np.isin(self.patients, np.asarray(patient_ids))))

    def with_lesion(self) -> "LesionSliceSet":
        return self.subset(np.flatnonzero(self.masks.reshape(len(self), -1).any(axis=1)))

    def resized(self, size: int) -> "LesionSliceSet":
        """The slices resampled to ``size`` x ``size`` (images: area/bilinear, masks: nearest)."""
        if size == self.image_size:
            return self
        images = resize_slices(self.images, size, order=1)
        masks = (resize_slices(self.masks.astype(np.float32), size, order=1) >= 0.5).astype(np.uint8)
        return LesionSliceSet(np.clip(images, 0, 1), masks, self.grades, self.depths, self.patients)

    def save(self, path: Union[str, Path]) -> None:
        np.savez_compressed(str(path), **{f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def load(cls, path: Union[str, Path]) -> "LesionSliceSet":
        with np.load(str(path)) as data:
            return cls(**{f.name: data[f.name] for f in fields(cls)})

    @classmethod
    def concatenate(cls, sets: Sequence["LesionSliceSet"]) -> "LesionSliceSet":
        return cls(*(np.concatenate([getattr(s, f.name) for s in sets]) for f in fields(cls)))


def resize_slices(slices: np.ndarray, size: int, order: int = 1) -> np.ndarray:
    """(N, H, W) -> (N, size, size) float32; anti-aliased when shrinking (skimage)."""
    from skimage.transform import resize

    slices = np.asarray(slices, dtype=np.float32)
    if slices.shape[1:] == (size, size):
        return slices.copy()
    shrinking = slices.shape[1] > size or slices.shape[2] > size
    out = np.empty((len(slices), size, size), dtype=np.float32)
    for index, image in enumerate(slices):
        out[index] = resize(image, (size, size), order=order, mode="edge", anti_aliasing=shrinking and order > 0,
                            preserve_range=True)
    return out


def intensity_window(array: np.ndarray, upper_percentile: float = 99.5) -> Tuple[float, float]:
    """(low, high) intensities mapped to 0 and 1: the volume minimum and the ``upper_percentile`` of
    the voxels above it (the foreground). Falls back to the maximum for near-empty volumes."""
    array = np.asarray(array)
    low = float(array.min())
    foreground = array[array > low]
    if foreground.size == 0:
        return low, low + 1.0
    high = float(np.percentile(foreground, upper_percentile))
    if high <= low:
        high = float(foreground.max())
    return low, high


def normalize_intensity(array: np.ndarray, window: Optional[Tuple[float, float]] = None) -> np.ndarray:
    """``array`` mapped linearly so ``window`` (default :func:`intensity_window`) becomes [0, 1], clipped."""
    low, high = intensity_window(array) if window is None else window
    return np.clip((np.asarray(array, dtype=np.float32) - low) / (high - low), 0.0, 1.0).astype(np.float32)


def patient_split(patient_ids: Sequence[int], fractions: Tuple[float, ...] = (0.8, 0.1, 0.1),
                  seed: int = 0) -> Tuple[np.ndarray, ...]:
    """Disjoint arrays of patient ids, one per fraction, from a seeded permutation."""
    ids = np.unique(np.asarray(patient_ids))
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError("fractions must sum to 1")
    order = np.random.default_rng(seed).permutation(ids)
    bounds = np.round(np.cumsum((0.0,) + tuple(fractions)) * len(ids)).astype(int)
    return tuple(np.sort(order[bounds[i]:bounds[i + 1]]) for i in range(len(fractions)))
