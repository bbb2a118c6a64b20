"""Errors raised for bad input or an unusable environment.

Every error a user can cause derives from :class:`AnonMRIError`; the CLI prints its message as one
line on stderr and exits with status 2, the Slicer panel shows it in a message box. Messages never
contain patient names; they name files only by the path the user gave.
"""


class AnonMRIError(Exception):
    """Base class of all user-facing errors (bad input, missing weights, impossible request)."""


class InputError(AnonMRIError, ValueError):
    """The input image, mask or path cannot be used (wrong type, dimensions, values, geometry)."""


class WeightsError(AnonMRIError):
    """Model weights are missing, corrupt or do not match the model configuration."""


class InvariantError(AnonMRIError):
    """An output failed its invariant check (e.g. brain voxels changed); nothing was written."""


class DependencyError(AnonMRIError, ImportError):
    """An optional dependency needed for the requested operation is not installed."""
