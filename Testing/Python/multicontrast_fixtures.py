"""A synthetic second contrast of a head: a T2-like intensity map of the T1, moved by a known rigid transform
and resampled onto its own grid (for the multi-contrast and BIDS tests)."""
import numpy as np

from AnonMRILib.io import Volume

#: the known motion of the second contrast: rotation about S (degrees) and translation (mm, LPS)
ANGLE_DEG = 4.0
SHIFT_MM = (3.0, -2.0, 4.0)


def t2_like(t1: Volume, angle_deg: float = ANGLE_DEG, shift_mm=SHIFT_MM, spacing_factor: float = 1.0):
    """(T2-like Volume on its own grid, SimpleITK transform mapping T2 points to T1 points)."""
    import SimpleITK as sitk

    from AnonMRILib.io.readers import simpleitk_to_numpy
    from AnonMRILib.io.writers import numpy_to_simpleitk

    data = t1.array.astype(np.float32)
    high = float(np.percentile(data, 99))
    scaled = np.clip(data / high, 0, 1.2)
    # a T2-like contrast: air stays dark, tissue order reversed (bright T1 -> darker), plus a fixed offset
    contrast = np.where(scaled < 0.08, scaled * 2.0, 1.3 - 0.9 * scaled) * 800.0
    image = numpy_to_simpleitk(contrast.astype(np.float32), t1.affine)
    transform = sitk.Euler3DTransform()
    transform.SetCenter(image.TransformContinuousIndexToPhysicalPoint([(n - 1) / 2 for n in t1.shape]))
    transform.SetRotation(0.0, 0.0, np.deg2rad(angle_deg))
    transform.SetTranslation(tuple(float(s) for s in shift_mm))
    reference = sitk.Image([int(round(n / spacing_factor)) for n in t1.shape], sitk.sitkFloat32)
    reference.SetSpacing([float(s) * spacing_factor for s in image.GetSpacing()])
    reference.SetOrigin(image.GetOrigin())
    reference.SetDirection(image.GetDirection())
    moved = sitk.Resample(image, reference, transform, sitk.sitkLinear, 0.0, sitk.sitkFloat32)
    array, affine = simpleitk_to_numpy(moved)
    return Volume(np.rint(array).astype(np.int16), affine), transform
