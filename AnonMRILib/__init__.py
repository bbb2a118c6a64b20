"""AnonMRILib: de-identify MRI by remodeling the face or the non-lesion anatomy.

The library never imports Slicer. Heavy packages (torch, SimpleITK, scipy, ...) are imported
lazily, inside the functions that need them, so ``import AnonMRILib`` works in a bare Python
(Slicer's included) before the dependencies are installed.

Main entry points (imported on first use)::

    from AnonMRILib import load_volume, save_volume, brain_mask, sample_data
"""
import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it (resolved lazily by __getattr__)
_EXPORTS = {
    "Volume": "AnonMRILib.io",
    "load_volume": "AnonMRILib.io",
    "save_volume": "AnonMRILib.io",
    "brain_mask": "AnonMRILib.transforms.brain_mask",
    "privacy_transform": "AnonMRILib.transforms.privacy",
    "remodel_face": "AnonMRILib.pipelines.remodel",
    "anonymize_lesions": "AnonMRILib.pipelines.lesion",
    "deface": "AnonMRILib.pipelines.baselines",
    "render_face": "AnonMRILib.rendering",
    "scan_scores": "AnonMRILib.evaluation.scores",
    "AnonMRIError": "AnonMRILib.errors",
    "InputError": "AnonMRILib.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__", "sample_data"]


def __getattr__(name: str) -> Any:
    if name == "sample_data":
        return importlib.import_module("AnonMRILib.sample_data")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'AnonMRILib' has no attribute {name!r}")
