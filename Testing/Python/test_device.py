"""Device and precision choices (``AnonMRILib.device``): which inference runs in bfloat16, and that
asking for it never changes the caller's network."""
import pytest
import torch

from AnonMRILib.device import PRECISIONS, cpu_has_fast_bfloat16, in_precision, inference_autocast, uses_bfloat16
from AnonMRILib.errors import AnonMRIError


def test_auto_uses_bfloat16_only_on_a_cpu_that_computes_it():
    assert uses_bfloat16("cpu", "auto") == cpu_has_fast_bfloat16()
    assert uses_bfloat16(torch.device("cpu")) == cpu_has_fast_bfloat16()
    assert not uses_bfloat16("cuda", "auto") and not uses_bfloat16(torch.device("cuda", 0), "auto")
    for device in ("cpu", "cuda"):
        assert not uses_bfloat16(device, "float32")
        assert uses_bfloat16(device, "bfloat16")
    assert set(PRECISIONS) == {"auto", "float32", "bfloat16"}
    with pytest.raises(AnonMRIError, match="unknown precision"):
        uses_bfloat16("cpu", "float16")


def test_in_precision_returns_a_bfloat16_copy_and_leaves_the_network_alone():
    network = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 3), torch.nn.InstanceNorm3d(2))
    assert in_precision(network, "float32") is network
    copy = in_precision(network, "bfloat16")
    assert copy is not network
    assert all(p.dtype == torch.bfloat16 for p in copy.parameters())
    assert all(p.dtype == torch.float32 for p in network.parameters())
    assert in_precision(copy, "bfloat16") is copy  # already bfloat16: no second copy
    x = torch.randn(1, 1, 8, 8, 8)
    with torch.no_grad():
        assert torch.allclose(copy(x.bfloat16()).float(), network(x), atol=0.1)


def test_inference_autocast_changes_nothing_in_float32():
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with inference_autocast("cpu", "float32"):
        assert layer(x).dtype == torch.float32
    with inference_autocast("cpu", "bfloat16"):
        assert layer(x).dtype == torch.bfloat16
