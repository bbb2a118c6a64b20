"""Consistency of a volume along its slice axis: adjacent-slice correlation.

The paper generates every axial slice independently, so neighbouring slices of an anonymized
volume can come from different anatomies. :func:`adjacent_slice_correlation` measures it: for each
pair of neighbouring slices (k, k+1) of an (N, H, W) stack ordered along the slice axis, the Pearson
correlation of their pixels over the union of their foregrounds (pixels above ``foreground`` in
either slice; the shared zero background would inflate it). Real volumes score high (anatomy
changes slowly from one millimetre to the next); independently generated ones lower. Compare a
generated volume with its real source on the same slices (:func:`consistency_summary`).
"""
from typing import Dict, Sequence

import numpy as np

from ..errors import InputError


def adjacent_slice_correlation(slices: np.ndarray, foreground: float = 0.05, min_pixels: int = 10) -> np.ndarray:
    """(N - 1,) correlation of each slice with the next (NaN where fewer than ``min_pixels``
    foreground pixels or a constant slice)."""
    stack = np.asarray(slices, dtype=np.float64)
    if stack.ndim != 3:
        raise InputError(f"expected an (N, H, W) stack of slices, got shape {stack.shape}")
    values = np.full(max(len(stack) - 1, 0), np.nan)
    for k in range(len(stack) - 1):
        a, b = stack[k], stack[k + 1]
        region = (a > foreground) | (b > foreground)
        if region.sum() < min_pixels:
            continue
        x, y = a[region] - a[region].mean(), b[region] - b[region].mean()
        norm = np.sqrt((x ** 2).sum() * (y ** 2).sum())
        if norm > 0:
            values[k] = float((x * y).sum() / norm)
    return values


def consistency_summary(generated: Sequence[np.ndarray], real: Sequence[np.ndarray],
                        foreground: float = 0.05) -> Dict[str, float]:
    """Mean adjacent-slice correlation of generated and real volumes (each an (N, H, W) stack; the
    mean over a volume's pairs, then over volumes) and their ratio (1 = as consistent as real)."""
    if len(generated) != len(real) or not len(real):
        raise InputError("give as many generated as real volumes (at least one)")
    ours = [float(np.nanmean(adjacent_slice_correlation(g, foreground))) for g in generated]
    theirs = [float(np.nanmean(adjacent_slice_correlation(r, foreground))) for r in real]
    return {"generated": float(np.mean(ours)), "real": float(np.mean(theirs)),
            "ratio": float(np.mean(ours) / np.mean(theirs)), "per_volume_generated": ours, "per_volume_real": theirs}
