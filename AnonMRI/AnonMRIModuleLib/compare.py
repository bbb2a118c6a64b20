"""Linked before/after comparison on MRML nodes (no Qt): slice views, window/level, fade, 3D cameras.

- :func:`show_side_by_side`: the first slice view shows the input under the output (foreground
  opacity = the fade), the second the output alone; both views are linked (same slice, zoom, pan);
- :func:`share_window_level`: the output displayed with the input's window/level (no auto W/L), so
  grey values compare one to one;
- :class:`CameraLink`: two 3D views' cameras move together.
"""
from typing import List, Sequence

#: slice views used for the comparison (Slicer's "Side by side" layout shows Red and Yellow)
COMPARE_VIEWS = ("Red", "Yellow")


def share_window_level(input_node, output_node) -> None:
    """Display ``output_node`` with ``input_node``'s window and level (auto W/L switched off)."""
    source = input_node.GetDisplayNode()
    target = output_node.GetDisplayNode()
    if source is None or target is None:
        return
    window, level = source.GetWindow(), source.GetLevel()
    source.AutoWindowLevelOff()
    target.AutoWindowLevelOff()
    target.SetWindowLevel(window, level)


def show_side_by_side(composite_nodes: Sequence, input_node, output_node, fade: float = 0.5) -> None:
    """Input/output in two linked slice views: [0] input with the output faded over it, [1] output."""
    if len(composite_nodes) < 2:
        raise ValueError("two slice views are needed")
    share_window_level(input_node, output_node)
    first, second = composite_nodes[0], composite_nodes[1]
    first.SetBackgroundVolumeID(input_node.GetID())
    first.SetForegroundVolumeID(output_node.GetID())
    first.SetForegroundOpacity(min(1.0, max(0.0, float(fade))))
    second.SetBackgroundVolumeID(output_node.GetID())
    second.SetForegroundVolumeID(None)
    for node in (first, second):
        node.SetLinkedControl(True)


def set_fade(composite_nodes: Sequence, fade: float) -> None:
    """0: the input, 1: the output, in the first comparison view."""
    if composite_nodes:
        composite_nodes[0].SetForegroundOpacity(min(1.0, max(0.0, float(fade))))


class CameraLink:
    """Keep camera ``b`` where camera ``a`` is (and back): position, focal point, view-up."""

    def __init__(self, a, b) -> None:
        import vtk

        self._cameras = (a, b)
        self._busy = False
        self._tags: List = [(a, a.AddObserver(vtk.vtkCommand.ModifiedEvent, lambda caller, event: self._copy(a, b))),
                            (b, b.AddObserver(vtk.vtkCommand.ModifiedEvent, lambda caller, event: self._copy(b, a)))]
        self._copy(a, b)

    def _copy(self, source, target) -> None:
        if self._busy:
            return
        self._busy = True
        try:
            state = target.StartModify()
            target.SetPosition(source.GetPosition())
            target.SetFocalPoint(source.GetFocalPoint())
            target.SetViewUp(source.GetViewUp())
            target.EndModify(state)
        finally:
            self._busy = False

    def remove(self) -> None:
        """Unlink (the cameras stay where they are)."""
        for camera, tag in self._tags:
            camera.RemoveObserver(tag)
        self._tags = []
