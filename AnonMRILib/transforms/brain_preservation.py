"""Brain preservation: compose a generated head with the input's own brain voxels, bit for bit.

CP-GAN's f(gamma(x)) = b * x + (1 - b) * G(gamma(x)) (sec. 3.2) is applied in the *input's*
grid, after the generated volume has been resampled back from the model grid: every voxel of
the brain mask is copied from the input array unchanged (same dtype, same bits), never taken
from a resampled volume. :func:`compose_preserving` does this and checks it.
"""
import numpy as np

from ..errors import InputError, InvariantError
from ..io.volume import Volume, as_binary_mask, require_same_grid


def compose_preserving(input_volume: Volume, generated: Volume, brain_mask: Volume) -> Volume:
    """``where(brain, input, generated)`` on the input's grid, in the input's voxel type.

    ``generated`` (any numeric dtype, on the input's grid) is rounded/clipped to the input's
    dtype outside the brain; brain voxels are the input's, bit for bit (checked: raises
    :class:`InvariantError` otherwise). NaN/Inf in ``generated`` outside the brain is refused.
    """
    from ..io.writers import cast_to_dtype

    require_same_grid(input_volume, generated, what="generated volume")
    require_same_grid(input_volume, brain_mask, what="brain mask")
    brain = as_binary_mask(brain_mask, what="brain mask").array.astype(bool)
    generated_data = np.asarray(generated.array)
    if np.issubdtype(generated_data.dtype, np.floating) and not np.all(np.isfinite(generated_data[~brain])):
        raise InputError("the generated volume contains NaN or infinite values outside the brain")
    source = np.asarray(input_volume.array)
    output = cast_to_dtype(generated_data, source.dtype)
    output = np.where(brain, source, output).astype(source.dtype, copy=False)
    check_brain_preserved(input_volume, input_volume.with_array(output), brain_mask)
    return input_volume.with_array(output)


def check_brain_preserved(input_volume: Volume, output: Volume, brain_mask: Volume) -> None:
    """Raise :class:`InvariantError` unless ``output`` equals ``input_volume`` bit for bit on the brain."""
    if not input_volume.same_grid(output):
        raise InvariantError("the output does not lie on the input's grid")
    if output.dtype != input_volume.dtype:
        raise InvariantError(f"the output's voxel type {output.dtype} differs from the input's {input_volume.dtype}")
    brain = np.asarray(brain_mask.array) != 0
    a = np.ascontiguousarray(np.asarray(input_volume.array)[brain])
    b = np.ascontiguousarray(np.asarray(output.array)[brain])
    if a.tobytes() != b.tobytes():
        differs = a.view(np.uint8).reshape(a.shape[0], -1) != b.view(np.uint8).reshape(b.shape[0], -1)
        changed = int(np.count_nonzero(differs.any(axis=1)))
        raise InvariantError(f"{changed} brain voxels were changed; nothing was written")
