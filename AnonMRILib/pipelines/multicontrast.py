"""One face treatment for every contrast of a session: carry the T1's de-identified face to a T2w/FLAIR/PD.

    carried = carry_face(t1, t1_out, t1_brain, t2)                 # Volume on t2's grid, t2's dtype
    carried, details = carry_face_with_details(t1, t1_out, t1_brain, t2, t2_brain=None)

Steps (all on the other contrast's own grid; the T1 is never resampled back):

1. **Rigid registration** of the T1 onto the other contrast with SimpleITK: Mattes mutual
   information (the two contrasts differ), a centred Euler 3-D transform initialised from the image
   moments, regular-step gradient descent on a 2-level pyramid (shrink 2, 1 of copies at
   ``registration_mm`` voxels), a quarter of the voxels sampled on a regular grid jittered from a
   fixed seed, one thread: the same inputs give the same transform bit for bit, whichever machine or
   Dask worker runs it.
2. **The T1's treated region** (voxels whose value the T1's de-identification changed), the T1 brain
   mask, the T1 input and the T1 output are resampled onto the other grid through that transform
   (nearest neighbour for masks, linear for intensities).
3. **Contrast mapping** (how the face intensities reach the other contrast): a lookup table from T1
   to the other contrast's intensity, fitted on the *original* co-registered voxels of the head
   outside the brain: the T1 range is cut into ``bins`` quantile bins and each bin gets the median
   intensity of the other contrast's voxels that fall in it (air included, so T1 air maps to the other
   contrast's air). The remodeled T1 face is then mapped voxel by voxel through that table. The table
   is 1-D (intensity to intensity): it carries the patient's contrast, not the shape of the face.
4. **Composition**: inside the treated region the other contrast takes the mapped remodeled T1;
   voxels of the other contrast's head that the T1 never saw (outside the T1's field of view) and that
   are not brain are set to its background level; everywhere else, and on every brain voxel, the
   other contrast's own value is kept. The brain is the T1 brain mask carried through the transform
   (dilated by ``brain_margin_voxels``), or the caller's mask of the other contrast; its voxels are
   checked bit for bit against the input before the result is returned.
"""
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..errors import InputError, InvariantError
from ..io.volume import Volume, require_same_grid, require_usable_image

#: voxel size (mm) of the copies the registration runs on
REGISTRATION_MM = 3.0


@dataclass(frozen=True)
class MultiContrastConfig:
    """Settings of :func:`carry_face`."""

    #: voxel size (mm) of the decimated copies the registration is computed on
    registration_mm: float = REGISTRATION_MM
    #: histogram bins of the Mattes mutual information
    histogram_bins: int = 32
    #: optimiser iterations per pyramid level
    iterations: int = 100
    #: fraction of the voxels of the decimated fixed image sampled on a regular grid by the metric
    sampling_fraction: float = 0.25
    #: quantile bins of the T1 -> other contrast intensity table
    bins: int = 64
    #: dilation (voxels of the other grid) of the carried brain mask (registration and interpolation margin)
    brain_margin_voxels: int = 1

    def __post_init__(self) -> None:
        if not 0.5 <= self.registration_mm <= 10 or self.bins < 4 or self.histogram_bins < 8 or self.iterations < 1:
            raise InputError("invalid MultiContrastConfig (registration_mm 0.5-10, bins >= 4, histogram_bins >= 8)")


def _to_sitk(volume: Volume, dtype=np.float32):
    from ..io.writers import numpy_to_simpleitk

    return numpy_to_simpleitk(np.asarray(volume.array, dtype=dtype), volume.affine)


def _decimated(volume: Volume, voxel_mm: float) -> Volume:
    strides = [max(1, int(round(voxel_mm / s))) for s in volume.spacing]
    array = np.ascontiguousarray(volume.array[::strides[0], ::strides[1], ::strides[2]], dtype=np.float32)
    return Volume(array, volume.affine @ np.diag(strides + [1]))


def register_rigid(fixed: Volume, moving: Volume, config: MultiContrastConfig = MultiContrastConfig()):
    """SimpleITK rigid transform mapping ``fixed`` physical (LPS) points to ``moving`` points (Mattes MI)."""
    import SimpleITK as sitk

    fixed_image = _to_sitk(_decimated(fixed, config.registration_mm))
    moving_image = _to_sitk(_decimated(moving, config.registration_mm))
    initial = sitk.CenteredTransformInitializer(fixed_image, moving_image, sitk.Euler3DTransform(),
                                                sitk.CenteredTransformInitializerFilter.MOMENTS)
    registration = sitk.ImageRegistrationMethod()
    registration.SetMetricAsMattesMutualInformation(numberOfHistogramBins=config.histogram_bins)
    registration.SetMetricSamplingStrategy(registration.REGULAR)  # a fixed grid of samples: deterministic
    registration.SetMetricSamplingPercentage(config.sampling_fraction, 1)  # fixed seed of the jitter
    registration.SetInterpolator(sitk.sitkLinear)
    registration.SetOptimizerAsRegularStepGradientDescent(learningRate=2.0, minStep=1e-4,
                                                          numberOfIterations=config.iterations,
                                                          relaxationFactor=0.6)
    registration.SetOptimizerScalesFromPhysicalShift()
    registration.SetShrinkFactorsPerLevel([2, 1])
    registration.SetSmoothingSigmasPerLevel([1, 0])
    registration.SmoothingSigmasAreSpecifiedInPhysicalUnitsOff()
    registration.SetInitialTransform(initial, inPlace=False)
    registration.SetNumberOfThreads(1)  # reproducible bit for bit
    try:
        transform = registration.Execute(fixed_image, moving_image)
    except RuntimeError as error:
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else "failed"
        raise InputError(f"the contrasts could not be registered ({reason})") from None
    return transform, registration.GetMetricValue()


def _resample(volume: Volume, onto: Volume, transform, nearest: bool, default: float) -> np.ndarray:
    """``volume`` resampled on ``onto``'s grid through ``transform`` (onto points -> volume points)."""
    import SimpleITK as sitk

    from ..io.readers import simpleitk_to_numpy

    reference = _to_sitk(onto.with_array(np.zeros(onto.shape, np.uint8)), np.uint8)
    image = _to_sitk(volume, np.uint8 if nearest else np.float32)
    resampled = sitk.Resample(image, reference, transform, sitk.sitkNearestNeighbor if nearest else sitk.sitkLinear,
                              float(default), image.GetPixelID())
    return simpleitk_to_numpy(resampled)[0]


def contrast_table(source: np.ndarray, target: np.ndarray, bins: int) -> Tuple[np.ndarray, np.ndarray]:
    """(edges, values): ``bins`` quantile bins of ``source`` and the median of ``target`` in each."""
    edges = np.unique(np.quantile(source, np.linspace(0.0, 1.0, bins + 1)))
    index = np.clip(np.searchsorted(edges, source, side="right") - 1, 0, max(len(edges) - 2, 0))
    values = np.zeros(max(len(edges) - 1, 1))
    overall = float(np.median(target))
    for b in range(len(values)):
        chosen = target[index == b]
        values[b] = float(np.median(chosen)) if chosen.size else overall
    return edges, values


def apply_table(values: np.ndarray, edges: np.ndarray, table: np.ndarray) -> np.ndarray:
    index = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, len(table) - 1)
    return table[index]


def carry_face_with_details(reference: Volume, reference_out: Volume, reference_brain: Volume, other: Volume,
                            other_brain: Optional[Volume] = None,
                            config: MultiContrastConfig = MultiContrastConfig()) -> Tuple[Volume, Dict[str, Any]]:
    """:func:`carry_face` plus details: the SimpleITK transform (other-contrast points -> reference points),
    the final metric, the brain mask used on the other grid, the replaced fraction of the image."""
    from scipy import ndimage

    from ..io.writers import cast_to_dtype

    for volume, what in ((reference, "reference image"), (other, "other contrast")):
        require_usable_image(volume, what=what)
    require_same_grid(reference, reference_out, what="de-identified reference")
    require_same_grid(reference, reference_brain, what="reference brain mask")
    if other_brain is not None:
        require_same_grid(other, other_brain, what="brain mask of the other contrast")
    transform, metric = register_rigid(other, reference, config)
    treated = reference.with_array((np.asarray(reference_out.array) != np.asarray(reference.array)).astype(np.uint8))
    treated_here = _resample(treated, other, transform, nearest=True, default=0) != 0
    seen = _resample(reference.with_array(np.ones(reference.shape, np.uint8)), other, transform, True, 0) != 0
    if other_brain is not None:
        brain = np.asarray(other_brain.array) != 0
    else:
        brain_here = _resample(reference_brain.with_array((reference_brain.array != 0).astype(np.uint8)), other,
                               transform, nearest=True, default=0) != 0
        brain = ndimage.binary_dilation(brain_here, iterations=config.brain_margin_voxels) \
            if config.brain_margin_voxels > 0 else brain_here
    if not brain.any():
        raise InputError("the brain does not overlap the other contrast after registration")
    original_here = _resample(reference, other, transform, nearest=False, default=float(np.min(reference.array)))
    anonymized_here = _resample(reference_out, other, transform, nearest=False,
                                default=float(np.min(reference.array)))
    data = np.asarray(other.array)
    from ..transforms.head_mask import head_mask_array

    head = head_mask_array(data)
    fit = seen & ~brain & (ndimage.binary_dilation(head, iterations=3) | treated_here)
    if fit.sum() < 100:
        raise InputError("too few co-registered voxels outside the brain to map the face's contrast")
    edges, table = contrast_table(original_here[fit], data[fit].astype(np.float64), config.bins)
    background = float(np.median(data[~head])) if (~head).any() else float(data.min())
    result = data.astype(np.float64)
    replace = treated_here & ~brain
    result[replace] = apply_table(anonymized_here[replace], edges, table)
    unseen = head & ~seen & ~brain
    result[unseen] = background
    output = other.with_array(cast_to_dtype(result, data.dtype))
    if not np.array_equal(np.asarray(output.array)[brain], data[brain]):
        raise InvariantError("brain voxels of the other contrast changed; nothing was written")
    details = {"transform": transform, "metric": float(metric),
               "brain_mask": other.with_array(brain.astype(np.uint8)), "treated_fraction": float(replace.mean()),
               "unseen_head_voxels": int(unseen.sum())}
    return output, details


def carry_face(reference: Volume, reference_out: Volume, reference_brain: Volume, other: Volume,
               other_brain: Optional[Volume] = None, config: MultiContrastConfig = MultiContrastConfig()) -> Volume:
    """The other contrast ``other`` (T2w, FLAIR, PD of the same session) with the face of ``reference_out``
    (the de-identified ``reference`` T1, whose brain mask is ``reference_brain``), on ``other``'s grid in its
    voxel type; its brain voxels are its own, bit for bit (see the module docstring)."""
    return carry_face_with_details(reference, reference_out, reference_brain, other, other_brain, config)[0]
