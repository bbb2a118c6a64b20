"""Image I/O: the :class:`Volume` type, readers, atomic writers with scrubbed headers."""
from .formats import READ_SUFFIXES, WRITE_SUFFIXES, image_suffix, stem
from .readers import list_dicom_series, load_volume
from .volume import Volume, as_binary_mask, require_same_grid, require_usable_image
from .writers import cast_to_dtype, check_output_path, save_volume

__all__ = [
    "Volume", "load_volume", "save_volume", "check_output_path", "cast_to_dtype", "as_binary_mask",
    "require_same_grid", "require_usable_image", "list_dicom_series", "image_suffix", "stem",
    "READ_SUFFIXES", "WRITE_SUFFIXES",
]
