"""Image similarity of 2-D slices: MSE, PSNR and SSIM (scikit-image), for images in [0, data_range].

All functions take arrays of shape (H, W) or batches (N, H, W) and return per-image values
(float or (N,) array). PSNR = 10 log10(data_range^2 / MSE) in dB (the usual definition; the
paper's eq. 20 writes 20 log10(MAX^2 / MSE), a typo that would double every figure); an MSE of 0
gives +inf.
"""
from typing import Dict, Union

import numpy as np

ArrayOrFloat = Union[np.ndarray, float]


def _batch(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a[None] if a.ndim == 2 else a


def _unbatch(values: np.ndarray, like: np.ndarray) -> ArrayOrFloat:
    return float(values[0]) if np.asarray(like).ndim == 2 else values


def mse(a: np.ndarray, b: np.ndarray) -> ArrayOrFloat:
    """Mean squared error per image."""
    batch_a, batch_b = _batch(a), _batch(b)
    return _unbatch(((batch_a - batch_b) ** 2).reshape(len(batch_a), -1).mean(axis=1), a)


def psnr(a: np.ndarray, b: np.ndarray, data_range: float = 1.0) -> ArrayOrFloat:
    """Peak signal-to-noise ratio per image in dB."""
    errors = np.atleast_1d(mse(_batch(a), _batch(b)))
    with np.errstate(divide="ignore"):
        values = 10.0 * np.log10(data_range ** 2 / errors)
    return _unbatch(values, a)


def ssim(a: np.ndarray, b: np.ndarray, data_range: float = 1.0) -> ArrayOrFloat:
    """Structural similarity per image (scikit-image defaults: 7x7 uniform window)."""
    from skimage.metrics import structural_similarity

    batch_a, batch_b = _batch(a), _batch(b)
    values = np.array([structural_similarity(x, y, data_range=data_range) for x, y in zip(batch_a, batch_b)])
    return _unbatch(values, a)


def summarize(a: np.ndarray, b: np.ndarray, data_range: float = 1.0) -> Dict[str, float]:
    """Mean MSE, PSNR (finite values) and SSIM over a batch."""
    p = np.atleast_1d(psnr(a, b, data_range))
    return {"mse": float(np.mean(np.atleast_1d(mse(a, b)))),
            "psnr": float(np.mean(p[np.isfinite(p)])) if np.isfinite(p).any() else float("inf"),
            "ssim": float(np.mean(np.atleast_1d(ssim(a, b, data_range))))}
