"""Choose the torch device: ``auto`` (CUDA when available), ``cpu`` or ``cuda``."""
from .errors import AnonMRIError

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str = "auto"):
    """A ``torch.device`` for ``name``; ``cuda`` without a usable GPU is a clear error."""
    import torch

    if name not in DEVICE_CHOICES and not str(name).startswith("cuda:"):
        raise AnonMRIError(f"unknown device {name!r} (use auto, cpu or cuda)")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(name).startswith("cuda") and not torch.cuda.is_available():
        raise AnonMRIError("--device cuda was asked for but no CUDA GPU is available to torch; use --device cpu")
    return torch.device(name)


def is_cuda_out_of_memory(error: BaseException) -> bool:
    """True when ``error`` is torch's CUDA out-of-memory error."""
    import torch

    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(error, oom)) or "CUDA out of memory" in str(error)
