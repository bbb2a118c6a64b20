"""The face view through Slicer's volume-rendering logic, rendered offscreen to a PNG (slicer-core).

The rendering runs the real ``vtkSlicerVolumeRenderingLogic`` + ``vtkMRMLVolumeRenderingDisplayableManager``
on an offscreen ``vtkRenderWindow`` (EGL or OSMesa). Where the machine has no offscreen OpenGL at all,
the tests are skipped with that reason (probed in a subprocess, as a missing driver can crash VTK).
"""
import subprocess
import sys

import numpy as np
import pytest

from AnonMRILib.io.volume import Volume
from AnonMRIModuleLib import mrml, render3d
from slicer_helpers import require_slicer_core, synthetic_head

slicer = require_slicer_core()  # skips this module without slicer-core

PROBE = """
import vtk
window = vtk.vtkRenderWindow()
window.SetOffScreenRendering(1)
window.SetSize(8, 8)
window.AddRenderer(vtk.vtkRenderer())
interactor = vtk.vtkRenderWindowInteractor()
interactor.SetRenderWindow(window)
interactor.Initialize()
window.Render()
print("OFFSCREEN-OK", window.GetClassName())
"""


def _offscreen_rendering_available():
    try:
        result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0 and "OFFSCREEN-OK" in result.stdout


pytestmark = pytest.mark.skipif(not _offscreen_rendering_available(),
                                reason="no offscreen OpenGL (EGL/OSMesa) on this machine")


@pytest.fixture
def vr_scene(scene):
    application_logic, volume_rendering_logic = render3d.attach_volume_rendering_logic(scene)
    yield scene, application_logic, volume_rendering_logic
    volume_rendering_logic.SetMRMLScene(None)
    application_logic.SetMRMLScene(None)


def _head_with_nose(nose: bool):
    head, _ = synthetic_head(shape=(48, 52, 44))
    array = head.array.copy()
    if nose:  # a block on the anterior (+j, +A) surface
        array[21:27, 45:52, 18:26] = 300
    return Volume(array, head.affine)


def _non_singleton_nodes(scene):
    """IDs of the scene's nodes but the subject hierarchy (Slicer's scene-wide node, made on first use)."""
    nodes = (scene.GetNthNode(index) for index in range(scene.GetNumberOfNodes()))
    return sorted(node.GetID() for node in nodes if not node.IsA("vtkMRMLSubjectHierarchyNode"))


def test_face_preset_shows_the_skin_surface(vr_scene):
    scene, _, _ = vr_scene
    node = mrml.add_volume_node(scene, _head_with_nose(True), "head")
    property_node = render3d.face_volume_property_node(scene, node)
    opacity = property_node.GetVolumeProperty().GetScalarOpacity()
    level = render3d.skin_level(node)
    assert 0 < level < 300  # between air (0) and skin/scalp (300)
    assert opacity.GetValue(0.0) == 0.0 and opacity.GetValue(300.0) == 1.0


def test_face_view_renders_offscreen_to_png(vr_scene, tmp_path):
    scene, application_logic, volume_rendering_logic = vr_scene
    with_nose = mrml.add_volume_node(scene, _head_with_nose(True), "with nose")
    without_nose = mrml.add_volume_node(scene, _head_with_nose(False), "without nose")
    nodes_before = _non_singleton_nodes(scene)
    png = tmp_path / "face.png"
    anterior = render3d.render_face_offscreen(scene, application_logic, volume_rendering_logic, with_nose,
                                              view="anterior", size=128, png_path=str(png))
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert anterior.shape == (128, 128, 3) and anterior.dtype == np.uint8
    foreground = anterior.sum(axis=2) > 0
    assert 0.1 < foreground.mean() < 0.9          # a head on a black background, not an empty frame
    # read the PNG back: it is the rendered image
    import vtk
    from vtk.util import numpy_support

    reader = vtk.vtkPNGReader()
    reader.SetFileName(str(png))
    reader.Update()
    width, height, _ = reader.GetOutput().GetDimensions()
    pixels = numpy_support.vtk_to_numpy(reader.GetOutput().GetPointData().GetScalars()).reshape(height, width, -1)
    np.testing.assert_array_equal(pixels[::-1, :, :3], anterior)

    # the camera looks at the face: the nose changes the anterior view but not the posterior one
    anterior_plain = render3d.render_face_offscreen(scene, application_logic, volume_rendering_logic,
                                                    without_nose, view="anterior", size=128)
    posterior = render3d.render_face_offscreen(scene, application_logic, volume_rendering_logic, with_nose,
                                               view="posterior", size=128)
    posterior_plain = render3d.render_face_offscreen(scene, application_logic, volume_rendering_logic,
                                                     without_nose, view="posterior", size=128)
    front_change = np.abs(anterior.astype(int) - anterior_plain.astype(int)).mean()
    back_change = np.abs(posterior.astype(int) - posterior_plain.astype(int)).mean()
    assert front_change > 1.0
    assert back_change < 0.2 * front_change
    assert _non_singleton_nodes(scene) == nodes_before  # offscreen views and their displays were removed again


def test_volume_rendering_display_is_limited_to_the_given_view(vr_scene):
    scene, application_logic, volume_rendering_logic = vr_scene
    node = mrml.add_volume_node(scene, _head_with_nose(False), "head")
    display = render3d.show_face_rendering(volume_rendering_logic, node, ["vtkMRMLViewNodeX"])
    assert display.GetVisibility()
    assert display.GetNumberOfViewNodeIDs() == 1 and display.GetNthViewNodeID(0) == "vtkMRMLViewNodeX"
    # only one volume property node per display: the preset was copied, not piled up
    assert scene.GetNodesByClass("vtkMRMLVolumePropertyNode").GetNumberOfItems() == 1
