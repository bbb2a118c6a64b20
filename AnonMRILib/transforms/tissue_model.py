"""Tissue-label head model: what REFACE and CP-GAN's prior draw outside the brain, in the patient's contrast.

The anatomical prior T(x) (:mod:`AnonMRILib.transforms.anatomical_prior`) is a **label map** of one
real head's non-brain tissues carried under MakeHuman's skin (built by
``Training/make_reface_template.py``, see :mod:`reface_tissue_labels` there), plus that head's
within-class texture. It is *rendered* for each patient, per class, with intensities predicted
from the patient's own brain, which is part of gamma(x):

1. **the brain's levels** (:func:`brain_tissue_levels`): multi-Otsu (3 classes) of the brain
   voxels b*x, the median of each class = CSF, grey matter, white matter; the air level is the
   privacy transform's (median of the voxels below the head threshold);
2. **the tissue scale** s (:func:`to_tissue_scale`): a piecewise-linear axis fixed by those levels,
   air = 0, CSF = 1, GM = 2, WM = 3, and above WM by the ratio to WM (s = 3 + (I - WM) / (WM - air):
   fat and marrow are about k x WM in a T1, k measured on the source head). Each class c has a
   fixed level s_c on that scale, measured once on the source head (the median of its voxels;
   fat's is set by the prior's ``fat_level``: the source's 1.5 mm fat voxels read too dim), so
   the sequence's contrast comes from the patient's brain alone: e.g. fat, drawn at s = 3.7 (its
   level 3.35 stretched by the prior's ``bright_stretch``), is 1.7 x WM above air in any T1;
3. **per-class rendering** (:func:`render_tissue`): I(x) = from_tissue_scale(s_L(x) + t(x)), L the
   label, t the source head's own within-class texture on the tissue scale (clipped per class, so
   every boundary is the label map's, sharp at 1 mm);
4. **noise** (:func:`noise_sigma`, :func:`add_rician_noise`): seeded Rician noise at the patient's
   noise level, estimated from the brain's white matter (:func:`white_matter_noise`; Immerkaer's
   in-plane operator for thick slices), the part of the noise the rendered, resampled template
   lacks; it scales with the signal up to the CSF level and is absent in air (see the anatomical
   prior's step 9).

The relation is measured on a T1 head (CSF < GM < WM). On inputs with another order (a T2, where
CSF is brightest) each class still takes the level of its T1 analogue on the patient's scale:
the anatomy is right, the contrast of fat and bone is not that sequence's (a limitation).
"""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import InputError
from .distance import bounding_box

#: label values of the tissue model (index = value); "brain" is the template's own brain, drawn as CSF
CLASSES: Tuple[str, ...] = ("outside", "brain", "csf", "bone", "marrow", "fat", "muscle", "skin", "air",
                            "vitreous", "lens", "optic_nerve", "cord", "teeth", "mucosa", "dura", "diploe",
                            "vertebra", "disc")
LABEL: Dict[str, int] = {name: index for index, name in enumerate(CLASSES)}
#: tissue-scale knots of the brain's levels: air, CSF, grey matter, white matter
KNOTS: Tuple[float, ...] = (0.0, 1.0, 2.0, 3.0)


@dataclass(frozen=True)
class TissueLevels:
    """A scan's intensity levels (its units): air, CSF, grey matter (gm) and white matter (wm)."""

    air: float
    csf: float
    gm: float
    wm: float

    def __post_init__(self) -> None:
        if not all(np.isfinite(v) for v in (self.air, self.csf, self.gm, self.wm)):
            raise InputError("tissue levels must be finite numbers")
        if self.wm - self.air <= 0:
            raise InputError("the white-matter level must lie above the air level")

    def values(self) -> np.ndarray:
        """(air, csf, gm, wm) as float64."""
        return np.array([self.air, self.csf, self.gm, self.wm], np.float64)

    def scaled(self, gain: float, offset: float = 0.0) -> "TissueLevels":
        """Levels of ``gain * x + offset``."""
        a, c, g, w = self.values() * float(gain) + float(offset)
        return TissueLevels(a, c, g, w)


def brain_tissue_levels(brain_values: np.ndarray, air: float, bins: int = 256) -> TissueLevels:
    """CSF / GM / WM levels of a brain: medians of the three multi-Otsu classes of ``brain_values``
    (the voxels b*x, any units); ``air``: the scan's air level. A brain of fewer than three
    distinct values falls back to its percentiles 10 / 50 / 90."""
    from skimage.filters import threshold_multiotsu

    values = np.asarray(brain_values, np.float64).ravel()
    values = values[np.isfinite(values)]
    if values.size < 3:
        raise InputError("the brain mask holds fewer than 3 voxels; cannot measure its tissue levels")
    if values.size > 2_000_000:
        values = values[:: values.size // 2_000_000]
    levels = np.percentile(values, [10, 50, 90])
    try:
        low, high = threshold_multiotsu(values, classes=3, nbins=bins)
        classes = [values[values <= low], values[(values > low) & (values <= high)], values[values > high]]
        if all(c.size for c in classes):
            levels = np.array([np.median(c) for c in classes])
    except ValueError:  # fewer distinct values than classes
        pass
    wm = max(float(levels[2]), float(air) + 1e-6 * max(1.0, abs(float(air))))
    return TissueLevels(float(air), float(levels[0]), float(levels[1]), wm)


def _knots(levels: TissueLevels) -> np.ndarray:
    return levels.values()


def from_tissue_scale(s: np.ndarray, levels: TissueLevels) -> np.ndarray:
    """Intensity (``levels``' units, float32) of tissue-scale values ``s``: piecewise linear through
    (0, air), (1, CSF), (2, GM), (3, WM); above 3 by the ratio to WM, I = WM + (s - 3)(WM - air);
    below 0 with the air-to-CSF slope."""
    s = np.asarray(s, np.float32)
    air, csf, gm, wm = (np.float32(v) for v in _knots(levels))
    out = np.where(s < 1.0, air + s * (csf - air),
                   np.where(s < 2.0, csf + (s - 1.0) * (gm - csf),
                            np.where(s < 3.0, gm + (s - 2.0) * (wm - gm), wm + (s - 3.0) * (wm - air))))
    return out.astype(np.float32)


def to_tissue_scale(intensity: np.ndarray, levels: TissueLevels) -> np.ndarray:
    """Inverse of :func:`from_tissue_scale` (float32) for a T1-ordered scan (air < CSF < GM < WM)."""
    values = _knots(levels)
    if not np.all(np.diff(values) > 0):
        raise InputError("the tissue scale is only invertible for air < CSF < GM < WM (a T1 contrast)")
    x = np.asarray(intensity, np.float64)
    s = np.interp(x, values, KNOTS)
    below = x < values[0]
    s = np.where(below, (x - values[0]) / (values[1] - values[0]), s)
    above = x > values[3]
    s = np.where(above, 3.0 + (x - values[3]) / (values[3] - values[0]), s)
    return s.astype(np.float32)


@dataclass(frozen=True)
class TissueClasses:
    """Per-class rendering parameters, measured on the source head (tissue-scale units).

    ``levels[c]``: class c's level s_c; ``texture_limit[c]``: its texture t is clipped to +-limit."""

    levels: np.ndarray
    texture_limit: np.ndarray

    @classmethod
    def from_dict(cls, values: Dict) -> "TissueClasses":
        names = list(values["classes"])
        if names != list(CLASSES):
            raise InputError(f"the tissue model's classes {names} are not this version's {list(CLASSES)}")
        return cls(np.asarray(values["levels"], np.float32), np.asarray(values["texture_limit"], np.float32))

    def to_dict(self) -> Dict:
        return {"classes": list(CLASSES), "levels": [round(float(v), 4) for v in self.levels],
                "texture_limit": [round(float(v), 4) for v in self.texture_limit]}


def render_tissue(labels: np.ndarray, texture: Optional[np.ndarray], classes: TissueClasses,
                  levels: TissueLevels, bright_stretch: float = 1.0) -> np.ndarray:
    """Per-class rendering (float32, ``levels``' units): from_tissue_scale(s_L + clip(t, +-limit_L)).

    ``labels``: uint8 class map; ``texture``: tissue-scale texture on the same grid (or None).
    "outside" is the air level; "brain" (the template's own brain) is drawn as CSF."""
    labels = np.asarray(labels)
    if labels.size and int(labels.max()) >= len(CLASSES):
        raise InputError(f"unknown tissue label {int(labels.max())}")
    s = classes.levels[labels]
    if texture is not None:
        limit = classes.texture_limit[labels]
        s = s + np.clip(np.asarray(texture, np.float32), -limit, limit)
    if bright_stretch != 1.0:
        s = np.where(s > 3.0, 3.0 + np.float32(bright_stretch) * (s - 3.0), s)
    out = from_tissue_scale(s, levels)
    out[labels == LABEL["outside"]] = np.float32(levels.air)
    return out


#: axes whose spacing is at most this multiple of the finest count as in-plane for the noise estimate
IN_PLANE_SPACING_RATIO = 1.5


def thick_slice_axis(spacing: Sequence[float]) -> Optional[int]:
    """The slice axis of a thick-sliced grid: the coarsest axis when it is more than
    :data:`IN_PLANE_SPACING_RATIO` x the finest; None for a (near) isotropic grid."""
    spacing = np.asarray(spacing, np.float64)
    return int(np.argmax(spacing)) if spacing.max() > IN_PLANE_SPACING_RATIO * spacing.min() else None


def noise_axes(spacing: Optional[Sequence[float]], ndim: int = 3) -> Tuple[int, ...]:
    """Axes along which neighbours are compared for the noise estimate: all of them for (near)
    isotropic voxels, only the in-plane ones (spacing <= :data:`IN_PLANE_SPACING_RATIO` x the
    finest) for thick slices, whose neighbours across slices differ by anatomy, not noise (brain1,
    0.78 x 0.78 x 6.5 mm: 66.6 with all six neighbours, 12 from the in-plane ones)."""
    if spacing is None:
        return tuple(range(ndim))
    spacing = np.asarray(spacing, np.float64)
    return tuple(int(a) for a in np.flatnonzero(spacing <= IN_PLANE_SPACING_RATIO * spacing.min()))


#: classes that never lie just under the skin: within the subcutaneous depth they are drawn as fat
NOT_SUBCUTANEOUS: Tuple[str, ...] = ("brain", "csf", "bone", "marrow", "diploe", "dura", "air", "teeth", "muscle", "mucosa",
                                     "vertebra", "disc")


def with_subcutaneous_fat(labels: np.ndarray, spacing: Sequence[float], depth_mm: Union[float, np.ndarray],
                          surface_depth: Optional[np.ndarray] = None) -> np.ndarray:
    """``labels`` (uint8 class map) with every :data:`NOT_SUBCUTANEOUS` voxel within ``depth_mm`` of
    "outside" relabelled "fat" (a copy; ``depth_mm`` <= 0 returns ``labels``; an array broadcast
    against ``labels`` gives each voxel its own depth). The tissue model's
    source head lies under a different skin (MakeHuman's), and where that skin is tighter than the
    source's, the source's skull, sinus air, dura and muscle came to lie 1-2 mm under it (bone
    7-14 %, muscle 18-45 %, fat 7-12 % of the layer 1-3 mm deep): a dark gap under the skin that a face rendering's
    iso-surface fell into -- a lumpy face, and dlib put the embedded sample's remodeled face
    nearer its original (0.49) than any of 14 reference heads (0.52). Every face and scalp has
    subcutaneous fat there. ``surface_depth``: :func:`~AnonMRILib.transforms.distance.depth` of the
    head (labels != outside) when the caller has it already."""
    from .distance import depth as depth_of

    labels = np.asarray(labels)
    if np.all(np.asarray(depth_mm) <= 0):
        return labels
    depth = surface_depth if surface_depth is not None else depth_of(labels != LABEL["outside"], spacing)
    replace = np.isin(labels, [LABEL[name] for name in NOT_SUBCUTANEOUS]) & (depth <= depth_mm)
    out = labels.copy()
    out[replace] = LABEL["fat"]
    return out


def neighbour_residual(array: np.ndarray, axes: Sequence[int] = (0, 1, 2)) -> np.ndarray:
    """x - mean of its 2k face neighbours along ``axes`` (k of them; float32, edges replicated):
    white noise of std sigma gives a residual of std sigma * sqrt(1 + 1 / 2k)."""
    from scipy import ndimage

    x = np.asarray(array, np.float32)
    kernel = np.zeros((3,) * x.ndim, np.float32)
    centre = (1,) * x.ndim
    kernel[centre] = 1.0
    for axis in axes:
        for side in (0, 2):
            offset = list(centre)
            offset[axis] = side
            kernel[tuple(offset)] = -1.0 / (2 * len(axes))
    return ndimage.convolve(x, kernel, mode="nearest")


def noise_sigma(array: np.ndarray, region: np.ndarray, spacing: Optional[Sequence[float]] = None) -> float:
    """Robust white-noise standard deviation (``array``'s units) in ``region`` (bool): the median
    absolute residual of :func:`neighbour_residual` along :func:`noise_axes` (``spacing`` in mm,
    None = isotropic) / 0.6745 / sqrt(1 + 1 / 2k); 0 when the region is empty."""
    region = np.asarray(region, bool)
    if not region.any():
        return 0.0
    axes = noise_axes(spacing, region.ndim)
    index = np.argwhere(region)
    low, high = np.maximum(index.min(axis=0) - 1, 0), index.max(axis=0) + 2
    box = tuple(slice(a, b) for a, b in zip(low, high))
    residual = neighbour_residual(np.asarray(array)[box], axes)[region[box]]
    return float(np.median(np.abs(residual)) / 0.6745 / np.sqrt(1.0 + 0.5 / len(axes)))


def white_matter_noise(array: np.ndarray, brain: np.ndarray, levels: TissueLevels,
                       spacing: Optional[Sequence[float]] = None) -> float:
    """Noise level of a scan from its brain (part of gamma), over the white matter (brain voxels
    brighter than midway between GM and WM; the whole brain when too little of it is left after
    erosion), reading only voxels inside ``brain``:

    * (near) isotropic voxels: :func:`noise_sigma` (6-neighbour residual) over the white matter
      eroded by one voxel;
    * thick slices (:func:`noise_axes` leaves the slice axis out): Immerkaer's in-plane 3 x 3
      operator (:func:`~AnonMRILib.transforms.appearance.estimate_noise_sigma`, which erodes its
      region in-plane by one voxel), which cancels intensity that is locally planar. A 6.5 mm slab
      mixes white matter with the grey matter and sulci above and below it, so in-plane neighbours
      differ by anatomy too: the 4-neighbour residual read pyradiomics brain1 / brain2 at 37.8 /
      48.4, this operator 13.6 / 15.6, and the remodeled vertex scalp was grainy (in-plane residual
      54.5 where the input's is 21.9; now 20.6)."""
    from scipy import ndimage

    brain = np.asarray(brain, bool)
    values = np.asarray(array)
    white = brain & (values > 0.5 * (levels.gm + levels.wm))
    axes = noise_axes(spacing, brain.ndim)
    structure = np.zeros((3,) * brain.ndim, bool)
    for axis in axes:
        index = [1] * brain.ndim
        for side in (0, 1, 2):
            index[axis] = side
            structure[tuple(index)] = True
    eroded = ndimage.binary_erosion(white, structure=structure)
    enough = eroded.sum() > 100
    if brain.ndim != 3 or len(axes) != 2:
        return noise_sigma(values, eroded if enough else brain, spacing)
    from .appearance import estimate_noise_sigma

    region = white if enough else brain
    slice_axis = next(a for a in range(3) if a not in axes)
    crop = tuple(slice(max(int(a) - 1, 0), int(b) + 2) for a, b in zip(*bounding_box(region)))
    return estimate_noise_sigma(np.moveaxis(np.asarray(values[crop], np.float64), slice_axis, 0),
                                np.moveaxis(region[crop], slice_axis, 0))


def add_rician_noise(values: np.ndarray, sigma: float, air: float, rng: np.random.Generator,
                     weight: Optional[np.ndarray] = None) -> np.ndarray:
    """Magnitude noise (float32): air + |(values - air) + sigma (n1 + i n2)|, n1, n2 ~ N(0, 1) from
    ``rng`` (Gaussian where the signal is well above air, Rayleigh in air); ``weight`` in [0, 1]
    scales sigma voxel by voxel (0 = untouched)."""
    x = np.asarray(values, np.float32) - np.float32(air)
    if sigma <= 0:
        return np.asarray(values, np.float32)
    scale = np.float32(sigma) if weight is None else np.float32(sigma) * np.asarray(weight, np.float32)
    real = x + scale * rng.standard_normal(x.shape, dtype=np.float32)
    imaginary = scale * rng.standard_normal(x.shape, dtype=np.float32)
    return (np.sqrt(real * real + imaginary * imaginary) + np.float32(air)).astype(np.float32)


def class_medians(rendered: np.ndarray, labels: np.ndarray, names: Sequence[str]) -> Dict[str, float]:
    """Median of ``rendered`` per named class (NaN for an absent class): for checks and tests."""
    labels = np.asarray(labels)
    return {name: (float(np.median(rendered[labels == LABEL[name]])) if np.any(labels == LABEL[name])
                   else float("nan")) for name in names}
