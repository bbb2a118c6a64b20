"""The PSNR-difference anonymity criterion (lesion-preserving latent diffusion paper, sec. 4.5).

For an anonymized image ``x^_i`` made from the real image ``x_i`` and another real image ``x_j``::

    Anony(x^_i) = PSNR(x^_i, x_i) - PSNR(x^_i, x_j) = 10 log10( MSE(x^_i, x_j) / MSE(x^_i, x_i) )

Large = the anonymized image is much closer to its own source than to another person's image
(poor anonymity); small or negative = the source cannot be told apart (good anonymity).

Threshold: the paper assumes that the probability ``p`` of picking ``x_i`` as the source is
inversely proportional to the MSE, so ``MSE(x^, x_j) / MSE(x^, x_i) = p / (1 - p)`` and the
threshold is ``log(p / (1 - p))`` in the PSNR's units. The paper writes PSNR as
``20 log10(MAX^2 / MSE)`` (a typo: it doubles every dB figure) and so gets 7.36 dB for p = 0.7.
AnonMRI's PSNR is the standard ``10 log10(MAX^2 / MSE)`` (:mod:`.image_metrics`), so the same
criterion — an MSE ratio of at most 0.7 / 0.3 = 2.33 — is ``10 log10(2.33) = 3.68`` dB here
(:data:`DEFAULT_THRESHOLD_DB`). An image is anonymized when its score is at or below the threshold.
"""
from typing import Union

import numpy as np

from ..errors import InputError

ArrayOrFloat = Union[np.ndarray, float]

#: the paper's discriminant probability p
DEFAULT_PROBABILITY = 0.7


def threshold_db(probability: float = DEFAULT_PROBABILITY) -> float:
    """The criterion's threshold in dB (10 log10 convention) for a discriminant probability in (0, 1)."""
    if not 0.0 < probability < 1.0:
        raise InputError("the discriminant probability must lie strictly between 0 and 1")
    return float(10.0 * np.log10(probability / (1.0 - probability)))


#: threshold for p = 0.7 (3.68 dB; the paper's 7.36 dB in its doubled-dB convention)
DEFAULT_THRESHOLD_DB = threshold_db(DEFAULT_PROBABILITY)


def anonymity_score(anonymized: np.ndarray, original: np.ndarray, other: np.ndarray,
                    data_range: float = 1.0) -> ArrayOrFloat:
    """``PSNR(anonymized, original) - PSNR(anonymized, other)`` in dB, per image.

    Arrays (H, W) or batches (N, H, W) of the same shape. Identical anonymized and original
    images give +inf (no anonymity at all); an anonymized image identical to ``other`` gives -inf.
    """
    from .image_metrics import psnr

    anonymized, original, other = (np.asarray(a, dtype=np.float64) for a in (anonymized, original, other))
    if not (anonymized.shape == original.shape == other.shape):
        raise InputError(f"images of different shapes: {anonymized.shape}, {original.shape}, {other.shape}")
    with np.errstate(invalid="ignore"):
        values = np.asarray(psnr(anonymized, original, data_range)) - np.asarray(psnr(anonymized, other, data_range))
    # inf - inf (all three identical): indistinguishable, difference 0
    values = np.where(np.isnan(values), 0.0, values)
    return float(values) if values.ndim == 0 else values


def is_anonymized(score_db: ArrayOrFloat, threshold: float = DEFAULT_THRESHOLD_DB) -> Union[bool, np.ndarray]:
    """True where the anonymity score is at or below ``threshold`` dB."""
    result = np.asarray(score_db) <= threshold
    return bool(result) if result.ndim == 0 else result
