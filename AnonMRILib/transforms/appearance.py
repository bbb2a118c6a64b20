"""Give generated voxels the input's intensity scale and sharpness (lesion pipeline, whole volumes).

A slice generated at model resolution (64 px over 240 mm: 3.75 mm pixels for the shipped models)
and interpolated onto a 0.8 mm grid is smooth and on the model's intensity scale. Two global,
per-volume corrections, both measured on the region being regenerated only:

* :func:`match_histogram` -- quantile mapping of the generated values onto the input's values in
  the same region (1,001 quantiles; skimage's ``match_histograms`` without its 2-D restriction).
  Only the input's intensity *distribution* is used, not where a value lies.
* :func:`estimate_noise_sigma` -- the input's noise level inside the region (Immerkaer 1996's
  Laplacian-difference operator, made robust to edges with the median: sigma = median |L| /
  (6 * 0.6745)); :func:`match_sharpness` adds seeded Gaussian noise of that level to the
  generated voxels (a real scan is never noise-free; a noiseless brain is a tell);
* :func:`match_sharpness` -- then unsharp masking ``g + a (g - G_sigma g)`` in-plane, with the
  amount ``a`` in [0, ``max_amount``] found by bisection so that the mean in-plane gradient
  magnitude inside the region equals the input's times ``target_ratio`` (``a = 0`` when the noise
  alone reaches it). This restores *edge contrast* and noise texture; it cannot add anatomical
  detail finer than the model's pixels -- say so wherever the sharpness ratio is reported.
  The result is floored at the input's darkest value in the region: noise and the unsharp mask's
  undershoot beside bright vessels and dura drew values below zero (435 voxels down to -124 on
  pyradiomics' brain1, a magnitude image whose darkest brain voxel is 0), which no MR magnitude image
  has and on which N4 silently fits nothing.

Order: histogram mapping of the smooth generated image, then noise, then sharpening (mapping
after sharpening would undo it: a rank-preserving map of a smooth image stays smooth).

Arrays are (N, H, W) stacks of slices, float; masks bool of the same shape.
"""
from typing import Tuple

import numpy as np


def match_histogram(generated: np.ndarray, reference: np.ndarray, generated_mask: np.ndarray,
                    reference_mask: np.ndarray, quantiles: int = 1001) -> np.ndarray:
    """``generated`` with its values in ``generated_mask`` mapped monotonically onto the distribution
    of ``reference`` in ``reference_mask`` (other voxels unchanged)."""
    out = np.array(generated, dtype=np.float64, copy=True)
    source, target = out[generated_mask], np.asarray(reference, dtype=np.float64)[reference_mask]
    if source.size == 0 or target.size == 0:
        return out
    levels = np.linspace(0.0, 100.0, quantiles)
    source_q, target_q = np.percentile(source, levels), np.percentile(target, levels)
    source_q = source_q + np.arange(quantiles) * 1e-9 * max(1.0, float(np.ptp(source_q)))  # strictly increasing
    out[generated_mask] = np.interp(source, source_q, target_q)
    return out


def mean_gradient(stack: np.ndarray, mask: np.ndarray) -> float:
    """Mean in-plane gradient magnitude of ``stack`` (N, H, W) over ``mask`` (0 when it is empty).
    Computed on the mask's bounding box plus one pixel in-plane (central differences read one
    neighbour: the same numbers as on the whole stack, without its allocations)."""
    from .distance import bounding_box

    mask = np.asarray(mask, bool)
    extent = bounding_box(mask)
    if extent is None:
        return 0.0
    low, high = extent
    box = (slice(int(low[0]), int(high[0]) + 1),) + tuple(
        slice(max(int(a) - 1, 0), min(int(b) + 2, n)) for a, b, n in zip(low[1:], high[1:], mask.shape[1:]))
    rows, cols = np.gradient(np.asarray(stack[box], dtype=np.float64), axis=(1, 2))
    inside = mask[box]
    return float(np.sqrt(rows[inside] ** 2 + cols[inside] ** 2).sum() / int(inside.sum()))


def estimate_noise_sigma(stack: np.ndarray, mask: np.ndarray) -> float:
    """Noise standard deviation of ``stack`` (N, H, W) inside ``mask``: median absolute response of
    Immerkaer's 3x3 operator [[1,-2,1],[-2,4,-2],[1,-2,1]] (std 6 sigma for white noise) / (6 * 0.6745)."""
    from scipy import ndimage

    kernel = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], dtype=np.float64)[None]
    response = ndimage.convolve(np.asarray(stack, dtype=np.float64), kernel, mode="nearest")
    structure = np.zeros((3, 3, 3), dtype=bool)
    structure[1] = True
    inner = ndimage.binary_erosion(mask, structure=structure)
    if not inner.any():
        return 0.0
    return float(np.median(np.abs(response[inner])) / (6.0 * 0.6745))


def match_sharpness(generated: np.ndarray, reference: np.ndarray, generated_mask: np.ndarray,
                    reference_mask: np.ndarray, sigma_px: Tuple[float, float], target_ratio: float = 1.0,
                    max_amount: float = 4.0, iterations: int = 20, match_intensity: bool = True,
                    add_noise: bool = True, seed: int = 0, erosion_px: int = 2) -> Tuple[np.ndarray, dict]:
    """(``generated`` histogram-matched, with the input's noise level and sharpened, details). Only
    voxels in ``generated_mask`` change. ``sigma_px``: in-plane Gaussian sigma (rows, cols) in pixels,
    about half the model pixel in input pixels. Sharpness is measured on the interior of the masks
    (eroded in-plane by ``erosion_px``, as :mod:`AnonMRILib.evaluation.realism` does, so the region's
    own edge does not count). The changed voxels are never darker than ``reference``'s darkest in
    ``reference_mask``. Details: amount, noise sigma, sharpness ratio reached."""
    from scipy import ndimage

    generated = np.asarray(generated, dtype=np.float64)
    if match_intensity:
        generated = match_histogram(generated, reference, generated_mask, reference_mask)
    detail = generated - ndimage.gaussian_filter(generated, (0.0, float(sigma_px[0]), float(sigma_px[1])))
    noise_sigma = estimate_noise_sigma(reference, reference_mask) if add_noise else 0.0
    noise = noise_sigma * np.random.default_rng(seed).standard_normal(generated.shape) if noise_sigma > 0 else 0.0
    structure = np.zeros((3, 3, 3), dtype=bool)
    structure[1] = True
    inner_generated = ndimage.binary_erosion(generated_mask, structure=structure, iterations=erosion_px)
    inner_reference = ndimage.binary_erosion(reference_mask, structure=structure, iterations=erosion_px)
    reference_sharpness = mean_gradient(reference, inner_reference)
    goal = target_ratio * reference_sharpness

    floor = float(np.asarray(reference)[reference_mask].min()) if np.any(reference_mask) else -np.inf

    def render(amount: float) -> np.ndarray:
        return np.where(generated_mask, np.maximum(generated + amount * detail + noise, floor), generated)

    sharpness = _sharpness_of_amount(generated + noise, detail, inner_generated) if erosion_px >= 1 else \
        (lambda amount: mean_gradient(render(amount), inner_generated))
    low, high = 0.0, float(max_amount)
    if sharpness(low) >= goal:
        high = low
    elif sharpness(high) > goal:
        for _ in range(iterations):
            middle = 0.5 * (low + high)
            if sharpness(middle) < goal:
                low = middle
            else:
                high = middle
    out = render(high)
    reached = mean_gradient(out, inner_generated) / reference_sharpness if reference_sharpness > 0 else float("nan")
    return out, {"sharpening_amount": round(high, 3), "noise_sigma": noise_sigma, "sharpness_ratio_reached": reached}


def _sharpness_of_amount(base: np.ndarray, detail: np.ndarray, inner: np.ndarray):
    """``amount -> mean_gradient(base + amount * detail, inner)`` from two gradients computed once.

    Exact for the bisection of :func:`match_sharpness`: ``inner`` is its mask eroded in-plane by at
    least one pixel, so every central difference at an ``inner`` voxel reads voxels inside the mask,
    where the rendered image is ``base + amount * detail``, and the gradient is linear in amount
    (the same numbers as rendering and differentiating the whole stack 20 times, up to rounding and
    the render's floor at the input's darkest value, which only the rare undershoots reach)."""
    count = int(inner.sum())
    if not count:
        return lambda amount: 0.0
    base_rows, base_cols = (g[inner] for g in np.gradient(np.asarray(base, dtype=np.float64), axis=(1, 2)))
    detail_rows, detail_cols = (g[inner] for g in np.gradient(np.asarray(detail, dtype=np.float64), axis=(1, 2)))

    def sharpness(amount: float) -> float:
        rows = base_rows + amount * detail_rows
        cols = base_cols + amount * detail_cols
        return float(np.sqrt(rows ** 2 + cols ** 2).sum() / count)

    return sharpness
