"""Face renderings on a canonical frame, comparable across scans of any grid.

:func:`AnonMRILib.rendering.render_face` frames a rendering by the volume's grid, so two scans
on different grids give images of different scale and position. Re-identification studies and
per-scan scores compare renderings of different heads, so they first resample each scan onto a
**canonical grid**: RAS-aligned, isotropic, a cube of ``field_of_view_mm`` (default 256 mm)
sampled by ``grid_size`` voxels (default 128, i.e. 2 mm), centred on a centre point in RAS mm.
The same physical head size then gives the same size in pixels (head size stays visible, as
it is to a real attacker).

The centre is the centre of the bounding box of the ORIGINAL scan's head mask
(:func:`head_centre`, :mod:`AnonMRILib.transforms.head_mask`); an anonymized version of a scan is
rendered about its original's centre, so a method that cuts the face off does not also move
the frame. The rendering itself is ``render_face`` of the canonical volume with the volume's own
automatic skin iso-level (what anyone rendering the released scan would see). A scan with no
surface to render (e.g. every voxel 0 after BLACK) renders as an all-zero image.
"""
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..errors import InputError
from ..io.volume import Volume


@dataclass(frozen=True)
class FaceRenderingConfig:
    """Canonical frame and rendering size (see module doc)."""

    field_of_view_mm: float = 256.0
    grid_size: int = 128
    image_size: int = 128
    view: str = "anterior"
    device: str = "cpu"


def head_centre(volume: Volume) -> np.ndarray:
    """RAS mm of the centre of the bounding box of ``volume``'s head mask."""
    from ..transforms.head_mask import head_mask_array

    mask = head_mask_array(volume.array)
    indices = np.argwhere(mask)
    low, high = indices.min(axis=0), indices.max(axis=0)
    corners = np.array([[a, b, c] for a in (low[0], high[0]) for b in (low[1], high[1])
                        for c in (low[2], high[2])], dtype=np.float64)
    world = volume.world_coordinates(corners)
    return 0.5 * (world.min(axis=0) + world.max(axis=0))


def canonical_volume(volume: Volume, centre_ras: Sequence[float],
                     config: Optional[FaceRenderingConfig] = None) -> Volume:
    """``volume`` resampled (linear, Gaussian anti-aliasing when coarser) onto the canonical grid."""
    from scipy import ndimage

    config = config or FaceRenderingConfig()
    centre = np.asarray(centre_ras, dtype=np.float64)
    if centre.shape != (3,) or not np.all(np.isfinite(centre)):
        raise InputError("the rendering centre must be three finite RAS coordinates in mm")
    size = int(config.grid_size)
    spacing = float(config.field_of_view_mm) / size
    target_affine = np.eye(4)
    target_affine[:3, :3] *= spacing
    target_affine[:3, 3] = centre - 0.5 * config.field_of_view_mm + 0.5 * spacing
    data = np.asarray(volume.array, dtype=np.float32)
    ratio = spacing / volume.spacing
    if np.any(ratio > 1.0):
        # FWHM that makes up the resolution difference, per axis, in input voxels
        sigma = np.sqrt(np.clip(ratio ** 2 - 1.0, 0.0, None)) / (2.0 * np.sqrt(2.0 * np.log(2.0)))
        data = ndimage.gaussian_filter(data, sigma=sigma, mode="nearest")
    target_to_source = np.linalg.inv(volume.affine) @ target_affine
    background = float(np.min(volume.array))
    resampled = ndimage.affine_transform(data, target_to_source[:3, :3], offset=target_to_source[:3, 3],
                                         output_shape=(size, size, size), order=1, cval=background)
    return Volume(resampled.astype(np.float32), target_affine)


def render_canonical_face(volume: Volume, centre_ras: Sequence[float],
                          config: Optional[FaceRenderingConfig] = None) -> np.ndarray:
    """(image_size, image_size) float32 rendering in [0, 1] of ``volume`` in the canonical frame."""
    from ..rendering import render_face

    config = config or FaceRenderingConfig()
    canonical = canonical_volume(volume, centre_ras, config)
    data = canonical.array
    if float(data.max()) <= float(data.min()):
        return np.zeros((config.image_size, config.image_size), dtype=np.float32)
    try:
        return render_face(canonical, view=config.view, size=config.image_size, device=config.device)
    except InputError:
        # nothing above the skin level (e.g. a removed head): nothing to see
        return np.zeros((config.image_size, config.image_size), dtype=np.float32)


def blur_rendering(image: np.ndarray, sigma_px: float) -> np.ndarray:
    """BLURRED control of the paper: a 2-D Gaussian blur (``sigma_px`` pixels) of a rendering."""
    from scipy import ndimage

    return ndimage.gaussian_filter(np.asarray(image, dtype=np.float32), sigma=float(sigma_px),
                                   mode="constant").astype(np.float32)


#: views of the open face recognizer: (azimuth, elevation) in degrees about the anterior view
RECOGNIZER_VIEWS = ((0.0, 0.0), (25.0, 0.0), (-25.0, 0.0), (0.0, 10.0))


def render_canonical_views(volume: Volume, centre_ras: Sequence[float],
                           config: Optional[FaceRenderingConfig] = None,
                           views: Sequence[Sequence[float]] = RECOGNIZER_VIEWS) -> np.ndarray:
    """(V, image_size, image_size) float32 renderings in [0, 1] of ``volume`` in the canonical frame,
    one per ``(azimuth_deg, elevation_deg)`` of ``views`` (turned from ``config.view``; see
    :func:`AnonMRILib.rendering.camera.make_camera`). The volume is resampled and prepared once.
    All-zero images where there is no surface to render (see :func:`render_canonical_face`)."""
    from ..rendering.camera import make_camera
    from ..rendering.raycast import SurfaceRenderer

    config = config or FaceRenderingConfig()
    empty = np.zeros((len(views), config.image_size, config.image_size), dtype=np.float32)
    canonical = canonical_volume(volume, centre_ras, config)
    if float(canonical.array.max()) <= float(canonical.array.min()):
        return empty
    try:
        renderer = SurfaceRenderer(canonical, device=config.device)
        images = [renderer.render(make_camera(config.view, float(azimuth), float(elevation)),
                                  size=config.image_size).image for azimuth, elevation in views]
    except InputError:
        # nothing above the skin level (e.g. a removed head): nothing to see
        return empty
    return np.stack(images).astype(np.float32)
