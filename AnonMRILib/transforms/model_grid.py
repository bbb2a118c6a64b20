"""The model grid: the S^3 isotropic grid on which CP-GAN sees a head, and the way back.

A :class:`ModelGrid` is fully described by its size ``S``, its isotropic spacing and its affine
(model voxel -> RAS mm), together with the input grid (shape + affine) it was built from.
It is built from a head mask on the input grid:

1. the head's extent in RAS mm (every head voxel's centre) plus ``margin_mm`` on every side;
2. isotropic spacing = the largest extent / S, so the head fits in S voxels along every axis;
3. the grid is centred on the head and padded to S^3 (voxels outside the input read as 0).

Model axes are RAS-aligned whatever the input's orientation: ``array[i, j, k]`` runs
left->right (i), posterior->anterior (j), inferior->superior (k), so a network sees every head
the same way round (face towards +j, top of the head towards +k).

Resampling is done with SimpleITK (multi-threaded, physical-space aware). ``"linear"`` going to a
coarser grid first smooths with a Gaussian whose FWHM makes up the difference between the two
spacings (anti-aliasing); ``"nearest"`` is for labels. Brain voxels are never taken from a
resampled volume: the remodel pipeline composes its output with
:func:`AnonMRILib.transforms.brain_preservation.compose_preserving`, which copies them from the
input at native resolution.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import InputError
from ..io.volume import Volume

#: model sizes CP-GAN supports (S^3 voxels)
MODEL_SIZES = (32, 64, 128)
INTERPOLATIONS = ("linear", "nearest")
#: FWHM of a Gaussian with sigma 1
_FWHM_PER_SIGMA = 2.0 * np.sqrt(2.0 * np.log(2.0))


@dataclass(frozen=True, eq=False)
class ModelGrid:
    """An S^3 isotropic RAS-aligned grid covering a head, and the input grid it came from.

    ``affine`` maps model voxel (i, j, k) to RAS mm; ``spacing_mm`` is its isotropic voxel size;
    ``input_shape`` / ``input_affine`` describe the grid of the image it was built from, the
    default target of :meth:`from_model`.
    """

    size: int
    spacing_mm: float
    affine: np.ndarray
    input_shape: Tuple[int, int, int]
    input_affine: np.ndarray

    @property
    def shape(self) -> Tuple[int, int, int]:
        return (self.size, self.size, self.size)

    def input_grid(self) -> Volume:
        """An empty (uint8 zeros) Volume on the input grid, e.g. as a resampling reference."""
        return Volume(np.zeros(self.input_shape, np.uint8), self.input_affine)

    def model_volume(self, array: np.ndarray) -> Volume:
        """Wrap an S^3 array as a Volume on the model grid (to save or inspect it)."""
        array = np.asarray(array)
        if array.shape != self.shape:
            raise InputError(f"expected an array of shape {self.shape}, got {array.shape}")
        return Volume(array, self.affine.copy())

    def to_model(self, volume: Volume, interpolation: str = "linear", antialias: Union[bool, str] = True
                 ) -> np.ndarray:
        """``volume`` resampled onto the model grid: float32 array (S, S, S), 0 outside the input.

        ``antialias`` (linear only): see :func:`resample_arrays`; ``"box"`` suits masks.
        """
        return resample_array(volume.array, volume.affine, self.shape, self.affine, interpolation, antialias)

    def from_model(self, array, reference: Optional[Volume] = None, interpolation: str = "linear") -> Volume:
        """An S^3 model-grid array (numpy or torch) resampled onto ``reference``'s grid.

        ``reference`` defaults to the input grid this ModelGrid was built from. Returns a float32
        Volume on that grid; voxels outside the model grid are 0.
        """
        if hasattr(array, "detach"):
            array = array.detach().cpu().numpy()
        array = np.asarray(array)
        if array.shape != self.shape:
            raise InputError(f"expected a model-grid array of shape {self.shape}, got {array.shape}")
        target = reference if reference is not None else self.input_grid()
        data = resample_array(array, self.affine, target.shape, target.affine, interpolation)
        return Volume(data, target.affine.copy())


def build_model_grid(head_mask: Volume, size: int = 128, margin_mm: float = 10.0,
                     reference: Optional[Volume] = None) -> ModelGrid:
    """The :class:`ModelGrid` of a head: crop to ``head_mask`` + ``margin_mm``, isotropic, S^3.

    ``head_mask``: nonzero = head, on the input image's grid or on any grid in the same world
    space (e.g. a coarse copy). ``size``: S (32, 64 or 128). ``reference``: the input image's
    grid, the target of :meth:`ModelGrid.from_model` (default: ``head_mask``'s grid).
    """
    if size not in MODEL_SIZES:
        raise InputError(f"model size {size} is not supported (use one of {', '.join(map(str, MODEL_SIZES))})")
    if margin_mm < 0:
        raise InputError("the model-grid margin must be >= 0 mm")
    mask = np.asarray(head_mask.array) != 0
    if not mask.any():
        raise InputError("the head mask is empty; cannot place the model grid")
    low, high = _world_extent(mask, head_mask.affine)
    low, high = low - margin_mm, high + margin_mm
    spacing = float(np.max(high - low)) / size
    center = 0.5 * (low + high)
    affine = np.eye(4)
    affine[:3, :3] = np.eye(3) * spacing
    # voxel centre (S-1)/2 sits on the head's centre
    affine[:3, 3] = center - spacing * (size - 1) / 2.0
    reference = reference if reference is not None else head_mask
    return ModelGrid(size=int(size), spacing_mm=spacing, affine=affine,
                     input_shape=reference.shape, input_affine=reference.affine.copy())


def _world_extent(mask: np.ndarray, affine: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """RAS bounding box (mm) of the centres of the True voxels of ``mask`` (any orientation).

    Axis-aligned grids (direction = signed permutation): the index bounding box's corners.
    Oblique grids: the extremes of a linear map over a set of voxels are attained on its
    boundary shell, so the shell's voxels are mapped to RAS.
    """
    direction = affine[:3, :3] / np.linalg.norm(affine[:3, :3], axis=0)
    if np.allclose(np.abs(direction).max(axis=0), 1.0, atol=1e-6):
        low = np.zeros(3)
        high = np.zeros(3)
        for axis in range(3):
            present = np.flatnonzero(mask.any(axis=tuple(a for a in range(3) if a != axis)))
            low[axis], high[axis] = present[0], present[-1]
        corners = np.array([[x, y, z] for x in (low[0], high[0]) for y in (low[1], high[1])
                            for z in (low[2], high[2])])
        world = corners @ affine[:3, :3].T + affine[:3, 3]
        return world.min(axis=0), world.max(axis=0)
    from scipy import ndimage

    shell = mask & ~ndimage.binary_erosion(mask)
    indices = np.argwhere(shell if shell.any() else mask).astype(np.float64)
    world = indices @ affine[:3, :3].T + affine[:3, 3]
    return world.min(axis=0), world.max(axis=0)


def resample_array(array: np.ndarray, affine: np.ndarray, out_shape: Tuple[int, int, int],
                   out_affine: np.ndarray, interpolation: str = "linear",
                   antialias: Union[bool, str] = True) -> np.ndarray:
    """Resample ``array`` (voxel->RAS ``affine``) onto the grid (``out_shape``, ``out_affine``).

    float32 result, 0 outside the source. ``"linear"`` with ``antialias`` first averages blocks
    and smooths when the target is coarser (see :func:`resample_arrays`); ``"nearest"`` for labels.
    """
    return resample_arrays([array], affine, out_shape, out_affine, interpolation, antialias)[0]


def resample_arrays(arrays: Sequence[np.ndarray], affine: np.ndarray, out_shape: Tuple[int, int, int],
                    out_affine: np.ndarray, interpolation: str = "linear",
                    antialias: Union[bool, str] = True) -> List[np.ndarray]:
    """Resample arrays of one grid onto another grid (float32 arrays, 0 outside the source).

    Anti-aliasing for ``"linear"`` when the target is coarser: blocks of ``floor(out/in)``
    voxels along each input axis are averaged (SimpleITK ``BinShrink``: cheap, and for binary
    masks it gives the covered fraction, so linear + ``>= 0.5`` is an area-weighted downsampling),
    then a Gaussian makes up what remains of the resolution difference (FWHM^2 = out^2 - in^2)
    if that is more than a quarter voxel. ``antialias``: True (both), ``"box"`` (block averaging
    only: enough for masks re-binarised afterwards), False (none).
    """
    import SimpleITK as sitk

    if antialias not in (True, False, "box"):
        raise InputError(f"unknown anti-aliasing {antialias!r} (use True, False or 'box')")
    if interpolation not in INTERPOLATIONS:
        raise InputError(f"unknown interpolation {interpolation!r} (use linear or nearest)")
    reference = sitk.Image([int(n) for n in out_shape], sitk.sitkUInt8)
    _set_geometry(reference, out_affine)
    results = []
    for array in arrays:
        array = np.asarray(array)
        if array.dtype not in _SITK_NATIVE:
            array = array.astype(np.float32)
        source = sitk.GetImageFromArray(np.transpose(array, (2, 1, 0)))
        _set_geometry(source, affine)
        method = sitk.sitkNearestNeighbor
        if interpolation == "linear":
            method = sitk.sitkLinear
            source = sitk.Cast(source, sitk.sitkFloat32)
            if antialias:
                source = _antialias(source, affine, out_affine, gaussian=antialias is True)
        resampled = sitk.Resample(source, reference, sitk.Transform(), method, 0.0, sitk.sitkFloat32)
        results.append(np.ascontiguousarray(np.transpose(sitk.GetArrayFromImage(resampled), (2, 1, 0))))
    return results


#: numpy types SimpleITK takes as they are (nearest-neighbour keeps them)
_SITK_NATIVE = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.uint32,
                                             np.float32, np.float64))


def _set_geometry(image, affine: np.ndarray) -> None:
    """Give a SimpleITK image (indexed i, j, k) the geometry of a RAS voxel->mm ``affine``."""
    from ..io.readers import LPS_TO_RAS

    affine_lps = LPS_TO_RAS @ np.asarray(affine, np.float64)
    spacing = np.linalg.norm(affine_lps[:3, :3], axis=0)
    image.SetSpacing([float(v) for v in spacing])
    image.SetDirection([float(v) for v in (affine_lps[:3, :3] / spacing).ravel()])
    image.SetOrigin([float(v) for v in affine_lps[:3, 3]])


def _antialias(source, affine: np.ndarray, out_affine: np.ndarray, gaussian: bool = True):
    """Block-average then Gaussian-smooth ``source`` for resampling to the coarser ``out_affine``."""
    import SimpleITK as sitk

    in_spacing = np.linalg.norm(affine[:3, :3], axis=0)
    out_spacing = float(np.min(np.linalg.norm(out_affine[:3, :3], axis=0)))
    factors = [max(1, int(np.floor(out_spacing / s + 1e-6))) for s in in_spacing]
    if max(factors) > 1:
        source = sitk.BinShrink(source, factors)
        in_spacing = in_spacing * np.asarray(factors)
    sigma = np.sqrt(np.maximum(out_spacing ** 2 - in_spacing ** 2, 0.0)) / _FWHM_PER_SIGMA
    if gaussian and np.any(sigma > 0.25 * in_spacing):
        source = sitk.SmoothingRecursiveGaussian(source, [float(max(v, 1e-6)) for v in sigma])
    return source
