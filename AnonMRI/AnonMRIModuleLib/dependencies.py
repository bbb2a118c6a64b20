"""Which Python packages AnonMRILib needs inside Slicer, and which of them are missing.

The panel asks before installing anything (``slicer.packaging.pip_ensure`` on Slicer >= 5.12,
else ``slicer.util.pip_install`` after a confirmation); torch is installed through SlicerPyTorch's
``PyTorchUtils`` when that extension is present, so the CUDA build matches the driver.
"""
import importlib.util
from dataclasses import dataclass
from typing import List, Sequence


@dataclass(frozen=True)
class Requirement:
    """A package: the name Python imports, and the pip requirement that provides it."""

    import_name: str
    pip_requirement: str

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.import_name) is not None


#: what AnonMRILib imports, in install order (torch last: it is the big one)
REQUIREMENTS = (
    Requirement("numpy", "numpy>=1.22"),
    Requirement("scipy", "scipy>=1.9"),
    Requirement("nibabel", "nibabel>=5.0"),
    Requirement("SimpleITK", "SimpleITK>=2.2"),
    Requirement("skimage", "scikit-image>=0.21"),
    Requirement("safetensors", "safetensors>=0.4"),
    Requirement("tqdm", "tqdm>=4.60"),
    Requirement("monai", "monai>=1.3"),
    Requirement("torch", "torch>=2.0"),
)

TORCH = "torch"


def missing_requirements(requirements: Sequence[Requirement] = REQUIREMENTS) -> List[Requirement]:
    """The requirements whose package cannot be imported."""
    return [requirement for requirement in requirements if not requirement.installed]


def torch_devices() -> List[str]:
    """Devices torch can use here, e.g. ``["cpu", "cuda:0 (NVIDIA ...)"]``; ``[]`` without torch."""
    if importlib.util.find_spec(TORCH) is None:
        return []
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            devices.append(f"cuda:{index} ({torch.cuda.get_device_name(index)})")
    return devices
