"""DEFACE: zero the face found by registering an average head with a face mask (pydeface, no FSL).

pydeface registers its average head to the input with FSL FLIRT (affine, mutual information) and
multiplies the input by the registered face mask. Here the same is done with SimpleITK:

1. the shipped template (pydeface's ``mean_reg2mean`` at 2 mm, uint8; see
   ``AnonMRILib/data/templates/ATTRIBUTION.md``) is the moving image, the input resampled to
   ``registration_spacing_mm`` (linear, its own orientation) the fixed image;
2. initial alignment of the intensity centroids (``CenteredTransformInitializer``, MOMENTS), then a
   12-parameter affine (``AffineTransform``) fitted by Mattes mutual information (32 bins, a
   ``sampling_fraction`` of voxels drawn at random with the given seed), regular-step gradient
   descent over a 3-level pyramid (shrink 4, 2, 1; smoothing 2, 1, 0 voxels);
3. the template's face mask (1 = face) is resampled onto the input's own grid with nearest
   neighbour through that affine, and those voxels are set to 0 (pydeface multiplies by the mask
   with trilinear interpolation; nearest neighbour keeps the cut binary).

Brain voxels are never removed even where a poor registration puts the face mask on them: the
caller (:func:`AnonMRILib.pipelines.baselines.deface`) copies the brain back and checks it.
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from ...errors import InputError
from ...io.volume import Volume
from ...progress import ProgressCallback, report

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "data" / "templates"
TEMPLATE_FILE = "deface_template_T1w.nii.gz"
FACEMASK_FILE = "deface_template_facemask.nii.gz"


@dataclass(frozen=True)
class DefaceConfig:
    """Registration settings of the DEFACE baseline (see the module docstring)."""

    registration_spacing_mm: float = 2.0
    sampling_fraction: float = 0.05
    histogram_bins: int = 32
    iterations: int = 100
    shrink_factors: Tuple[int, ...] = (4, 2, 1)
    smoothing_sigmas: Tuple[float, ...] = (2.0, 1.0, 0.0)
    template_dir: Path = field(default=TEMPLATE_DIR)


def load_template(config: DefaceConfig = DefaceConfig()) -> Tuple[Volume, Volume]:
    """The shipped average head and its face mask (1 = face), on one 2 mm grid."""
    from ...io import load_volume

    paths = [Path(config.template_dir) / name for name in (TEMPLATE_FILE, FACEMASK_FILE)]
    for path in paths:
        if not path.is_file():
            raise InputError(f"the DEFACE template {path} is missing; reinstall AnonMRI or run "
                             "Training/make_deface_template.py")
    return load_volume(paths[0]), load_volume(paths[1])


def _resampled(image, spacing_mm: float):
    """``image`` resampled linearly to isotropic ``spacing_mm`` with its own orientation and extent."""
    import SimpleITK as sitk

    old_spacing = np.array(image.GetSpacing())
    old_size = np.array(image.GetSize())
    size = [max(2, int(round(n))) for n in old_size * old_spacing / spacing_mm]
    return sitk.Resample(image, size, sitk.Transform(), sitk.sitkLinear, image.GetOrigin(),
                         [float(spacing_mm)] * 3, image.GetDirection(), 0.0, sitk.sitkFloat32)


def register_template(volume: Volume, config: DefaceConfig = DefaceConfig(), seed: int = 0,
                      progress: Optional[ProgressCallback] = None):
    """SimpleITK affine transform mapping ``volume``'s physical points (LPS) onto the template's."""
    import SimpleITK as sitk

    from ...io.writers import numpy_to_simpleitk

    template, _ = load_template(config)
    fixed = numpy_to_simpleitk(np.asarray(volume.array, dtype=np.float32), volume.affine)
    if min(volume.spacing) < config.registration_spacing_mm:
        fixed = _resampled(fixed, config.registration_spacing_mm)
    moving = numpy_to_simpleitk(template.array.astype(np.float32), template.affine)

    initial = sitk.CenteredTransformInitializer(fixed, moving, sitk.AffineTransform(3),
                                                sitk.CenteredTransformInitializerFilter.MOMENTS)
    method = sitk.ImageRegistrationMethod()
    method.SetMetricAsMattesMutualInformation(numberOfHistogramBins=int(config.histogram_bins))
    method.SetMetricSamplingStrategy(method.RANDOM)
    # SimpleITK reads a seed of 0 as "use the wall clock"; shift so that seed 0 is reproducible too
    method.SetMetricSamplingPercentage(float(config.sampling_fraction), int(seed) % (2 ** 31 - 2) + 1)
    method.SetInterpolator(sitk.sitkLinear)
    method.SetOptimizerAsRegularStepGradientDescent(learningRate=1.0, minStep=1e-3,
                                                    numberOfIterations=int(config.iterations),
                                                    relaxationFactor=0.6, gradientMagnitudeTolerance=1e-6)
    method.SetOptimizerScalesFromPhysicalShift()
    method.SetShrinkFactorsPerLevel(list(config.shrink_factors))
    method.SetSmoothingSigmasPerLevel(list(config.smoothing_sigmas))
    method.SmoothingSigmasAreSpecifiedInPhysicalUnitsOff()
    method.SetInitialTransform(initial, inPlace=False)
    levels = len(config.shrink_factors)

    def _on_level() -> None:
        level = method.GetCurrentLevel()
        report(progress, level / max(1, levels), f"registering the template (level {level + 1}/{levels})")

    method.AddCommand(sitk.sitkMultiResolutionIterationEvent, _on_level)
    try:
        transform = method.Execute(fixed, moving)
    except RuntimeError as error:
        raise InputError(f"the DEFACE template could not be registered to the image ({error})") from None
    report(progress, 1.0, "template registered")
    return transform


def template_face_mask(volume: Volume, config: DefaceConfig = DefaceConfig(), seed: int = 0,
                       progress: Optional[ProgressCallback] = None) -> np.ndarray:
    """Boolean array on ``volume``'s grid: the template's face mask after registration (nearest)."""
    import SimpleITK as sitk

    from ...io.readers import simpleitk_to_numpy
    from ...io.writers import numpy_to_simpleitk
    from ...progress import sub_progress

    transform = register_template(volume, config, seed=seed, progress=sub_progress(progress, 0.0, 0.9))
    _, face = load_template(config)
    reference = numpy_to_simpleitk(np.zeros(volume.shape, dtype=np.uint8), volume.affine)
    moving = numpy_to_simpleitk(face.array.astype(np.uint8), face.affine)
    warped = sitk.Resample(moving, reference, transform, sitk.sitkNearestNeighbor, 0, sitk.sitkUInt8)
    array, _ = simpleitk_to_numpy(warped)
    report(progress, 1.0, "face mask warped")
    return array > 0
