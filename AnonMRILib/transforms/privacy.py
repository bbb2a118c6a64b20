"""The privacy transform gamma(x) = [c(x), b(x), b(x) * x] of CP-GAN (sec. 3.1), on the model grid.

Steps (a whole-head volume in its own grid, then the S^3 model grid):

1. the head threshold delta, chosen automatically (:mod:`.head_mask`), from a sample of voxels;
2. the :class:`~.model_grid.ModelGrid`, placed on the cleaned head mask (largest component,
   holes filled) of a copy of the image subsampled to >= 2 mm (the 10 mm margin absorbs the
   coarseness; the full-resolution clean-up is what would cost seconds on a 1 mm head);
3. image (anti-aliased, linear), 1[x >= delta] and brain mask (block-averaged, linear,
   re-binarised at 0.5) resampled onto the model grid; the head cleaned there and united with
   the brain (the head contains the brain);
4. c(x) on the model grid (:mod:`.surface`, :mod:`.convex_hull`), united with b(x) so that c
   always contains the brain; also voxelised exactly on the input grid from the same planes;
5. intensity normalisation (:class:`IntensityNormalization`): ``(x - offset) / scale`` with
   offset = the median of the voxels below delta (the background level, ~0 for most T1) and
   scale = the 99.5th percentile of the voxels at or above delta, minus offset, so air is ~0
   and bright tissue ~1 whatever the scanner's units. CP-GAN generates in these units; the
   transform keeps the numbers so that :meth:`PrivacyTransform.restore` maps a generated
   volume back.

gamma is a (3, S, S, S) float32 tensor, channels ordered as
:data:`~.pooling.CONVEX_HULL_CHANNEL`, :data:`~.pooling.BRAIN_MASK_CHANNEL`,
:data:`~.pooling.BRAIN_INTENSITY_CHANNEL`; :func:`~.pooling.privacy_pyramid` gives its scales.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import InputError
from ..io.volume import Volume, require_usable_image
from ..progress import ProgressCallback, report
from .brain_mask import user_brain_mask
from .convex_hull import DEFAULT_FACETS, ConvexHullConfig, HalfSpaces, convex_hull
from .head_mask import HIGH_PERCENTILE, ThresholdMethod, clean_binary_head, head_threshold, sample_values
from .model_grid import ModelGrid, build_model_grid, resample_arrays
from .pooling import BRAIN_INTENSITY_CHANNEL, BRAIN_MASK_CHANNEL, CONVEX_HULL_CHANNEL, GAMMA_CHANNELS
from .surface import DEFAULT_ROTATIONS

#: the model grid is placed on a head mask subsampled to at least this spacing (mm)
COARSE_SPACING_MM = 2.0


@dataclass(frozen=True)
class PrivacyTransformConfig:
    """Settings of gamma(x).

    size: S of the S^3 model grid (32, 64, 128). rotations: K for Z. facets: hull triangles
    used (None = all). threshold: head binarisation ("otsu", "percentile" or an intensity).
    margin_mm: space kept around the head on the model grid. hull_margin_voxels: tolerance of
    the half-space test (model voxels). intensity_percentile: head percentile mapped to 1.
    """

    size: int = 128
    rotations: int = DEFAULT_ROTATIONS
    facets: Optional[int] = DEFAULT_FACETS
    threshold: ThresholdMethod = "otsu"
    margin_mm: float = 10.0
    hull_margin_voxels: float = 0.5
    intensity_percentile: float = HIGH_PERCENTILE

    @property
    def hull(self) -> ConvexHullConfig:
        return ConvexHullConfig(rotations=self.rotations, facets=self.facets,
                                margin_voxels=self.hull_margin_voxels, threshold=self.threshold)


@dataclass(frozen=True)
class IntensityNormalization:
    """``normalised = (x - offset) / scale``; ``x = normalised * scale + offset`` (input units)."""

    offset: float
    scale: float

    def apply(self, values):
        return (values - self.offset) / self.scale

    def invert(self, values):
        return values * self.scale + self.offset

    @classmethod
    def from_threshold(cls, image: np.ndarray, threshold: float, percentile: float = HIGH_PERCENTILE
                       ) -> "IntensityNormalization":
        """offset = median of the voxels below ``threshold`` (background), scale = ``percentile``
        of the voxels at or above it minus offset (from a sample of ~2 million voxels)."""
        values = sample_values(image)
        below = values[values < threshold]
        above = values[values >= threshold]
        if above.size == 0:
            raise InputError("no voxel is above the head threshold; cannot normalise intensities")
        offset = float(np.median(below)) if below.size else 0.0
        high = float(np.percentile(above, percentile))
        if not high > offset:
            raise InputError("the head is not brighter than the background; cannot normalise intensities")
        return cls(offset=offset, scale=high - offset)


@dataclass(frozen=True, eq=False)
class PrivacyTransform:
    """gamma(x) and everything needed to inspect it or to map a generated head back.

    gamma: (3, S, S, S) float32 tensor on the model grid. grid: the :class:`ModelGrid`.
    normalization: intensity units of channel 2 (and of CP-GAN's output). convex_hull,
    brain_mask, head_mask: uint8 0/1 Volumes on the *input's* grid (c is voxelised there exactly
    from the same half-spaces; head_mask = voxels >= threshold inside c, plus the brain).
    half_spaces: c's planes in model-grid voxel coordinates.
    threshold: the head threshold delta (input units). model_image: the normalised input on the
    model grid (S, S, S), only when asked for (training needs it; the remodel pipeline does not).
    """

    gamma: object
    grid: ModelGrid
    normalization: IntensityNormalization
    convex_hull: Volume
    brain_mask: Volume
    head_mask: Volume
    half_spaces: HalfSpaces
    threshold: float
    model_image: Optional[object] = None

    def to_input_grid(self, generated, reference: Optional[Volume] = None) -> Volume:
        """A generated (S, S, S) model-grid volume in normalised units -> float32 Volume, input units, input grid."""
        import torch

        values = generated.detach().to("cpu", torch.float32).numpy() if isinstance(generated, torch.Tensor) \
            else np.asarray(generated, np.float32)
        back = self.grid.from_model(values, reference, interpolation="linear")
        return back.with_array(self.normalization.invert(back.array).astype(np.float32))

    def restore(self, generated, input_volume: Volume, suppress_outside_hull: bool = True) -> Volume:
        """CP-GAN's f = b*x + (1-b)*G on the input grid: generated head + the input's own brain voxels.

        ``generated``: (S, S, S) model-grid output in normalised units. Outside c(x) the output is
        set to the background level (``normalization.offset``) when ``suppress_outside_hull``.
        Brain voxels are copied from ``input_volume`` bit for bit (checked). Input's dtype.
        """
        from .brain_preservation import compose_preserving

        head = self.to_input_grid(generated, input_volume)
        data = head.array
        if suppress_outside_hull:
            data = np.where(self.convex_hull.array != 0, data, np.float32(self.normalization.offset))
        return compose_preserving(input_volume, head.with_array(data), self.brain_mask)


def privacy_transform(volume: Volume, brain_mask: Volume, config: Optional[PrivacyTransformConfig] = None,
                      seed: Optional[int] = 0, generator=None, device=None, keep_model_image: bool = False,
                      progress: Optional[ProgressCallback] = None) -> PrivacyTransform:
    """gamma(x) of a whole-head ``volume`` with its ``brain_mask`` (nonzero = brain, same grid).

    Randomness (rotations, surface points, facets) comes from ``generator`` (a CPU
    ``torch.Generator``), else from a new one seeded with ``seed``: same seed -> same gamma.
    ``device``: where Z is computed and gamma is returned (default CPU).
    """
    import torch

    config = config or PrivacyTransformConfig()
    require_usable_image(volume)
    brain_volume = user_brain_mask(brain_mask, volume)
    if generator is None:
        generator = torch.Generator()
        generator.manual_seed(0 if seed is None else int(seed))
    device = torch.device(device) if device is not None else torch.device("cpu")

    report(progress, 0.0, "head threshold")
    source = np.asarray(volume.array)
    brain = brain_volume.array.astype(bool)
    delta = head_threshold(source, config.threshold)
    normalization = IntensityNormalization.from_threshold(source, delta, config.intensity_percentile)

    report(progress, 0.1, "model grid")
    stride = max(1, int(np.ceil(COARSE_SPACING_MM / float(np.min(volume.spacing)) - 1e-6)))
    coarse = clean_binary_head(source[::stride, ::stride, ::stride] >= delta)
    coarse_affine = volume.affine @ np.diag([stride, stride, stride, 1.0])
    grid = build_model_grid(Volume(coarse.astype(np.uint8), coarse_affine), config.size, config.margin_mm,
                            reference=volume)
    above = source >= delta
    image_model = resample_arrays([source], volume.affine, grid.shape, grid.affine, "linear")[0]
    head_fraction, brain_fraction = resample_arrays([above.view(np.uint8), brain_volume.array], volume.affine,
                                                    grid.shape, grid.affine, "linear", antialias="box")
    brain_model = brain_fraction >= 0.5
    if not brain_model.any():
        raise InputError("the brain mask vanishes on the model grid (is it a few voxels only?)")
    head_model = clean_binary_head(head_fraction >= 0.5) | brain_model

    report(progress, 0.4, "surface and convex hull")
    hull = convex_hull(head_model, config.hull, generator=generator, device=device)
    hull_model = hull.mask | brain_model

    report(progress, 0.8, "hull on the input grid")
    model_from_input = np.linalg.inv(grid.affine) @ volume.affine
    hull_input = hull.half_spaces.in_frame(model_from_input).voxelize(volume.shape) | brain
    head_input = (above & hull_input) | brain

    normalised = normalization.apply(image_model).astype(np.float32)
    gamma = np.zeros((GAMMA_CHANNELS,) + grid.shape, np.float32)
    gamma[CONVEX_HULL_CHANNEL] = hull_model
    gamma[BRAIN_MASK_CHANNEL] = brain_model
    gamma[BRAIN_INTENSITY_CHANNEL] = np.where(brain_model, normalised, np.float32(0))
    report(progress, 1.0, "privacy transform done")
    return PrivacyTransform(
        gamma=torch.from_numpy(gamma).to(device),
        grid=grid,
        normalization=normalization,
        convex_hull=volume.with_array(hull_input.astype(np.uint8)),
        brain_mask=brain_volume,
        head_mask=volume.with_array(head_input.view(np.uint8)),
        half_spaces=hull.half_spaces,
        threshold=float(delta),
        model_image=torch.from_numpy(normalised).to(device) if keep_model_image else None,
    )
