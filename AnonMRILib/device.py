"""Choose the torch device (``auto``: CUDA when available, ``cpu``, ``cuda``) and the precision a
network's inference runs in there (bfloat16 on a CPU that computes it in hardware, else float32)."""
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


#: how a network's inference is computed: ``auto`` (bfloat16 where the CPU computes it in
#: hardware, :func:`cpu_has_fast_bfloat16`; float32 on other CPUs and on CUDA), ``float32``, ``bfloat16``
PRECISIONS = ("auto", "float32", "bfloat16")


def cpu_has_fast_bfloat16() -> bool:
    """True when this CPU computes bfloat16 in hardware (AVX-512 BF16 or Intel AMX): there bfloat16
    took 40 % off HD-BET's CPU time on a 1 mm head; elsewhere it is emulated and slower."""
    import torch

    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    try:
        return any(bool(probe()) for probe in probes if probe is not None)
    except RuntimeError:  # a torch build without the CPU probes
        return False


def uses_bfloat16(device, precision: str = "auto") -> bool:
    """Whether inference on ``device`` (a torch.device or its name) runs in bfloat16 for
    ``precision`` (one of :data:`PRECISIONS`)."""
    if precision not in PRECISIONS:
        raise AnonMRIError(f"unknown precision {precision!r} (use {', '.join(PRECISIONS)})")
    kind = getattr(device, "type", str(device)).split(":")[0]
    if precision == "auto":
        return kind == "cpu" and cpu_has_fast_bfloat16()
    return precision == "bfloat16"


def inference_autocast(device, precision: str = "auto"):
    """A context in which the networks' operations run in bfloat16 when :func:`uses_bfloat16`
    (``torch.autocast``: convolutions and matrix products in bfloat16, reductions and softmax in
    float32), else one that changes nothing."""
    import contextlib

    import torch

    kind = getattr(device, "type", str(device)).split(":")[0]
    if not uses_bfloat16(device, precision):
        return contextlib.nullcontext()
    return torch.autocast("cuda" if kind == "cuda" else "cpu", dtype=torch.bfloat16)


def in_precision(network, precision: str = "auto"):
    """``network`` (a torch module in float32) for inference in ``precision``: a bfloat16 copy when
    :func:`uses_bfloat16` on its device (weights, activations and normalisation statistics in
    bfloat16; the caller casts its input to the parameters' dtype), else ``network`` itself."""
    import copy

    import torch

    parameter = next(network.parameters())
    if parameter.dtype == torch.bfloat16 or not uses_bfloat16(parameter.device, precision):
        return network
    return copy.deepcopy(network).to(torch.bfloat16)
