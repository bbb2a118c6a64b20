"""Face volume rendering through Slicer's volume-rendering logic, in 3D views and offscreen.

- :func:`face_volume_property_node` makes the "AnonMRI face" transfer function for a volume: fully
  transparent below the skin level, opaque skin-coloured surface above it, shaded (the skin level
  is the library's :func:`AnonMRILib.rendering.skin_iso_level`, so both renderings show the same
  surface);
- :func:`show_face_rendering` turns volume rendering on for a volume node with that preset (through
  ``vtkSlicerVolumeRenderingLogic``), optionally only in some 3D views;
- :func:`look_at_face` points a camera node at the face (anterior by default);
- :class:`OffscreenThreeDView` is a minimal Slicer 3D view (displayable managers on an offscreen
  ``vtkRenderWindow``) that renders the scene to a numpy image or a PNG, without Qt.

Only ``vtk`` and the MRML / Slicer logic classes are used.
"""
import itertools
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

_offscreen_view_numbers = itertools.count(1)

FACE_PRESET_NAME = "AnonMRI face"

#: camera direction (from the head towards the camera, RAS) and view-up for each named view
VIEW_DIRECTIONS: Dict[str, Tuple[Tuple[float, float, float], Tuple[float, float, float]]] = {
    "anterior": ((0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
    "posterior": ((0.0, -1.0, 0.0), (0.0, 0.0, 1.0)),
    "left": ((-1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
    "right": ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
    "superior": ((0.0, 0.0, 1.0), (0.0, 1.0, 0.0)),
    "inferior": ((0.0, 0.0, -1.0), (0.0, -1.0, 0.0)),
}


def skin_level(volume_node) -> float:
    """The intensity of the skin surface of ``volume_node`` (library's automatic threshold)."""
    from . import mrml

    volume = mrml.volume_from_node(volume_node)
    try:
        from AnonMRILib.rendering import skin_iso_level

        return float(skin_iso_level(volume))
    except ImportError:  # scikit-image not installed yet: half the mean of the upper half
        data = np.asarray(volume.array, dtype=np.float64).ravel()[::7]
        return float(0.5 * data[data > np.median(data)].mean())


def face_volume_property_node(scene, volume_node, name: str = FACE_PRESET_NAME):
    """A ``vtkMRMLVolumePropertyNode`` that shows the skin surface of ``volume_node``."""
    import vtk

    level = skin_level(volume_node)
    image = volume_node.GetImageData()
    low, high = image.GetScalarRange()
    width = max(1e-6, 0.1 * abs(level))
    node = scene.AddNewNodeByClass("vtkMRMLVolumePropertyNode", scene.GenerateUniqueName(name))
    volume_property = node.GetVolumeProperty()
    opacity = vtk.vtkPiecewiseFunction()
    opacity.AddPoint(min(low, level - 2 * width), 0.0)
    opacity.AddPoint(level - width, 0.0)
    opacity.AddPoint(level + width, 1.0)
    opacity.AddPoint(max(high, level + 2 * width), 1.0)
    colors = vtk.vtkColorTransferFunction()
    colors.AddRGBPoint(min(low, level - 2 * width), 0.0, 0.0, 0.0)
    colors.AddRGBPoint(level, 0.87, 0.72, 0.62)
    colors.AddRGBPoint(max(high, level + 2 * width), 1.0, 0.93, 0.86)
    volume_property.SetScalarOpacity(opacity)
    volume_property.SetColor(colors)
    volume_property.ShadeOn()
    volume_property.SetAmbient(0.25)
    volume_property.SetDiffuse(0.8)
    volume_property.SetSpecular(0.15)
    volume_property.SetInterpolationTypeToLinear()
    return node


def show_face_rendering(volume_rendering_logic, volume_node, view_node_ids: Optional[Sequence[str]] = None,
                        property_node=None):
    """Volume-render ``volume_node`` with the face preset; returns its volume rendering display node.

    ``view_node_ids``: show it only in these 3D views (all views when None).
    """
    scene = volume_node.GetScene()
    display = volume_rendering_logic.GetFirstVolumeRenderingDisplayNode(volume_node)
    if display is None:
        display = volume_rendering_logic.CreateDefaultVolumeRenderingNodes(volume_node)
    if property_node is None:
        property_node = face_volume_property_node(scene, volume_node)
    display.GetVolumePropertyNode().Copy(property_node)
    if property_node.GetScene() is scene and property_node is not display.GetVolumePropertyNode():
        scene.RemoveNode(property_node)
    display.RemoveAllViewNodeIDs()
    for view_id in view_node_ids or ():
        display.AddViewNodeID(view_id)
    display.SetVisibility(True)
    return display


def look_at_face(camera_node, volume_node, view: str = "anterior", distance_factor: float = 2.5) -> None:
    """Point ``camera_node`` at the centre of ``volume_node`` from ``view`` (anterior: the face)."""
    if view not in VIEW_DIRECTIONS:
        raise ValueError(f"unknown view {view!r}; choose one of {', '.join(VIEW_DIRECTIONS)}")
    bounds = [0.0] * 6
    volume_node.GetRASBounds(bounds)
    lo = np.array(bounds[0::2])
    hi = np.array(bounds[1::2])
    center = (lo + hi) / 2.0
    radius = float(np.linalg.norm(hi - lo)) / 2.0
    direction, up = (np.array(v) for v in VIEW_DIRECTIONS[view])
    camera_node.SetFocalPoint(*center)
    camera_node.SetPosition(*(center + distance_factor * radius * direction))
    camera_node.SetViewUp(*up)
    if hasattr(camera_node, "ResetClippingRange"):
        camera_node.ResetClippingRange()


class OffscreenThreeDView:
    """A Slicer 3D view without Qt: view node + displayable managers on an offscreen render window.

    The volume-rendering displayable manager draws what ``vtkSlicerVolumeRenderingLogic`` set up,
    exactly as in Slicer's 3D views; use :meth:`render` to grab the image.
    """

    MANAGERS = ("vtkMRMLVolumeRenderingDisplayableManager", "vtkMRMLCameraDisplayableManager",
                "vtkMRMLViewDisplayableManager")

    def __init__(self, scene, application_logic, name: Optional[str] = None, size: Tuple[int, int] = (256, 256)):
        import slicer
        import vtk

        self.scene = scene
        self.render_window = vtk.vtkRenderWindow()
        self.render_window.SetOffScreenRendering(1)
        self.render_window.SetMultiSamples(0)
        self.render_window.SetSize(int(size[0]), int(size[1]))
        self.renderer = vtk.vtkRenderer()
        self.render_window.AddRenderer(self.renderer)
        self.interactor = vtk.vtkRenderWindowInteractor()  # displayable managers need one
        self.interactor.SetRenderWindow(self.render_window)
        self.interactor.Initialize()
        factory = slicer.vtkMRMLThreeDViewDisplayableManagerFactory.GetInstance()
        factory.SetMRMLApplicationLogic(application_logic)
        for manager in self.MANAGERS:
            if not factory.IsDisplayableManagerRegistered(manager):
                factory.RegisterDisplayableManager(manager)
        self.managers = slicer.vtkMRMLDisplayableManagerGroup()
        self.managers.Initialize(factory, self.renderer)
        self.view_logic = slicer.vtkMRMLViewLogic()
        self.view_logic.SetMRMLApplicationLogic(application_logic)
        self.view_logic.SetMRMLScene(scene)
        self.view_node = self.view_logic.AddViewNode(name or f"AnonMRIOffscreen{next(_offscreen_view_numbers)}")
        self.view_node.SetBoxVisible(False)
        self.view_node.SetAxisLabelsVisible(False)
        self.view_node.SetBackgroundColor(0.0, 0.0, 0.0)
        self.view_node.SetBackgroundColor2(0.0, 0.0, 0.0)
        self.managers.SetMRMLDisplayableNode(self.view_node)

    @property
    def camera_node(self):
        return self.managers.GetDisplayableManagerByClassName("vtkMRMLCameraDisplayableManager").GetCameraNode()

    def render(self) -> np.ndarray:
        """The view as an (H, W, 3) uint8 RGB image, row 0 at the top."""
        import vtk
        from vtk.util import numpy_support

        self.renderer.ResetCameraClippingRange()
        self.render_window.Render()
        grabber = vtk.vtkWindowToImageFilter()
        grabber.SetInput(self.render_window)
        grabber.SetInputBufferTypeToRGB()
        grabber.ReadFrontBufferOff()
        grabber.Update()
        output = grabber.GetOutput()
        width, height, _ = output.GetDimensions()
        pixels = numpy_support.vtk_to_numpy(output.GetPointData().GetScalars()).reshape(height, width, -1)
        return np.ascontiguousarray(pixels[::-1, :, :3])

    def save_png(self, path: str) -> np.ndarray:
        """Render and write a PNG; returns the image."""
        import vtk
        from vtk.util import numpy_support

        pixels = self.render()
        height, width, _ = pixels.shape
        image = vtk.vtkImageData()
        image.SetDimensions(width, height, 1)
        scalars = numpy_support.numpy_to_vtk(np.ascontiguousarray(pixels[::-1]).reshape(-1, 3), deep=True)
        image.GetPointData().SetScalars(scalars)
        writer = vtk.vtkPNGWriter()
        writer.SetFileName(str(path))
        writer.SetInputData(image)
        writer.Write()
        return pixels

    def close(self) -> None:
        """Detach the displayable managers and remove this view's nodes from the scene."""
        camera = self.camera_node
        self.managers.SetMRMLDisplayableNode(None)
        self.render_window.Finalize()
        for node in (camera, self.view_node):
            if node is not None and node.GetScene() is self.scene:
                self.scene.RemoveNode(node)


def attach_volume_rendering_logic(scene):
    """(application logic, volume-rendering logic) wired to ``scene`` as Slicer's application does.

    Only needed outside Slicer (slicer-core tests, figure scripts); inside Slicer use the module's
    logic. Detach with ``volume_rendering_logic.SetMRMLScene(None)`` and
    ``application_logic.SetMRMLScene(None)``.
    """
    import slicer

    application_logic = slicer.vtkMRMLApplicationLogic()
    application_logic.SetMRMLScene(scene)
    volume_rendering_logic = slicer.vtkSlicerVolumeRenderingLogic()
    volume_rendering_logic.SetMRMLApplicationLogic(application_logic)
    volume_rendering_logic.SetMRMLScene(scene)
    application_logic.SetModuleLogic("VolumeRendering", volume_rendering_logic)
    return application_logic, volume_rendering_logic


def render_face_offscreen(scene, application_logic, volume_rendering_logic, volume_node, view: str = "anterior",
                          size: int = 256, png_path: Optional[str] = None) -> np.ndarray:
    """Volume-render the face of ``volume_node`` offscreen (Slicer's VR logic + displayable manager)."""
    previous = volume_rendering_logic.GetFirstVolumeRenderingDisplayNode(volume_node)
    previous_state = None
    if previous is not None:
        previous_state = (previous.GetVisibility(),
                          [previous.GetNthViewNodeID(n) for n in range(previous.GetNumberOfViewNodeIDs())])
    offscreen = OffscreenThreeDView(scene, application_logic, size=(size, size))
    display = None
    try:
        display = show_face_rendering(volume_rendering_logic, volume_node, [offscreen.view_node.GetID()])
        look_at_face(offscreen.camera_node, volume_node, view)
        return offscreen.save_png(png_path) if png_path else offscreen.render()
    finally:
        offscreen.close()
        if display is None:
            pass
        elif previous_state is None:  # leave the scene as it was: drop the nodes made here
            helpers = [display.GetVolumePropertyNode(), display.GetROINode() if hasattr(display, "GetROINode") else None]
            volume_rendering_logic.RemoveVolumeRenderingDisplayNode(display)
            for node in [display] + helpers:
                if node is not None and node.GetScene() is scene:
                    scene.RemoveNode(node)
        else:
            display.RemoveAllViewNodeIDs()
            for view_id in previous_state[1]:
                display.AddViewNodeID(view_id)
            display.SetVisibility(previous_state[0])
