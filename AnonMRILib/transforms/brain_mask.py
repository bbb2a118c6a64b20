"""Brain mask b(x): which voxels are brain and must be preserved bit for bit.

INTERFACE (backends filled in by the brain-mask work):
    brain_mask(volume, backend="auto", progress=None) -> Volume   # uint8 0/1 on volume's grid
    user_brain_mask(mask, image) -> Volume                          # a user's mask, checked
    resolve_brain_mask(image, brain_mask=None, backend="auto", progress=None) -> Volume
"""
from typing import Optional

from ..errors import InputError
from ..io.volume import Volume, as_binary_mask, require_same_grid
from ..progress import ProgressCallback


def user_brain_mask(mask: Volume, image: Volume) -> Volume:
    """A user-supplied mask (nonzero = brain) checked to lie on ``image``'s grid, as uint8 0/1."""
    require_same_grid(image, mask, what="brain mask")
    return as_binary_mask(mask, what="brain mask")


def brain_mask(volume: Volume, backend: str = "auto", progress: Optional[ProgressCallback] = None) -> Volume:
    """Compute the brain mask of a whole-head T1 ``volume``; uint8 0/1 Volume on its grid."""
    raise InputError("no brain-mask backend is available yet")


def resolve_brain_mask(image: Volume, brain_mask_volume: Optional[Volume] = None, backend: str = "auto",
                       progress: Optional[ProgressCallback] = None) -> Volume:
    """The user's mask when given (checked), else :func:`brain_mask` of ``image``."""
    if brain_mask_volume is not None:
        return user_brain_mask(brain_mask_volume, image)
    return brain_mask(image, backend=backend, progress=progress)
