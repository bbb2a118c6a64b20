"""Brain-analysis agreement: whole-head tissue segmentation on original and anonymized scans.

The CP-GAN paper (Table 1) runs FSL SIENAX on the original and on each de-identified scan and
compares the segmentations with Dice and IoU. SIENAX is not a Python package, so this module
builds the analogue from AnonMRI's own pieces and scikit-image; like SIENAX it starts from the
WHOLE HEAD, so a de-identification method that disturbs brain extraction shows up:

1. brain extraction: :func:`AnonMRILib.transforms.brain_mask.brain_mask` computed afresh on the
   scan given (never the mask the anonymizer preserved);
2. tissue classification inside that mask: three classes by multi-level Otsu thresholds
   (``skimage.filters.threshold_multiotsu``) of the brain voxels' intensities, which for a T1 are
   CSF (darkest), grey matter, white matter (brightest);
3. labels: 0 background, 1 CSF, 2 grey matter, 3 white matter; BRAIN = labels 1-3.

:func:`tissue_agreement` gives Dice = 2|A n B| / (|A| + |B|) and IoU = |A n B| / |A u B| per tissue
(1.0 when both are empty). Segmentations are compared voxel by voxel on the original's grid, so
the anonymized scan must lie on the same grid.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import numpy as np

from ..errors import InputError
from ..io.volume import Volume, require_same_grid
from ..progress import ProgressCallback, report, sub_progress

#: label values of :func:`segment_tissues`
CSF, GREY, WHITE = 1, 2, 3
#: reported tissues, in the order of the paper's Table 1 (BRAIN = CSF + GREY + WHITE)
TISSUES = ("BRAIN", "CSF", "WHITE", "GREY")


@dataclass(frozen=True)
class TissueSegmentationConfig:
    """``brain_mask_backend`` is passed to :func:`AnonMRILib.transforms.brain_mask.brain_mask`;
    ``histogram_bins`` is the number of bins of the multi-Otsu histogram."""

    brain_mask_backend: str = "auto"
    histogram_bins: int = 256


def classify_brain_tissues(volume: Volume, brain: Volume, config: Optional[TissueSegmentationConfig] = None
                           ) -> Volume:
    """Labels (uint8: 0 background, 1 CSF, 2 grey, 3 white) of ``volume`` inside the ``brain`` mask."""
    from skimage.filters import threshold_multiotsu

    config = config or TissueSegmentationConfig()
    require_same_grid(volume, brain, what="brain mask")
    inside = brain.array != 0
    labels = np.zeros(volume.shape, dtype=np.uint8)
    values = volume.array[inside].astype(np.float64)
    if values.size < 3 or np.all(values == values[0]):
        labels[inside] = GREY
        return volume.with_array(labels)
    try:
        low, high = threshold_multiotsu(values, classes=3, nbins=config.histogram_bins)
    except ValueError:  # fewer distinct values than classes
        low = high = float(np.median(values))
    labels[inside] = np.where(values <= low, CSF, np.where(values <= high, GREY, WHITE)).astype(np.uint8)
    return volume.with_array(labels)


def segment_tissues(volume: Volume, config: Optional[TissueSegmentationConfig] = None,
                    brain_mask_function: Optional[Callable[[Volume], Volume]] = None,
                    progress: Optional[ProgressCallback] = None) -> Volume:
    """Whole head -> brain extraction -> CSF / grey / white labels (see module doc).

    ``brain_mask_function(volume) -> Volume`` replaces the brain extraction (tests, or another
    tool); by default :func:`~AnonMRILib.transforms.brain_mask.brain_mask` with the config's backend.
    """
    config = config or TissueSegmentationConfig()
    report(progress, 0.0, "brain extraction")
    if brain_mask_function is None:
        from ..transforms.brain_mask import brain_mask

        brain = brain_mask(volume, backend=config.brain_mask_backend, progress=sub_progress(progress, 0.0, 0.9))
    else:
        brain = brain_mask_function(volume)
    report(progress, 0.9, "tissue classification")
    labels = classify_brain_tissues(volume, brain, config)
    report(progress, 1.0, "tissues segmented")
    return labels


def tissue_masks(labels: np.ndarray) -> Dict[str, np.ndarray]:
    """Boolean masks of the reported tissues from a label array."""
    labels = np.asarray(labels)
    return {"BRAIN": labels > 0, "CSF": labels == CSF, "WHITE": labels == WHITE, "GREY": labels == GREY}


def overlap(a: np.ndarray, b: np.ndarray) -> Dict[str, float]:
    """Dice and IoU of two boolean masks (both 1.0 when both masks are empty)."""
    a = np.asarray(a, dtype=bool)
    b = np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise InputError(f"cannot compare masks of shapes {a.shape} and {b.shape}")
    intersection = float(np.count_nonzero(a & b))
    total = float(np.count_nonzero(a) + np.count_nonzero(b))
    union = total - intersection
    if total == 0:
        return {"dice": 1.0, "iou": 1.0}
    return {"dice": 2.0 * intersection / total, "iou": intersection / union}


def tissue_agreement(reference: Volume, other: Volume) -> Dict[str, Dict[str, float]]:
    """Dice and IoU per tissue between two label volumes on the same grid."""
    require_same_grid(reference, other, what="segmentation of the anonymized scan")
    masks_a, masks_b = tissue_masks(reference.array), tissue_masks(other.array)
    return {tissue: overlap(masks_a[tissue], masks_b[tissue]) for tissue in TISSUES}
