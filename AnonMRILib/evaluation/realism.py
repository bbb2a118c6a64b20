"""Realism guard next to the anonymity criterion: sharpness and brain-area ratios.

The PSNR-difference criterion (:mod:`.anonymity`) passes any image that is about equally far from
every patient -- a blurred, shrunken or darkened slice is. The guard measures, per slice (2-D
arrays, batches (N, H, W)) or per volume (pooled over its slices):

* **sharpness** = mean in-plane gradient magnitude (central differences, intensity units per
  pixel) over the *interior* of the brain: the image's own foreground (pixels above
  ``foreground``) eroded by ``erosion_px`` pixels, so that the brain/background edge -- which every
  method keeps, blurred or not -- does not dominate; the image's own mask, so a shrunken brain is
  not measured on the background;
* **sharpness ratio** = sharpness(generated) / sharpness(real); below 1 = blurrier than the input;
* **brain-area ratio** = foreground pixel count of generated / real.

:class:`RealismCriterion` turns both into a yes/no per slice: sharpness ratio in
[0.8, 1.25] and area ratio in [0.6, 1 / 0.6]. The lower sharpness bound is the issue's; the upper
one (1 / 0.8) keeps additive noise, which adds gradient everywhere, from counting as realistic;
the 60 % area bound is the one the evaluation already used for "degenerate" slices. Only images
that pass the anonymity criterion *and* this one count as "anonymized and realistic".

Images must be on the same intensity scale (e.g. both in [0, 1]) and the same pixel grid; the
foreground threshold is in those units (0.05 for the [0, 1] model slices).
"""
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np

from ..errors import InputError


@dataclass(frozen=True)
class RealismCriterion:
    """Bounds of a realistic output relative to its input (module docstring)."""

    min_sharpness_ratio: float = 0.8
    max_sharpness_ratio: float = 1.25
    min_area_ratio: float = 0.6
    max_area_ratio: float = 1.0 / 0.6
    foreground: float = 0.05
    erosion_px: int = 2


def _batch(images: np.ndarray) -> np.ndarray:
    images = np.asarray(images, dtype=np.float32)
    if images.ndim == 2:
        return images[None]
    if images.ndim != 3:
        raise InputError(f"expected (H, W) or (N, H, W) images, got shape {images.shape}")
    return images


def foreground_mask(images: np.ndarray, foreground: float = 0.05) -> np.ndarray:
    """(N, H, W) bool: pixels above ``foreground``."""
    return _batch(images) > foreground


def interior_mask(images: np.ndarray, foreground: float = 0.05, erosion_px: int = 2) -> np.ndarray:
    """(N, H, W) bool: the foreground eroded in-plane by ``erosion_px`` pixels (3x3 structure)."""
    from scipy import ndimage

    mask = foreground_mask(images, foreground)
    if erosion_px <= 0:
        return mask
    structure = np.zeros((3, 3, 3), dtype=bool)
    structure[1] = True
    return ndimage.binary_erosion(mask, structure=structure, iterations=int(erosion_px))


def gradient_magnitude(images: np.ndarray) -> np.ndarray:
    """(N, H, W) in-plane gradient magnitude (central differences, one-sided at the border)."""
    batch = _batch(images)
    rows, cols = np.gradient(batch, axis=(1, 2))
    return np.sqrt(rows ** 2 + cols ** 2)


def _sharpness_parts(images: np.ndarray, foreground: float, erosion_px: int, region: Optional[np.ndarray] = None):
    """Per-slice (sum of gradient magnitude over the interior, interior pixel count). ``region``:
    a given (N, H, W) mask eroded instead of the image's own foreground."""
    from scipy import ndimage

    magnitude = gradient_magnitude(images)
    if region is None:
        interior = interior_mask(images, foreground, erosion_px)
    else:
        interior = np.asarray(region, dtype=bool).reshape(magnitude.shape)
        if erosion_px > 0:
            structure = np.zeros((3, 3, 3), dtype=bool)
            structure[1] = True
            interior = ndimage.binary_erosion(interior, structure=structure, iterations=int(erosion_px))
    return (magnitude * interior).sum(axis=(1, 2)).astype(np.float64), interior.sum(axis=(1, 2)).astype(np.float64)


def sharpness(images: np.ndarray, foreground: float = 0.05, erosion_px: int = 2) -> np.ndarray:
    """(N,) mean gradient magnitude inside each slice's brain interior (NaN where it is empty)."""
    total, count = _sharpness_parts(images, foreground, erosion_px)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1.0), np.nan)


def sharpness_ratio(generated: np.ndarray, real: np.ndarray, foreground: float = 0.05,
                    erosion_px: int = 2) -> np.ndarray:
    """(N,) sharpness(generated) / sharpness(real) per slice; NaN where the real slice has no
    interior, 0 where only the generated one has none."""
    _check_pair(generated, real)
    ours = np.nan_to_num(sharpness(generated, foreground, erosion_px), nan=0.0)
    theirs = sharpness(real, foreground, erosion_px)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isfinite(theirs) & (theirs > 0), ours / np.where(theirs > 0, theirs, 1.0), np.nan)


def area_ratio(generated: np.ndarray, real: np.ndarray, foreground: float = 0.05) -> np.ndarray:
    """(N,) foreground pixel count of generated / real per slice (NaN where the real one is empty)."""
    _check_pair(generated, real)
    ours = foreground_mask(generated, foreground).sum(axis=(1, 2)).astype(np.float64)
    theirs = foreground_mask(real, foreground).sum(axis=(1, 2)).astype(np.float64)
    return np.where(theirs > 0, ours / np.maximum(theirs, 1.0), np.nan)


def volume_ratios(generated: np.ndarray, real: np.ndarray, criterion: RealismCriterion = RealismCriterion(),
                  region: Optional[np.ndarray] = None) -> Dict[str, float]:
    """Per-volume sharpness and area ratios: slices (N, H, W) of one volume pooled (gradient sums
    and pixel counts added over slices before dividing). ``region`` (N, H, W): measure the
    sharpness of both inside this mask (e.g. the brain mask of a whole-head scan, whose intensities
    are not above a fixed foreground threshold) instead of each image's own foreground."""
    _check_pair(generated, real)
    g_total, g_count = _sharpness_parts(generated, criterion.foreground, criterion.erosion_px, region)
    r_total, r_count = _sharpness_parts(real, criterion.foreground, criterion.erosion_px, region)
    g_sharp = g_total.sum() / max(g_count.sum(), 1.0)
    r_sharp = r_total.sum() / max(r_count.sum(), 1.0)
    g_area = foreground_mask(generated, criterion.foreground).sum()
    r_area = foreground_mask(real, criterion.foreground).sum()
    return {"sharpness_ratio": float(g_sharp / r_sharp) if r_sharp > 0 else float("nan"),
            "area_ratio": float(g_area / r_area) if r_area > 0 else float("nan")}


def is_realistic(generated: np.ndarray, real: np.ndarray, criterion: RealismCriterion = RealismCriterion()
                 ) -> np.ndarray:
    """(N,) bool: both ratios inside the criterion's bounds (False where undefined)."""
    sharp = sharpness_ratio(generated, real, criterion.foreground, criterion.erosion_px)
    area = area_ratio(generated, real, criterion.foreground)
    with np.errstate(invalid="ignore"):
        return ((sharp >= criterion.min_sharpness_ratio) & (sharp <= criterion.max_sharpness_ratio)
                & (area >= criterion.min_area_ratio) & (area <= criterion.max_area_ratio))


def realism_summary(generated: np.ndarray, real: np.ndarray, criterion: RealismCriterion = RealismCriterion(),
                    anonymized: Optional[np.ndarray] = None, groups: Optional[np.ndarray] = None) -> Dict[str, float]:
    """Medians of the per-slice ratios, the fraction of slices with sharpness ratio >= the lower
    bound, the realistic fraction and, given ``anonymized`` (N,) bool from the anonymity
    criterion, the "anonymized and realistic" rate. ``groups`` (N,) (e.g. patient ids): also the
    median over groups of the per-volume ratios (:func:`volume_ratios`)."""
    sharp = sharpness_ratio(generated, real, criterion.foreground, criterion.erosion_px)
    area = area_ratio(generated, real, criterion.foreground)
    realistic = is_realistic(generated, real, criterion)
    with np.errstate(invalid="ignore"):
        summary = {"median_sharpness_ratio": float(np.nanmedian(sharp)) if np.isfinite(sharp).any() else float("nan"),
                   "fraction_sharpness_ok": float(np.mean(sharp >= criterion.min_sharpness_ratio)),
                   "median_area_ratio": float(np.nanmedian(area)) if np.isfinite(area).any() else float("nan"),
                   "fraction_realistic": float(np.mean(realistic))}
    if anonymized is not None:
        summary["rate_anonymized_and_realistic"] = float(np.mean(np.asarray(anonymized, dtype=bool) & realistic))
    if groups is not None:
        groups = np.asarray(groups)
        per_volume = [volume_ratios(generated[groups == g], real[groups == g], criterion) for g in np.unique(groups)]
        summary["median_volume_sharpness_ratio"] = float(np.nanmedian([v["sharpness_ratio"] for v in per_volume]))
        summary["median_volume_area_ratio"] = float(np.nanmedian([v["area_ratio"] for v in per_volume]))
    return summary


def _check_pair(generated: np.ndarray, real: np.ndarray) -> None:
    if np.shape(generated) != np.shape(real):
        raise InputError(f"generated {np.shape(generated)} and real {np.shape(real)} images differ in shape")
