"""Fixtures for the Slicer module tests: real MRML classes from Kitware's ``slicer-core`` wheel.

Run with ``python -m pytest Testing/Slicer`` after ``pip install -e ".[test]"`` (slicer-core needs
Python >= 3.10). Without slicer-core every test module here is skipped with that reason (each test
module calls :func:`slicer_helpers.require_slicer_core`; a conftest must not skip).
"""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE_DIR = os.path.join(ROOT, "AnonMRI")
for path in (ROOT, MODULE_DIR):
    if path not in sys.path:
        sys.path.insert(0, path)


@pytest.fixture
def scene():
    """An empty MRML scene with Slicer's default color tables (labelmaps need them)."""
    import slicer

    mrml_scene = slicer.vtkMRMLScene()
    color_logic = slicer.vtkMRMLColorLogic()
    color_logic.SetMRMLScene(mrml_scene)
    yield mrml_scene
    color_logic.SetMRMLScene(None)
    mrml_scene.Clear(1)
