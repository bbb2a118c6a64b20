"""Anatomical prior T(x): an average head carried onto the patient from gamma(x) alone.

T(x) supplies everything a remodeled head needs outside the brain (face, skull, scalp, ears,
neck) at the input's own resolution, from a template head that identifies nobody: pydeface's
mean head's tissue (MIT) under MakeHuman's neutral skin (CC0), built by
``Training/make_reface_template.py --face-mesh`` (see ``AnonMRILib/data/templates/ATTRIBUTION.md``). It is the REFACE method on its own
(:mod:`AnonMRILib.pipelines.reface`) and the base that CP-GAN adds its learned variation to.

**Only gamma(x) places it.** :func:`place_anatomical_prior` takes the patient's brain mask b(x),
convex hull c(x) (both on the input grid), the median brain intensity (from b(x)*x) and the air
level; it never sees a face, skull or scalp voxel. Steps (all in RAS mm):

1. **features**: on a registration grid (RAS-aligned, ``registration_spacing_mm``, the hull's
   bounding box plus 30 mm), each head is described by
   ``F = clip(sdf(c), +-d) / d + clip(sdf(b), +-d) / d`` (signed distances in mm, positive
   inside, ``d = distance_clip_mm``): two level sets, the brain's edge and the hull's, nothing
   else. The template's F uses its own shipped brain mask and hull (computed with the same
   privacy transform);
2. **affine**: 12-parameter affine from the patient's F to the template's F (SimpleITK, mean
   squares, moments initialisation, 2 levels);
3. **deformation**: diffeomorphic demons (SimpleITK ``FastSymmetricForcesDemons``) between the
   patient's F and the affinely mapped template F, coarse to fine over
   ``demons_spacings_mm``, displacement smoothed by ``demons_smoothing_mm``: it carries the
   template's hull onto the patient's hull and its brain onto the patient's brain. The field is
   stiff (12 mm): with 6 mm it followed the hull's flat facets and swelled one side of the face
   (dlib's detector on the refaced ROBEX atlas 1.45, with 12 mm 2.43; originals 1.70-2.48);
4. **resampling**: the template head (linear) onto the input grid through affine + displacement;
5. **intensity**: the template's units scaled so that its median brain intensity equals the
   patient's (``brain_median``); air = ``background``;
6. **beyond the template**: where the template has no data (a patient scanned lower into the
   neck than the average head reaches), the placed template's neck is continued straight down
   (along the input axis nearest to superior-inferior, each column repeats the placed template
   ``neck_source_mm`` above its lower end), kept inside the patient's hull (smoothed by a 1 mm
   Gaussian), blended over ``fov_blend_mm`` above the template's lower end. (Filling the whole hull
   there instead drew a skirt: the hull's lowest slices are far wider than a neck.)
7. **no cut edges**: nothing is clipped at the hull; the prior fades to the air level between
   ``outside_hull_mm`` and twice that outside c(x) (drops stray template matter far from the head).

Choices where the paper is silent (it has no prior): the template, the feature image and the
registration are ours; the output is a float32 Volume in the patient's units on the input grid.
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import InputError
from ..io.volume import Volume
from ..progress import ProgressCallback, report

TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "data" / "templates"
TEMPLATE_FILES = ("reface_template_T1w.nii.gz", "reface_template_brain_mask.nii.gz",
                  "reface_template_convex_hull.nii.gz")


@dataclass(frozen=True)
class AnatomicalPriorConfig:
    """Placement settings (see the module docstring; lengths in mm)."""

    registration_spacing_mm: float = 3.0
    distance_clip_mm: float = 12.0
    demons_spacings_mm: Tuple[float, ...] = (6.0, 3.0)
    demons_iterations: Tuple[int, ...] = (50, 20)
    demons_smoothing_mm: float = 12.0
    fov_blend_mm: float = 12.0
    outside_hull_mm: float = 4.0
    #: the neck below the template repeats the placed template this far above its lower end (mm)
    neck_source_mm: float = 3.0
    template_dir: Path = field(default=TEMPLATE_DIR)

    def __post_init__(self) -> None:
        if len(self.demons_spacings_mm) != len(self.demons_iterations) or not self.demons_spacings_mm:
            raise InputError("demons_spacings_mm and demons_iterations need one entry per level")
        if min(self.registration_spacing_mm, self.distance_clip_mm, self.demons_smoothing_mm,
               min(self.demons_spacings_mm)) <= 0:
            raise InputError("the anatomical-prior spacings and distances must be positive")


@dataclass(frozen=True)
class AverageHead:
    """The shipped average head (uint8 units), its brain mask and convex hull, on one RAS grid."""

    head: Volume
    brain_mask: Volume
    convex_hull: Volume


def load_average_head(config: AnatomicalPriorConfig = AnatomicalPriorConfig()) -> AverageHead:
    """Read the template files (InputError when they are missing)."""
    from ..io import load_volume

    paths = [Path(config.template_dir) / name for name in TEMPLATE_FILES]
    for path in paths:
        if not path.is_file():
            raise InputError(f"the anatomical prior {path} is missing; reinstall AnonMRI or run "
                             "Training/make_reface_template.py")
    head, brain, hull = (load_volume(path) for path in paths)
    return AverageHead(head, brain, hull)


def template_face(config: AnatomicalPriorConfig = AnatomicalPriorConfig()) -> Volume:
    """The face every REFACE and prior-based output wears, at the template's own place: the
    shipped average head (its units)."""
    return load_average_head(config).head


def _to_sitk(array: np.ndarray, affine: np.ndarray):
    from ..io.writers import numpy_to_simpleitk

    return numpy_to_simpleitk(np.ascontiguousarray(array, dtype=np.float32), affine)


def box_corners(low: Sequence[int], high: Sequence[int]) -> np.ndarray:
    """(8, 3) float64 voxel indices of the corners of the box [low, high]."""
    return np.array([[a, b, c] for a in (low[0], high[0]) for b in (low[1], high[1]) for c in (low[2], high[2])],
                    dtype=np.float64)


def registration_grid(mask: Volume, spacing_mm: float, margin_mm: float = 20.0) -> Tuple[Tuple[int, int, int], np.ndarray]:
    """RAS-aligned grid (shape, affine) at ``spacing_mm`` over ``mask``'s bounding box plus ``margin_mm``."""
    indices = np.argwhere(np.asarray(mask.array) != 0)
    if indices.size == 0:
        raise InputError("the convex hull is empty; cannot place the anatomical prior")
    low, high = indices.min(axis=0), indices.max(axis=0)
    corners = box_corners(low, high)
    world = mask.world_coordinates(corners)
    start, stop = world.min(axis=0) - margin_mm, world.max(axis=0) + margin_mm
    shape = tuple(int(np.ceil((b - a) / spacing_mm)) + 1 for a, b in zip(start, stop))
    affine = np.eye(4)
    affine[:3, :3] *= spacing_mm
    affine[:3, 3] = start
    return shape, affine  # type: ignore[return-value]


def signed_distances(masks: Sequence[np.ndarray], source_affine: np.ndarray, shape, affine: np.ndarray
                     ) -> List[np.ndarray]:
    """Signed distance (mm, positive inside) of each binary mask, resampled onto the grid (shape, affine)."""
    from scipy import ndimage

    from .model_grid import resample_arrays

    spacing = float(np.linalg.norm(affine[:3, 0]))
    fractions = resample_arrays([np.asarray(m) != 0 for m in masks], source_affine, shape, affine, "linear",
                                antialias="box")
    distances = []
    for fraction in fractions:
        inside = fraction >= 0.5
        distances.append(((ndimage.distance_transform_edt(inside) - ndimage.distance_transform_edt(~inside))
                          * spacing).astype(np.float32))
    return distances


def level_set_features(hull_distance: np.ndarray, brain_distance: np.ndarray, clip_mm: float) -> np.ndarray:
    """F of step 1: clipped signed distances to c and b (mm), summed, in [-2, 2]."""
    return (np.clip(hull_distance, -clip_mm, clip_mm) + np.clip(brain_distance, -clip_mm, clip_mm)) / float(clip_mm)


def affine_fit(fixed, moving, seed: int = 1, what: str = "the anatomical prior"):
    """12-parameter affine (fixed point -> moving point) between two feature images, mean squares
    on a fixed random 20 % of the voxels (seeded: the same masks give the same transform), at 4x and
    2x the registration spacing (the features are smooth distance maps; finer adds nothing)."""
    import SimpleITK as sitk

    initial = sitk.CenteredTransformInitializer(fixed, moving, sitk.AffineTransform(3),
                                                sitk.CenteredTransformInitializerFilter.MOMENTS)
    method = sitk.ImageRegistrationMethod()
    method.SetMetricAsMeanSquares()
    method.SetMetricSamplingStrategy(method.RANDOM)
    method.SetMetricSamplingPercentage(0.2, int(seed))
    method.SetInterpolator(sitk.sitkLinear)
    method.SetOptimizerAsRegularStepGradientDescent(learningRate=1.0, minStep=1e-3, numberOfIterations=60,
                                                    relaxationFactor=0.6, gradientMagnitudeTolerance=1e-6)
    method.SetOptimizerScalesFromPhysicalShift()
    method.SetShrinkFactorsPerLevel([4, 2])
    method.SetSmoothingSigmasPerLevel([1.0, 0.0])
    method.SetInitialTransform(initial, inPlace=False)
    try:
        return method.Execute(fixed, moving)
    except RuntimeError as error:
        raise InputError(f"{what} could not be aligned to the patient's masks ({error})") from None


def _demons(fixed, moving, config: AnatomicalPriorConfig):
    """Displacement field of the placement (step 3), see :func:`demons_field`."""
    return demons_field(fixed, moving, config.demons_spacings_mm, config.demons_iterations, config.demons_smoothing_mm)


def demons_field(fixed, moving, spacings_mm: Sequence[float], iterations: Sequence[int],
                 smoothing_mm: Union[float, Sequence[float]]):
    """Displacement field (SimpleITK, on ``fixed``'s grid, fixed point -> moving point offsets) of
    diffeomorphic fast symmetric-forces demons, coarse to fine: one level per entry of
    ``spacings_mm`` (images shrunk to about that spacing), ``iterations`` each, the field smoothed
    by ``smoothing_mm`` (one value, or one per level; mm)."""
    import SimpleITK as sitk

    smoothing = [float(smoothing_mm)] * len(spacings_mm) if np.isscalar(smoothing_mm) else list(smoothing_mm)
    field = None
    base_spacing = float(fixed.GetSpacing()[0])
    for spacing_mm, level_iterations, sigma_mm in zip(spacings_mm, iterations, smoothing):
        factor = max(1, int(round(spacing_mm / base_spacing)))
        level_fixed = sitk.Shrink(fixed, [factor] * 3) if factor > 1 else fixed
        level_moving = sitk.Shrink(moving, [factor] * 3) if factor > 1 else moving
        if field is not None:
            field = sitk.Resample(field, level_fixed, sitk.Transform(), sitk.sitkLinear, 0.0, field.GetPixelID())
        demons = sitk.FastSymmetricForcesDemonsRegistrationFilter()
        demons.SetNumberOfIterations(int(level_iterations))
        demons.SetSmoothDisplacementField(True)
        demons.SetStandardDeviations(sigma_mm / float(level_fixed.GetSpacing()[0]))
        field = demons.Execute(level_fixed, level_moving) if field is None else \
            demons.Execute(level_fixed, level_moving, field)
    if field.GetSize() != fixed.GetSize():
        field = sitk.Resample(field, fixed, sitk.Transform(), sitk.sitkLinear, 0.0, field.GetPixelID())
    return field


def _inferior_coverage(head: Volume, pad: int = 40) -> Tuple[np.ndarray, np.ndarray]:
    """Ones on the template grid padded by ``pad`` voxels on every side but the inferior one (the
    template is RAS, axis 2 = S): resampled with 0 outside, it is 0 only below the average head."""
    shape = (head.shape[0] + 2 * pad, head.shape[1] + 2 * pad, head.shape[2] + pad)
    affine = head.affine @ np.array([[1, 0, 0, -pad], [0, 1, 0, -pad], [0, 0, 1, 0], [0, 0, 0, 1.0]])
    return np.ones(shape, np.float32), affine


def place_anatomical_prior(brain_mask: Volume, convex_hull: Volume, brain_median: float, background: float = 0.0,
                           config: Optional[AnatomicalPriorConfig] = None,
                           progress: Optional[ProgressCallback] = None) -> Volume:
    """T(x): the average head placed on the patient from b(x) and c(x); float32 Volume on their grid.

    ``brain_mask``, ``convex_hull``: nonzero = inside, one grid (the input's). ``brain_median``:
    the patient's median intensity inside b(x) (its units); ``background``: the air level.
    Nothing else of the patient is used (see the module docstring).
    """
    import SimpleITK as sitk

    config = config or AnatomicalPriorConfig()
    if not brain_mask.same_grid(convex_hull):
        raise InputError("the brain mask and the convex hull must share one grid")
    if not np.any(np.asarray(brain_mask.array) != 0):
        raise InputError("the brain mask is empty; cannot place the anatomical prior")
    if not np.isfinite(brain_median) or not np.isfinite(background):
        raise InputError("the brain intensity and background level must be finite numbers")
    report(progress, 0.0, "anatomical prior: loading the average head")
    template = load_average_head(config)

    report(progress, 0.1, "anatomical prior: level-set features")
    clip = config.distance_clip_mm
    shape, affine = registration_grid(convex_hull, config.registration_spacing_mm)
    hull_distance, brain_distance = signed_distances([convex_hull.array, brain_mask.array], convex_hull.affine,
                                                     shape, affine)
    fixed = _to_sitk(level_set_features(hull_distance, brain_distance, clip), affine)
    t_shape, t_affine = registration_grid(template.convex_hull, config.registration_spacing_mm)
    t_distances = signed_distances([template.convex_hull.array, template.brain_mask.array], template.head.affine,
                                   t_shape, t_affine)
    moving = _to_sitk(level_set_features(*t_distances, clip), t_affine)

    report(progress, 0.25, "anatomical prior: affine fit of brain and hull")
    affine_transform = affine_fit(fixed, moving)
    moved = sitk.Resample(moving, fixed, affine_transform, sitk.sitkLinear, -2.0, sitk.sitkFloat32)

    report(progress, 0.45, "anatomical prior: deformation onto the hull")
    field = _demons(fixed, moved, config)
    displacement = sitk.DisplacementFieldTransform(sitk.Cast(field, sitk.sitkVectorFloat64))
    chain = sitk.CompositeTransform([affine_transform, displacement])  # displacement first, then affine

    report(progress, 0.7, "anatomical prior: resampling the average head")
    # smooth weights on the registration grid: the template's inferior coverage and the fade to air
    covered = sitk.GetArrayFromImage(sitk.Resample(_to_sitk(*_inferior_coverage(template.head)), fixed, chain,
                                                   sitk.sitkLinear, 0.0, sitk.sitkFloat32)).transpose(2, 1, 0)
    from scipy import ndimage

    inside_template = ndimage.distance_transform_edt(covered >= 0.999) * config.registration_spacing_mm
    template_weight = np.clip(inside_template / config.fov_blend_mm, 0.0, 1.0).astype(np.float32)
    fade = np.clip(2.0 + hull_distance / config.outside_hull_mm, 0.0, 1.0).astype(np.float32)
    region = _bounding_box(fade > 0, affine, brain_mask)
    box_affine = brain_mask.affine @ _translation([a for a, _ in region])
    reference = _to_sitk(np.zeros(tuple(b - a for a, b in region), np.float32), box_affine)
    warped = sitk.Resample(_to_sitk(template.head.array.astype(np.float32), template.head.affine), reference, chain,
                           sitk.sitkLinear, 0.0, sitk.sitkFloat32)
    weights = [sitk.Resample(_to_sitk(w, affine), reference, sitk.Transform(), sitk.sitkLinear, 0.0, sitk.sitkFloat32)
               for w in (template_weight, fade)]
    hull_box = np.asarray(convex_hull.array)[tuple(slice(a, b) for a, b in region)]
    soft_hull = sitk.SmoothingRecursiveGaussian(_to_sitk(hull_box != 0, box_affine), 1.0)

    report(progress, 0.9, "anatomical prior: intensities and edges")
    arrays = [sitk.GetArrayFromImage(image).transpose(2, 1, 0) for image in [warped] + weights + [soft_hull]]
    arrays[0] = extrude_inferiorly(arrays[0], arrays[1] > 0.0, box_affine, config.neck_source_mm)
    box = _compose(*arrays, template=template, brain_median=brain_median, background=background)
    prior = np.full(brain_mask.shape, np.float32(background), np.float32)
    prior[tuple(slice(a, b) for a, b in region)] = box
    report(progress, 1.0, "anatomical prior placed")
    return brain_mask.with_array(prior)


def _translation(offset: Sequence[int]) -> np.ndarray:
    matrix = np.eye(4)
    matrix[:3, 3] = offset
    return matrix


def _bounding_box(mask: np.ndarray, affine: np.ndarray, target: Volume) -> List[Tuple[int, int]]:
    """Index ranges of ``target``'s grid covering the world bounding box of ``mask`` (grid ``affine``)."""
    indices = np.argwhere(mask)
    low, high = indices.min(axis=0), indices.max(axis=0)
    corners = box_corners(low, high)
    world = np.c_[corners, np.ones(8)] @ affine.T
    target_index = world @ np.linalg.inv(target.affine).T
    start = np.clip(np.floor(target_index[:, :3].min(axis=0)).astype(int) - 1, 0, target.shape)
    stop = np.clip(np.ceil(target_index[:, :3].max(axis=0)).astype(int) + 2, 0, target.shape)
    return [(int(a), int(b)) for a, b in zip(start, stop)]


def extrude_inferiorly(values: np.ndarray, covered: np.ndarray, affine: np.ndarray, source_mm: float) -> np.ndarray:
    """``values`` (grid ``affine``) with every column along the axis nearest to world S continued
    below the lowest ``covered`` voxel by the value ``source_mm`` above it; columns never covered
    keep their values."""
    axis = int(np.argmax(np.abs(affine[2, :3]) / np.linalg.norm(affine[:3, :3], axis=0)))
    step_mm = float(np.linalg.norm(affine[:3, axis]))
    moved, mask = np.moveaxis(values, axis, -1), np.moveaxis(covered, axis, -1)
    if affine[2, axis] < 0:  # make the last axis run inferior -> superior
        moved, mask = moved[..., ::-1], mask[..., ::-1]
    n = moved.shape[-1]
    lowest = np.argmax(mask, axis=-1)
    source = np.minimum(lowest + int(np.ceil(source_mm / step_mm)), n - 1)
    below = (np.arange(n) < lowest[..., None]) & mask.any(axis=-1)[..., None]
    out = np.where(below, np.take_along_axis(moved, source[..., None], axis=-1), moved)
    if affine[2, axis] < 0:
        out = out[..., ::-1]
    return np.ascontiguousarray(np.moveaxis(out, -1, axis))


def _compose(prior: np.ndarray, template_weight: np.ndarray, fade: np.ndarray, soft_hull: np.ndarray,
             template: AverageHead, brain_median: float, background: float) -> np.ndarray:
    """Steps 5-7 of the module docstring: template where it reaches, its neck continued below it
    (``prior`` already extruded) inside the hull, faded to air."""
    template_values = template.head.array.astype(np.float32)
    template_scale = float(np.median(template_values[template.brain_mask.array != 0]))
    gain = float(brain_median - background) / max(template_scale, 1e-6)
    head = template_weight * prior + (1.0 - template_weight) * (prior * soft_hull)
    return (head * fade * gain + background).astype(np.float32)


def prior_from_transform(volume: Volume, transform, config: Optional[AnatomicalPriorConfig] = None,
                         progress: Optional[ProgressCallback] = None) -> Volume:
    """T(x) of ``volume`` from its :class:`~AnonMRILib.transforms.privacy.PrivacyTransform`: the
    brain mask and hull (input grid), the median of b*x and the air level (``normalization.offset``)."""
    brain = np.asarray(transform.brain_mask.array) != 0
    return place_anatomical_prior(transform.brain_mask, transform.convex_hull,
                                  float(np.median(np.asarray(volume.array)[brain])),
                                  background=transform.normalization.offset, config=config, progress=progress)
