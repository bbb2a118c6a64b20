"""FACE MASK (after Milchenko & Marcus 2013) and whole-head blur: obscure by smoothing, not removal.

Milchenko & Marcus' ``mask_face`` finds the face surface relative to the brain and replaces the
voxels of that layer by smoothed values, so the head keeps a face-shaped surface without the
features that identify it. This implementation:

* **Face region** (RAS world coordinates, from the brain mask's extent; the head upright): voxels
  anterior of the plane at ``anterior_fraction`` of the brain's A-P extent (from the back; 0.6 =
  in front of the temples and ears) and inferior of the plane at ``superior_fraction`` of the
  brain's S-I extent (from the bottom; 0.8 = the forehead up to above the brows), everything below
  included (chin, jaw, neck front); brain voxels excluded.
* **Obscuring**: a blur of the *shape*, not only of the intensities (blurring intensities alone
  moves a low iso-surface outwards and leaves a step at the region's border). The head's indicator
  is smoothed with a Gaussian of ``sigma_mm`` (8 mm: nose, eyes, lips and chin dissolve into a
  rounded face) and filled with normalised Gaussian averages of the tissue and of the air (see
  :func:`blurred_face`); it replaces the original in the face region, blended over ``blend_mm``
  so no step shows at its border. Only the region's bounding box (plus the kernels' reach) is
  filtered.

Whole-head blur (``blur``): the same Gaussian (``sigma_mm``, 4 mm by default) on every voxel
outside the brain.
"""
from dataclasses import dataclass

import numpy as np

from ...errors import InputError
from ...io.volume import Volume
from ...transforms.distance import bounding_slices
from .geometry import A_AXIS, S_AXIS, sigma_voxels, world_coordinate

#: Gaussians are truncated at this many sigmas
TRUNCATE = 3.0


@dataclass(frozen=True)
class FaceMaskConfig:
    """FACE MASK settings (see the module docstring); lengths in mm, fractions of the brain's extent."""

    sigma_mm: float = 8.0
    blend_mm: float = 8.0
    anterior_fraction: float = 0.6
    superior_fraction: float = 0.8


@dataclass(frozen=True)
class BlurConfig:
    """Whole-head blur: Gaussian ``sigma_mm`` on every voxel outside the brain."""

    sigma_mm: float = 4.0


def face_region(brain: np.ndarray, volume: Volume, config: FaceMaskConfig = FaceMaskConfig()) -> np.ndarray:
    """Boolean array: the face region defined relative to the brain mask (module docstring)."""
    if not brain.any():
        raise InputError("the brain mask is empty; the face region is defined relative to the brain")
    anterior = world_coordinate(volume, A_AXIS)
    superior = world_coordinate(volume, S_AXIS)
    a_brain, s_brain = anterior[brain], superior[brain]
    a_back, a_front = float(a_brain.min()), float(a_brain.max())
    s_bottom, s_top = float(s_brain.min()), float(s_brain.max())
    a_cut = a_back + config.anterior_fraction * (a_front - a_back)
    s_cut = s_bottom + config.superior_fraction * (s_top - s_bottom)
    return (anterior > a_cut) & (superior < s_cut) & ~brain


def solid_head(above: np.ndarray, volume: Volume) -> np.ndarray:
    """The head as a solid: largest component of ``above`` with its cavities filled in 3-D and in
    every axial slice (the voxel axis nearest to S), so sinuses and airways that reach the outside
    through the nostrils or the mouth are filled too."""
    from scipy import ndimage

    from ...transforms.head_mask import clean_binary_head

    head = clean_binary_head(above)
    axial_axis = int(np.argmax(np.abs(volume.direction[S_AXIS])))
    in_plane = np.zeros((3, 3, 3), dtype=bool)
    centre = [slice(None)] * 3
    centre[axial_axis] = 1
    in_plane[tuple(centre)] = ndimage.generate_binary_structure(2, 1)
    return ndimage.binary_fill_holes(head, structure=in_plane)


def _smoothstep(x: np.ndarray, low: float, high: float) -> np.ndarray:
    t = np.clip((x - low) / (high - low), 0.0, 1.0)
    return t * t * (3.0 - 2.0 * t)


def blurred_face(volume: Volume, brain: np.ndarray, config: FaceMaskConfig = FaceMaskConfig()) -> np.ndarray:
    """float32 image: the face region replaced by a featureless smooth face (brain voxels untouched).

    Inside the region's box: the head ``H`` (``x >= head_threshold(x)`` as a solid: :func:`solid_head`)
    is smoothed as a shape (its
    indicator blurred with ``sigma_mm``; the new head is where that exceeds one half, with a smooth
    ramp between 0.3 and 0.7 so the surface has no voxel steps); tissue intensities are the
    normalised Gaussian average of the bright (above-threshold) voxels, never below the threshold
    (the median bright intensity where none is near), air the normalised average of the air voxels.
    The result is blended into the original with a weight that is 1 in the face region and falls
    off over ``blend_mm`` outside it; brain voxels keep weight 0.
    """
    from scipy import ndimage

    from ...transforms.head_mask import head_threshold

    region = face_region(brain, volume, config)
    data = np.asarray(volume.array, dtype=np.float32)
    output = data.copy()
    if not region.any():
        return output
    sigma = sigma_voxels(volume, config.sigma_mm)
    blend = sigma_voxels(volume, config.blend_mm)
    reach = np.ceil(TRUNCATE * (sigma + blend)).astype(int) + 1
    box = bounding_slices(region, reach)
    values = data[box]
    threshold = head_threshold(data, "otsu")
    # the head as a solid (bone and sinuses are dark in T1 but belong to the shape) ...
    head = solid_head(data >= threshold, volume)[box].astype(np.float32)
    # ... filled with the intensities of its bright (above-threshold) tissue
    bright = (values >= threshold).astype(np.float32)

    def smooth(array: np.ndarray) -> np.ndarray:
        return ndimage.gaussian_filter(array, sigma=sigma, truncate=TRUNCATE, mode="nearest")

    head_fraction = smooth(head)
    bright_fraction = smooth(bright)
    tissue = smooth(values * bright) / np.maximum(bright_fraction, 1e-3)
    typical_tissue = float(np.median(values[bright > 0])) if bright.any() else 2.0 * threshold
    tissue = np.where(bright_fraction > 0.05, np.maximum(tissue, threshold), typical_tissue)
    air = smooth(values * (1.0 - head)) / np.maximum(1.0 - head_fraction, 1e-3)
    inside = _smoothstep(head_fraction, 0.3, 0.7)
    featureless = air + inside * (tissue - air)
    # 1 inside the region, falling continuously to 0 over about blend_mm outside it
    weight = ndimage.gaussian_filter(region[box].astype(np.float32), sigma=blend, truncate=TRUNCATE)
    weight = np.where(region[box], 1.0, np.clip(2.0 * weight, 0.0, 1.0)).astype(np.float32)
    weight[brain[box]] = 0.0
    output[box] = values + weight * (featureless - values)
    return output


def blurred_head(volume: Volume, brain: np.ndarray, config: BlurConfig = BlurConfig()) -> np.ndarray:
    """float32 image: every voxel outside the brain replaced by the Gaussian-blurred image."""
    from scipy import ndimage

    data = np.asarray(volume.array, dtype=np.float32)
    smooth = ndimage.gaussian_filter(data, sigma=sigma_voxels(volume, config.sigma_mm), truncate=TRUNCATE,
                                     mode="nearest")
    return np.where(brain, data, smooth)
