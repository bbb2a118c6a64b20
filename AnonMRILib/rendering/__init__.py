"""Ray-cast face renderings (torch, CPU or CUDA) and before/after figures.

    from AnonMRILib.rendering import render_face, save_png, side_by_side
    image = render_face(volume, view="anterior", size=256)      # (256, 256) float32 in [0, 1]

Heavy imports (torch, skimage, Pillow) happen inside the functions.
"""
from .camera import VIEW_NAMES, Camera, make_camera
from .figures import check_png_path, save_png, side_by_side
from .raycast import RayCastResult, RenderSettings, SurfaceRenderer, ray_cast, render_face, skin_iso_level

__all__ = ["VIEW_NAMES", "Camera", "make_camera", "check_png_path", "save_png", "side_by_side", "RayCastResult",
           "RenderSettings", "SurfaceRenderer", "ray_cast", "render_face", "skin_iso_level"]
