"""Plausibility checks: refuse inputs that are not what a command expects, before any work.

In a batch of thousands a volume of noise, a contrast-inverted head, a lesion mask that covers the
whole head or a header with 1e-9 mm voxels must stop with a clear error instead of giving a
confident output. Each check raises :class:`~AnonMRILib.errors.InputError` with a one-line
message and returns what it measured (a small dataclass, in mm / mL) when the input passes.
Every threshold lives in :class:`PlausibilityConfig`; a caller who knows better passes another
config, or skips the checks (``--skip-plausibility-checks`` on the command line).

    check_voxel_spacing(volume)                               # 0.1 - 10 mm voxels
    check_head_present(volume)                                # a compact, dark-surrounded object
    check_brain_mask(volume, brain_mask)                      # a brain-sized region inside the head
    check_lesion_mask(volume, lesion_mask, brain_mask=None)   # a lesion, not the head

The head is the Otsu foreground of :mod:`~AnonMRILib.transforms.head_mask` (largest component,
cavities filled), measured on a copy decimated by integer strides to voxels of at least
``coarse_mm`` (2 mm by default) so that a 1 mm head costs well under a second.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..errors import InputError
from ..io.volume import Volume, require_same_grid
from .head_mask import head_mask_array

#: appended to every refusal so that a user who knows better finds the way round it
OVERRIDE_HINT = "skip this check with --skip-plausibility-checks if the input is right"


@dataclass(frozen=True)
class PlausibilityConfig:
    """Thresholds of the plausibility checks (mm, mL, fractions in [0, 1])."""

    #: smallest and largest voxel edge accepted (mm)
    spacing_mm: Tuple[float, float] = (0.1, 10.0)
    #: voxel size of the decimated copy the head checks are measured on (mm)
    coarse_mm: float = 2.0
    #: volume of the head (Otsu foreground, cavities filled; mL). A skull-stripped adult brain is
    #: ~1000-1500 mL, a whole adult head with neck 3000-8000 mL
    head_ml: Tuple[float, float] = (200.0, 20000.0)
    #: least fraction of the head's voxels that survive a 3x3x3 erosion (a solid object; noise ~0)
    head_solidity: float = 0.3
    #: largest fraction of the field of view's border the head may cover (an air-surrounded
    #: object; a contrast-inverted image or noise covers nearly all of it)
    head_border_fraction: float = 0.6
    #: largest fraction of the field of view the head may fill
    head_fov_fraction: float = 0.95
    #: brain volume range (mL): adult brains with margin (neonates ~400 mL need an override)
    brain_ml: Tuple[float, float] = (700.0, 2200.0)
    #: extent of the brain's bounding box along each world axis (mm)
    brain_extent_mm: Tuple[float, float] = (80.0, 220.0)
    #: range of brain / head volume (the brain is neither a speck nor the whole head)
    brain_head_fraction: Tuple[float, float] = (0.05, 0.85)
    #: least fraction of brain-mask voxels inside the head
    brain_inside_head: float = 0.95
    #: largest lesion / brain volume fraction (with a brain mask) and lesion / head fraction (without)
    lesion_brain_fraction: float = 0.5
    lesion_head_fraction: float = 0.3
    #: least fraction of lesion voxels inside the head (and inside the brain, when one is given)
    lesion_inside: float = 0.5


DEFAULT_CONFIG = PlausibilityConfig()


@dataclass(frozen=True)
class HeadSummary:
    """What :func:`check_head_present` measured."""

    volume_ml: float
    solidity: float
    border_fraction: float
    fov_fraction: float


@dataclass(frozen=True)
class MaskSummary:
    """What :func:`check_brain_mask` / :func:`check_lesion_mask` measured (fractions of voxels)."""

    volume_ml: float
    extent_mm: Tuple[float, float, float]
    fraction_of_reference: float
    inside_fraction: float


def _refuse(message: str) -> InputError:
    return InputError(f"{message}; {OVERRIDE_HINT}")


def check_voxel_spacing(volume: Volume, config: PlausibilityConfig = DEFAULT_CONFIG) -> np.ndarray:
    """The voxel edges (mm) when each lies in ``config.spacing_mm``; else :class:`InputError`."""
    spacing = volume.spacing
    low, high = config.spacing_mm
    if not np.all((spacing >= low) & (spacing <= high)):
        shown = " x ".join(f"{s:.3g}" for s in spacing)
        raise _refuse(f"voxel size {shown} mm is outside the plausible range {low:g}-{high:g} mm "
                      "(a wrong header?)")
    return spacing


def _strides(volume: Volume, coarse_mm: float) -> Tuple[int, int, int]:
    return tuple(max(1, int(coarse_mm // max(s, 1e-6))) for s in volume.spacing)  # type: ignore[return-value]


def _coarse(array: np.ndarray, strides: Tuple[int, int, int]) -> np.ndarray:
    return np.asarray(array)[::strides[0], ::strides[1], ::strides[2]]


def _voxel_ml(volume: Volume, strides: Tuple[int, int, int]) -> float:
    return float(np.prod(volume.spacing * np.asarray(strides))) / 1000.0


def _head_and_strides(volume: Volume, config: PlausibilityConfig) -> Tuple[np.ndarray, Tuple[int, int, int]]:
    strides = _strides(volume, config.coarse_mm)
    return head_mask_array(_coarse(volume.array, strides)), strides


def _enclosing_head(head: np.ndarray) -> np.ndarray:
    """``head`` with the holes of every 2-D slice along each axis filled: what lies within the head's
    outline. A head cut by the field of view (thick clinical slices that end in the brain, a face cut
    in-plane) has dark cavities (ventricles, cisterns, sinuses) that open onto the grid's edge, where
    3-D hole filling cannot close them: pyradiomics brain1 (0.78 x 0.78 x 6.5 mm) had 7 % of its own
    HD-BET brain mask outside the 3-D head, 0.9 % outside this one. Used for the masks' containment
    only; :func:`check_head_present` keeps the 3-D mask (2-D filling makes a sponge of noise solid)."""
    from scipy import ndimage

    out = head.copy()
    for axis in range(head.ndim):
        moved = np.moveaxis(head, axis, 0)
        filled = np.stack([ndimage.binary_fill_holes(plane) for plane in moved])
        out |= np.moveaxis(filled, 0, axis)
    return out


def _border_fraction(mask: np.ndarray) -> float:
    faces = [mask[0], mask[-1], mask[:, 0], mask[:, -1], mask[:, :, 0], mask[:, :, -1]]
    return float(sum(int(f.sum()) for f in faces)) / float(sum(f.size for f in faces))


def check_head_present(volume: Volume, config: PlausibilityConfig = DEFAULT_CONFIG) -> HeadSummary:
    """Refuse an image without a head-like object: noise, contrast inversion, a speck, a full field.

    The head (Otsu foreground) must be a solid object (``head_solidity`` of its voxels survive a
    3x3x3 erosion; Gaussian noise gives a sponge that does not), surrounded by dark air (it covers
    at most ``head_border_fraction`` of the field of view's border; a contrast-inverted head's bright
    air covers all of it), and of plausible volume (``head_ml``). Checks the voxel size first.
    """
    from scipy import ndimage

    check_voxel_spacing(volume, config)
    head, strides = _head_and_strides(volume, config)
    count = int(head.sum())
    eroded = ndimage.binary_erosion(head, structure=np.ones((3, 3, 3), bool), border_value=1)
    solidity = float(eroded.sum()) / max(count, 1)
    border = _border_fraction(head)
    fov = count / head.size
    volume_ml = count * _voxel_ml(volume, strides)
    if solidity < config.head_solidity:
        raise _refuse(f"no solid head in the image (only {solidity:.0%} of its foreground is more than a voxel "
                      "deep; noise?)")
    if border > config.head_border_fraction or fov > config.head_fov_fraction:
        raise _refuse(f"the bright region fills {border:.0%} of the field of view's border and {fov:.0%} of the "
                      "image, not a head surrounded by dark air (contrast-inverted or not a head?)")
    low, high = config.head_ml
    if not low <= volume_ml <= high:
        raise _refuse(f"the head measures {volume_ml:.0f} mL, outside the plausible {low:g}-{high:g} mL "
                      "(wrong voxel size or not a head?)")
    return HeadSummary(volume_ml, solidity, border, fov)


def _mask_extent_mm(volume: Volume, mask: np.ndarray) -> Tuple[float, float, float]:
    """Extent (mm) of ``mask``'s voxel centres along the world axes R, A, S."""
    indices = np.argwhere(mask)
    corners = np.array([[a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)])
    low, high = indices.min(0), indices.max(0)
    points = volume.world_coordinates(low + corners * (high - low))
    return tuple(float(e) for e in points.max(0) - points.min(0))  # type: ignore[return-value]


def check_brain_mask(volume: Volume, brain_mask: Volume,
                     config: PlausibilityConfig = DEFAULT_CONFIG) -> MaskSummary:
    """Refuse a brain mask that is not a brain of ``volume``: volume (mL), extent (mm), fraction of
    the head (neither a speck nor the whole head), and lying inside the head."""
    require_same_grid(volume, brain_mask, what="brain mask")
    check_voxel_spacing(volume, config)
    brain = np.asarray(brain_mask.array) != 0
    if not brain.any():
        raise InputError("the brain mask is empty (no nonzero voxel)")
    volume_ml = float(brain.sum()) * float(np.prod(volume.spacing)) / 1000.0
    low, high = config.brain_ml
    if not low <= volume_ml <= high:
        raise _refuse(f"the brain mask measures {volume_ml:.0f} mL, outside the plausible {low:g}-{high:g} mL")
    extent = _mask_extent_mm(volume, brain)
    low, high = config.brain_extent_mm
    if not all(low <= e <= high for e in extent):
        shown = " x ".join(f"{e:.0f}" for e in extent)
        raise _refuse(f"the brain mask spans {shown} mm, outside the plausible {low:g}-{high:g} mm per axis")
    head, strides = _head_and_strides(volume, config)
    coarse_brain = _coarse(brain, strides)
    inside = float((coarse_brain & _enclosing_head(head)).sum()) / max(int(coarse_brain.sum()), 1)
    fraction = float(coarse_brain.sum()) / max(int((head | coarse_brain).sum()), 1)
    if inside < config.brain_inside_head:
        raise _refuse(f"only {inside:.0%} of the brain mask lies inside the head (a mask of another image?)")
    low, high = config.brain_head_fraction
    if not low <= fraction <= high:
        raise _refuse(f"the brain mask is {fraction:.0%} of the head, outside the plausible {low:.0%}-{high:.0%} "
                      "(the whole head, or a mask of another image?)")
    return MaskSummary(volume_ml, extent, fraction, inside)


def check_lesion_mask(volume: Volume, lesion_mask: Volume, brain_mask: Optional[Volume] = None,
                      allow_empty: bool = False, config: PlausibilityConfig = DEFAULT_CONFIG) -> MaskSummary:
    """Refuse a lesion mask that is not a lesion of ``volume``: empty (unless ``allow_empty``), mostly
    outside the head (or the brain, when ``brain_mask`` is given), or too large a fraction of it
    (``lesion_brain_fraction`` of the brain, ``lesion_head_fraction`` of the head)."""
    require_same_grid(volume, lesion_mask, what="lesion mask")
    check_voxel_spacing(volume, config)
    lesion = np.asarray(lesion_mask.array) != 0
    if not lesion.any():
        if allow_empty:
            return MaskSummary(0.0, (0.0, 0.0, 0.0), 0.0, 1.0)
        raise InputError("the lesion mask is empty (no nonzero voxel); pass --allow-empty-lesion if that is intended")
    volume_ml = float(lesion.sum()) * float(np.prod(volume.spacing)) / 1000.0
    extent = _mask_extent_mm(volume, lesion)
    voxel_ml = float(np.prod(volume.spacing)) / 1000.0
    if brain_mask is not None:
        require_same_grid(volume, brain_mask, what="brain mask")
        brain = np.asarray(brain_mask.array) != 0
        what, largest = "brain", config.lesion_brain_fraction
        inside = float((lesion & brain).sum()) / float(lesion.sum())
        fraction = volume_ml / max(float(brain.sum()) * voxel_ml, 1e-12)
    else:  # the head on the decimated grid, looked up at every lesion voxel
        head, strides = _head_and_strides(volume, config)
        what, largest = "head", config.lesion_head_fraction
        coarse_index = np.argwhere(lesion) // np.asarray(strides)
        inside = float(_enclosing_head(head)[tuple(coarse_index.T)].mean())
        fraction = volume_ml / max(float(head.sum()) * _voxel_ml(volume, strides), 1e-12)
    if fraction > largest:
        raise _refuse(f"the lesion mask covers {fraction:.0%} of the {what} (at most {largest:.0%} is plausible "
                      "for a lesion)")
    if inside < config.lesion_inside:
        raise _refuse(f"only {inside:.0%} of the lesion mask lies inside the {what} (a mask of another image?)")
    return MaskSummary(volume_ml, extent, fraction, inside)

