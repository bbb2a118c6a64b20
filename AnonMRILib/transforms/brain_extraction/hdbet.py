"""HD-BET brain extraction (Isensee et al. 2019) re-implemented on AnonMRI's safetensors weights.

The network is :class:`~AnonMRILib.models.hdbet_unet.HDBetUNet` with one of HD-BET's five folds
(fold 0, Apache-2.0), loaded from ``AnonMRILib/weights/brain_extraction/hdbet_fold0.safetensors``
(converted by ``Training/convert_hdbet_weights.py``, checked against the SHA-256 in
``hdbet.json``). The steps are HD-BET's "fast" mode (one fold, no test-time mirroring; the full
mode, five folds x eight mirrorings, is 40x the cost and does not fit 60 s on 2 CPU cores):

1. the volume is permuted/flipped to the closest RAS orientation (no interpolation) and its axes
   reversed to (S, A, R): the array order in which HD-BET's network was trained (SimpleITK's
   z, y, x of images in standard orientation);
2. resampled to 1.5 mm isotropic (cubic spline, scikit-image, as HD-BET) and standardised to zero
   mean and unit variance over the whole volume;
3. zero-padded at the upper end of each axis to a multiple of 16 and at least 128 voxels;
4. the brain probability (softmax) is thresholded at 0.5 (HD-BET's argmax of two classes) and
   the largest 26-connected component kept (HD-BET's post-processing);
5. AnonMRI's changes: (a) the mask is resampled back (nearest) straight onto the input's grid,
   extent onto extent -- the exact inverse of step 2 -- where HD-BET rounds a shape and then pads
   or cuts it centrally, which can shift the mask by up to a voxel; (b) holes are filled, so that
   everything inside the brain surface (e.g. a ventricle the network missed) counts as brain and
   is preserved bit for bit.
Runs in float32 on ``device`` (CPU by default). Peak memory on CPU for a 1 mm 256^3 head: see
``Training/benchmark_brain_mask.py`` and the README.
"""
from pathlib import Path
from typing import Optional

import numpy as np

from ...errors import InputError, WeightsError
from ...io.volume import Volume
from ...models.model_card import verify_sha256
from ...progress import ProgressCallback, report
from .common import WEIGHTS_DIR, from_ras, largest_component, read_model_card, to_ras

CARD_FILE = "hdbet.json"
#: HD-BET's working resolution (mm, isotropic)
MODEL_SPACING_MM = 1.5
#: every axis of the network input is padded to a multiple of this, and to at least MIN_SIZE
SIZE_MULTIPLE = 16
MIN_SIZE = 128
THRESHOLD = 0.5


def load_network(device=None, weights_dir: Path = WEIGHTS_DIR):
    """The :class:`HDBetUNet` with the shipped fold, in eval mode, float32, on ``device``."""
    import torch
    from safetensors.torch import load_file

    from ...models.hdbet_unet import HDBetUNet, HDBetUNetConfig

    card = read_model_card(weights_dir, CARD_FILE)
    if "file" not in card or "sha256" not in card:
        raise WeightsError(f"the model card {Path(weights_dir) / CARD_FILE} names no weights file")
    path = Path(weights_dir) / card["file"]
    if not path.is_file():
        raise WeightsError(f"brain-extraction weights missing: {path}")
    verify_sha256(path, card["sha256"], what="brain-extraction weights")
    try:
        network = HDBetUNet(HDBetUNetConfig.from_dict(card.get("config", {})))
        network.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()}, strict=True)
    except (RuntimeError, ValueError) as error:
        raise WeightsError(f"brain-extraction weights {path} do not fit HDBetUNet: {error}") from None
    return network.eval().to(device if device is not None else torch.device("cpu"))


def padded_shape(shape) -> tuple:
    """``shape`` rounded up to a multiple of :data:`SIZE_MULTIPLE` and at least :data:`MIN_SIZE`."""
    return tuple(max(MIN_SIZE, -(-int(n) // SIZE_MULTIPLE) * SIZE_MULTIPLE) for n in shape)


def model_grid_shape(shape, spacing) -> tuple:
    """Shape of an array of ``shape`` voxels of ``spacing`` mm resampled to 1.5 mm (HD-BET's rounding)."""
    return tuple(max(1, int(round(float(s) / MODEL_SPACING_MM * int(n)))) for n, s in zip(shape, spacing))


def brain_probability(network, image: np.ndarray) -> np.ndarray:
    """HD-BET's brain probability of a standardised (D, H, W) float32 array, same shape."""
    import torch

    device = next(network.parameters()).device
    padded = np.zeros(padded_shape(image.shape), dtype=np.float32)
    padded[tuple(slice(0, n) for n in image.shape)] = image
    with torch.inference_mode():
        logits = network(torch.from_numpy(padded)[None, None].to(device))
        probability = torch.softmax(logits, dim=1)[0, 1]
    return probability[tuple(slice(0, n) for n in image.shape)].cpu().numpy()


def compute_brain_mask(volume: Volume, progress: Optional[ProgressCallback] = None, device=None,
                       network=None) -> np.ndarray:
    """Boolean brain mask on ``volume``'s grid (see the module docstring for the steps)."""
    from scipy import ndimage
    from skimage.transform import resize

    report(progress, 0.0, "loading the brain-extraction network")
    network = network if network is not None else load_network(device)
    data = np.nan_to_num(np.asarray(volume.array, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    ras, orientation = to_ras(data, volume.affine)
    spacing_ras = np.asarray(volume.spacing, float)[np.argsort(orientation[:, 0])]
    image = np.ascontiguousarray(np.transpose(ras, (2, 1, 0)))  # (S, A, R)
    spacing = spacing_ras[::-1]

    report(progress, 0.1, "resampling to 1.5 mm")
    image = resize(image, model_grid_shape(image.shape, spacing), order=3, mode="edge",
                   anti_aliasing=False, preserve_range=True).astype(np.float32)
    std = float(image.std())
    if not std > 0:
        raise InputError("the image has no intensity contrast; no brain can be found in it")
    image = (image - float(image.mean())) / std

    report(progress, 0.2, "segmenting the brain")
    probability = brain_probability(network, image)
    report(progress, 0.85, "cleaning the mask")
    mask = probability > THRESHOLD
    if not mask.any():
        raise InputError("no brain was found in the image (is it a T1-weighted head MRI?)")
    mask = largest_component(mask, full_connectivity=True)
    mask = resize(mask, ras.shape[::-1], order=0, mode="edge", anti_aliasing=False,
                  preserve_range=True).astype(bool)
    mask = ndimage.binary_fill_holes(mask)
    mask = from_ras(np.transpose(mask, (2, 1, 0)), orientation)
    report(progress, 1.0, "brain mask done")
    return np.ascontiguousarray(mask)
