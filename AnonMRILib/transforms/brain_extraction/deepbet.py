"""deepbet brain extraction (Fisch et al. 2024) re-implemented on AnonMRI's safetensors weights.

Same steps as deepbet 1.0.2's ``BrainExtraction.run`` (MIT licence), so its published accuracy
carries over; the networks are :class:`~AnonMRILib.models.linknet3d.LinkNet3d` loaded from
``AnonMRILib/weights/brain_extraction/deepbet_{bbox,brain}.safetensors`` (converted by
``Training/convert_deepbet_weights.py``, checked against the SHA-256 in ``deepbet.json``):

1. the volume is permuted/flipped to the closest RAS orientation (no interpolation);
2. a 128^3 nearest-neighbour view, intensities clipped to its 0.5-99.5 percentiles and
   standardised (``0.226 * z + 0.449``), goes through the bounding-box network; its largest
   component's box, widened by 10 % per side, is the brain region;
3. that region, resampled to 256^3 (nearest), goes through the brain network; the brain
   probability is resampled back (nearest) and thresholded at ``DeepbetConfig.threshold`` (0.5);
   with ``DeepbetConfig.mirror_augmentation`` both networks' probabilities are averaged with those
   of the left-right mirrored input (HD-BET's test-time mirroring; not part of deepbet);
4. largest face-connected component, holes filled (scipy instead of deepbet's cc3d / fill_voids);
5. flipped/permuted back onto the input's own grid;
6. AnonMRI's one addition: the surface is moved inwards by ``DeepbetConfig.surface_margin_mm``
   (voxels whose Euclidean distance, in mm, to the outside is at most the margin are dropped;
   the largest component is kept). deepbet's own ``n_dilate`` does the same in whole voxel
   layers; a margin in mm behaves the same on every voxel size. See :class:`DeepbetConfig` for
   why the default is 1 mm (deepbet's surface lies ~1-2 mm outside ROBEX's).
Networks run in float32 on ``device`` (CPU by default; CUDA when asked and available).
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np

from ...errors import InputError, WeightsError
from ...io.volume import Volume
from ...models.model_card import verify_sha256
from ...progress import ProgressCallback, report
from .common import from_ras, largest_component, read_model_card, to_ras, weights_file

CARD_FILE = "deepbet.json"

SMALL_SHAPE = (128, 128, 128)
BRAIN_SHAPE = (256, 256, 256)
BBOX_MARGIN = 0.1
#: distances (mm) this close to the surface margin count as within it (header float noise)
SPACING_TOLERANCE_MM = 1e-3
#: threshold of the bounding-box network's probability (deepbet's fixed 0.5)
BBOX_THRESHOLD = 0.5


@dataclass(frozen=True)
class DeepbetConfig:
    """Post-processing of deepbet's brain probability.

    ``threshold``: brain where the probability exceeds it (deepbet's default 0.5). The network's
    probability is nearly binary: on the calibration head any value in 0.5-0.98 changes Dice
    against ROBEX by < 0.005, so deepbet's default is kept.

    ``surface_margin_mm``: the mask's surface is moved this far inwards (mm; 0 = deepbet's own
    mask, like its ``n_dilate=0``). deepbet's masks are larger than ROBEX's (the reference of the
    CP-GAN paper) on the 1 mm real-anatomy heads: they reach further into the CSF over the
    convexity; their extra voxels lie a median 2 mm outside ROBEX's surface. The value was
    calibrated on ONE head only, the pydeface mean head (1 mm, ROBEX reference), sweeping
    0, 0.5, 1, 1.25, 1.5, 1.75, 2, 2.5, 3 mm: Dice 0.948 at 0 mm, 0.956 at 1-1.25 mm, best 0.957
    at 1.75 mm. The default is the smallest margin within 0.001 of the best (the least change
    that reaches the plateau): 1.0 mm, i.e. the face-connected border layer on a 1 mm grid and
    nothing on a grid coarser than 1 mm (distances there are >= the spacing).
    Held out (``Training/benchmark_brain_mask.py``, 0 mm -> 1 mm): sub-01 (real 1 mm head, ROBEX)
    0.9442 -> 0.9499; MNI305 average (1 mm, ROBEX; deepbet is already smaller than ROBEX there)
    0.9275 -> 0.9118; ROBEX atlas (1.5 mm, manual mask) 0.9682 unchanged.

    ``mirror_augmentation``: test-time mirroring, as HD-BET does: each network (box and brain)
    also sees its input mirrored left-right (the first axis of the RAS-reoriented array, the
    networks' own frame), its output is mirrored back and the two brain probabilities are
    averaged before thresholding. Twice the network cost. A mirrored network input then gives
    exactly the mirrored probability (the average is symmetric in its two terms); the whole mask is
    exactly mirrored too where deepbet's nearest-neighbour resampling and box rounding are
    themselves symmetric (e.g. odd sizes along left-right; elsewhere they can move it by a voxel
    or so). On by default, decided on
    the calibration head and the two non-sub-01 heads only (rule: on unless their mean Dice
    drops or a 1 mm head exceeds 60 s), off -> on: pydeface mean 0.9559 -> 0.9562, MNI305
    0.9118 -> 0.9119, ROBEX atlas 0.9682 -> 0.9686; 1 mm wall 18-25 s -> 37 s (2 loaded cores).
    The gain is small; the point is a mask that does not depend on which side is left.
    Held out, run only after that decision: sub-01 0.94989 -> 0.94988 (unchanged).
    """

    threshold: float = 0.5
    surface_margin_mm: float = 1.0
    mirror_augmentation: bool = True

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must lie in (0, 1), got {self.threshold}")
        if self.surface_margin_mm < 0.0:
            raise ValueError(f"surface_margin_mm must be >= 0, got {self.surface_margin_mm}")
        if not isinstance(self.mirror_augmentation, bool):
            raise ValueError(f"mirror_augmentation must be True or False, got {self.mirror_augmentation!r}")


def load_networks(device=None, weights_dir: Optional[Path] = None, roles: Tuple[str, ...] = ("bbox", "brain")
                  ) -> Dict[str, "object"]:
    """The LinkNet3d networks named in ``roles`` (``"bbox"``, ``"brain"``) in eval mode, float32, on ``device``.

    ``weights_dir``: a folder holding the card and the weights; None: the shipped card, the weights
    found by the weights store (package, ``$ANONMRI_WEIGHTS_DIR``, user cache, download).
    """
    import torch
    from safetensors.torch import load_file

    from ...models.linknet3d import LinkNet3d, LinkNet3dConfig

    card_path = CARD_FILE if weights_dir is None else Path(weights_dir) / CARD_FILE
    card = read_model_card(weights_dir, CARD_FILE)
    config = LinkNet3dConfig(**card.get("config", {}))
    networks = {}
    for role in roles:
        entry = card.get("files", {}).get(role)
        if entry is None:
            raise WeightsError(f"the model card {card_path} lists no {role!r} weights")
        path = weights_file(weights_dir, entry["file"], what=f"deepbet brain-extraction weights ({role})")
        verify_sha256(path, entry["sha256"], what="brain-extraction weights")
        network = LinkNet3d(config)
        try:
            network.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()}, strict=True)
        except RuntimeError as error:
            raise WeightsError(f"brain-extraction weights {path} do not fit LinkNet3d: {error}") from None
        networks[role] = network.eval().to(device if device is not None else torch.device("cpu"))
    return networks


def _normalize(x, low, high):
    x = ((x - low) / (high - low)).clamp(0, 1)
    x = (x - x.mean()) / x.std().clamp_min(1e-8)
    return 0.226 * x + 0.449


#: the left-right axis of a network input (batch, channel, R, A, S) in the RAS-reoriented frame
MIRROR_DIM = 2


def brain_probability(network, x, mirror: bool = False):
    """``network``'s brain-class probability (channel 1) of ``x`` (1, 1, R, A, S), same shape.

    ``mirror``: average it with the probability of the left-right mirrored input, mirrored back
    (two separate forward passes, so a mirrored ``x`` gives exactly the mirrored result).
    """
    probability = network(x)[:, 1:2]
    if mirror:
        mirrored = network(x.flip(MIRROR_DIM))[:, 1:2].flip(MIRROR_DIM)
        probability = (probability + mirrored) / 2
    return probability


def coarse_brain(network, x, mirror: bool = False):
    """deepbet's first stage: the bounding-box network's brain on a :data:`SMALL_SHAPE`
    nearest-neighbour view of the RAS-reoriented image ``x`` (a torch tensor).

    Returns the largest face-connected component of its probability > :data:`BBOX_THRESHOLD`
    (bool numpy array of :data:`SMALL_SHAPE`) and the view's 0.5 / 99.5 percentiles (torch
    scalars, reused by the brain network's normalisation). :class:`InputError` for a constant image.
    """
    import torch
    import torch.nn.functional as F

    with torch.no_grad():
        x_small = F.interpolate(x[None, None], SMALL_SHAPE, mode="nearest-exact")[0, 0]
        low, high = torch.quantile(x_small.flatten(), torch.tensor([0.005, 0.995], device=x.device))
        if not bool(high > low):
            raise InputError("the image has no intensity contrast; no brain can be found in it")
        probability_small = brain_probability(network, _normalize(x_small, low, high)[None, None], mirror)[0, 0]
    return largest_component((probability_small > BBOX_THRESHOLD).cpu().numpy()), (low, high)


def _bounding_box(mask_small: np.ndarray, full_shape, margin: float = BBOX_MARGIN) -> Tuple[slice, ...]:
    """deepbet's box: rows/columns/planes whose mean foreground exceeds 2 %, widened by ``margin``."""
    scale = np.asarray(full_shape, float) / np.asarray(mask_small.shape, float)
    box = []
    for axis in range(3):
        other = tuple(a for a in range(3) if a != axis)
        indices = np.nonzero(mask_small.mean(axis=other) > 0.02)[0]
        if indices.size == 0:
            raise InputError("no brain was found in the image (is it a T1-weighted head MRI?)")
        center = scale[axis] * (indices.max() + 1 + indices.min()) / 2
        size = (1 + 2 * margin) * scale[axis] * ((indices.max() + 1) - indices.min())
        center, size = np.round(center), np.round(size)
        box.append(slice(max(0, int(center - size / 2)), min(int(full_shape[axis]), int(center + size / 2))))
    return tuple(box)


def shrink_surface(mask: np.ndarray, spacing, margin_mm: float) -> np.ndarray:
    """``mask`` without the voxels within ``margin_mm`` (Euclidean, mm) of its outside; largest part kept.

    ``spacing`` is the voxel size along the array's axes (mm). Distances are measured between
    voxel centres, so a border voxel lies one spacing from the outside: a margin smaller than the
    spacing changes nothing. Distances within ``SPACING_TOLERANCE_MM`` of the margin count as
    inside it, so header float noise (a "1 mm" spacing stored as 1.00000001) does not decide.
    """
    from scipy import ndimage

    if margin_mm <= 0 or not mask.any():
        return mask.astype(bool)
    region = ndimage.find_objects(mask.astype(np.uint8))[0]
    region = tuple(slice(max(0, s.start - 1), s.stop + 1) for s in region)
    crop = np.pad(mask[region].astype(bool), 1)  # padding: the array's edge counts as outside
    depth = ndimage.distance_transform_edt(crop, sampling=[float(x) for x in spacing])[1:-1, 1:-1, 1:-1]
    shrunk = np.zeros(mask.shape, dtype=bool)
    kept = depth > margin_mm + SPACING_TOLERANCE_MM
    if not kept.any():
        return shrunk
    shrunk[region] = largest_component(kept)
    return shrunk


def compute_brain_mask(volume: Volume, progress: Optional[ProgressCallback] = None, device=None,
                       networks: Optional[dict] = None, config: DeepbetConfig = DeepbetConfig()) -> np.ndarray:
    """Boolean brain mask on ``volume``'s grid (see the module docstring for the steps)."""
    import torch
    import torch.nn.functional as F
    from scipy import ndimage

    report(progress, 0.0, "loading brain-extraction networks")
    networks = networks if networks is not None else load_networks(device)
    device = next(networks["brain"].parameters()).device
    data = np.nan_to_num(np.asarray(volume.array, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    data, orientation = to_ras(data, volume.affine)
    x = torch.from_numpy(np.ascontiguousarray(data)).to(device)

    report(progress, 0.1, "finding the brain's bounding box")
    mask_small, (low, high) = coarse_brain(networks["bbox"], x, config.mirror_augmentation)
    box = _bounding_box(mask_small.astype(np.float32), data.shape)

    report(progress, 0.3, "segmenting the brain")
    with torch.no_grad():
        crop = x[box]
        crop_large = F.interpolate(crop[None, None], BRAIN_SHAPE, mode="nearest-exact")
        probability = brain_probability(networks["brain"], _normalize(crop_large, low, high),
                                        config.mirror_augmentation)
        probability = F.interpolate(probability, tuple(crop.shape), mode="nearest-exact")[0, 0]
    report(progress, 0.85, "cleaning the mask")
    mask = np.zeros(data.shape, dtype=bool)
    region = largest_component(probability.cpu().numpy() > config.threshold)
    mask[box] = ndimage.binary_fill_holes(region)
    mask = from_ras(mask, orientation)
    mask = shrink_surface(mask, volume.spacing, config.surface_margin_mm)
    report(progress, 1.0, "brain mask done")
    return np.ascontiguousarray(mask)
