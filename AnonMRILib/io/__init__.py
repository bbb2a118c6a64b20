"""Image I/O: the :class:`Volume` type, readers, atomic (all-or-nothing) writers with scrubbed headers,
DICOM output under PS3.15 (:mod:`.dicom_writer`), BIDS sidecars (:mod:`.sidecar`)."""
from .formats import READ_SUFFIXES, WRITE_SUFFIXES, image_suffix, stem
from .readers import list_dicom_series, load_volume
from .volume import Volume, as_binary_mask, require_same_grid, require_usable_image
from .writers import OutputTransaction, cast_to_dtype, check_output_path, save_volume

__all__ = [
    "Volume", "load_volume", "save_volume", "OutputTransaction", "check_output_path", "cast_to_dtype", "as_binary_mask",
    "require_same_grid", "require_usable_image", "list_dicom_series", "image_suffix", "stem",
    "READ_SUFFIXES", "WRITE_SUFFIXES",
]
