"""Ray-cast renderings of the skin surface of a head volume (torch; CPU or CUDA).

What a volume renderer's "skin" preset shows, computed the direct way:

1. **Rays.** Orthographic rays, one per pixel, in RAS world coordinates (the Volume's affine maps
   voxel indices to RAS mm), so any voxel orientation (RAS, LAS, LIA, oblique) renders upright.
   The image plane is framed by the volume's *grid*, not by its content: the square that encloses
   the projection of the grid's bounding box, centred on the grid's centre. The same grid
   therefore gives the same framing before and after de-identification, which makes before/after
   pairs and re-identification studies comparable pixel for pixel.
2. **First hit.** All rays at once, in chunks, only over the stretch where they cross the grid's
   box (slab test). Empty space is skipped with a block-occupancy grid (blocks of
   ``block_voxels``; a block is occupied when a voxel within one voxel of it reaches the
   iso-level; dilated by one block so coarse samples one block apart never jump over one). From
   the first occupied coarse sample, a window of fine samples (step ``step_mm``, default half the
   smallest voxel size) is taken with trilinear interpolation (``grid_sample``); the first sample at
   or above the iso-level is found with ``argmax`` and the crossing refined linearly between it and
   the sample before. Fine samples lie on each ray's lattice ``t_enter + n * step_mm`` and rays
   without a hit in the window resume the coarse march after it, so the result equals a plain
   fine march (skipped stretches provably hold no value at the iso-level) whatever the block size
   or the voxel order.
3. **Iso-level** (when not given): the project's head threshold,
   :func:`AnonMRILib.transforms.head_mask.head_threshold` with the ``"otsu"`` rule: Otsu's
   air/tissue threshold moved halfway towards the background level (the image's median). The
   skin/air boundary lies in the partial-volume band below Otsu's level; halfway to the background
   lands in it, rejects air noise, and is equivariant to ``a * x + b`` (same surface for any
   intensity scale or offset). The same rule binarises the head for the privacy transform, so the
   renderings show the surface CP-GAN's convex hull is built from.
4. **Shading.** Outward normal = minus the intensity gradient (central differences, one voxel
   apart, mapped to world coordinates through the affine's inverse transpose); Blinn-Phong with a
   light just above and to the viewer's left: ``ambient + diffuse * max(n.l, 0) + specular *
   max(n.h, 0) ** shininess``, clipped to [0, 1]; background 0.
"""
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import numpy as np

from ..errors import InputError
from ..io.volume import Volume
from .camera import Camera, make_camera


@dataclass(frozen=True)
class RenderSettings:
    """Sampling and shading parameters of :func:`ray_cast` (defaults suit 0.5-2 mm heads)."""

    #: distance between samples along a ray in mm; None = half the smallest voxel size
    step_mm: Optional[float] = None
    #: coarse samples evaluated per chunk (memory ~ size**2 * chunk_samples * 16 bytes)
    chunk_samples: int = 16
    #: edge in voxels of the occupancy blocks used to skip empty space
    block_voxels: int = 4
    ambient: float = 0.12
    diffuse: float = 0.78
    specular: float = 0.18
    shininess: float = 24.0
    #: light direction relative to the viewer: (towards the viewer, towards up, towards right)
    light: Tuple[float, float, float] = (1.0, 0.45, -0.3)


@dataclass(frozen=True)
class RayCastResult:
    """A rendering and what it was made from; arrays are (size, size), row 0 = top of the image."""

    image: np.ndarray       #: float32 shaded surface in [0, 1], 0 where a ray hit nothing
    depth_mm: np.ndarray    #: float32 distance from the image plane to the surface in mm, NaN = no hit
    hit: np.ndarray         #: bool, True where the ray met the surface
    surface_mm: np.ndarray  #: float32 (size, size, 3) RAS mm of the surface point, NaN = no hit
    iso_level: float        #: the intensity threshold used, in the image's units
    pixel_mm: float         #: pixel size of the image in mm
    camera: Camera


def skin_iso_level(volume: Volume) -> float:
    """Automatic skin iso-level: ``head_threshold(volume.array, "otsu")`` (see the module docstring)."""
    from ..transforms.head_mask import head_threshold

    return float(head_threshold(volume.array, "otsu"))


def _resolve_device(device) -> "object":
    import torch

    if isinstance(device, torch.device):
        return device
    from ..device import resolve_device

    return resolve_device(str(device))


class SurfaceRenderer:
    """Renders one volume from many cameras; the volume is prepared once (tensor, iso, occupancy).

    Use it for many views of the same head (re-identification studies); :func:`render_face` is the
    one-shot form. ``device``: "cpu", "cuda", "auto" or a ``torch.device``.
    """

    def __init__(self, volume: Volume, iso_level: Optional[float] = None, device: Union[str, "object"] = "cpu",
                 settings: Optional[RenderSettings] = None) -> None:
        import torch
        import torch.nn.functional as F

        self.volume = volume
        self.settings = settings or RenderSettings()
        if iso_level is None:
            iso_level = skin_iso_level(volume)
        self.iso_level = float(iso_level)
        if not np.isfinite(self.iso_level):
            raise InputError("the iso-level must be a finite number")
        self.device = _resolve_device(device)
        self.block = max(1, int(self.settings.block_voxels))
        data = torch.as_tensor(np.ascontiguousarray(volume.array, dtype=np.float32), device=self.device)
        # samples outside the grid read the image's minimum (zero padding of the shifted field), so
        # a head cut by the grid gets a closed cap and a*x+b renders like x
        self._offset = float(data.min())
        data = data - self._offset
        self._field_iso = self.iso_level - self._offset
        self._field = data[None, None]                                    # (1, 1, I, J, K)
        # Occupancy of blocks of `block` voxels: a block is occupied when a voxel within one voxel of
        # it reaches the iso-level (so every trilinear sample >= iso inside it is seen), dilated by
        # one block so that coarse samples one block apart never step over an occupied block.
        above = (data >= self._field_iso).to(torch.float32)[None, None]
        occupied = F.max_pool3d(above, kernel_size=self.block + 2, stride=self.block, padding=1,
                                ceil_mode=True)
        occupied = F.max_pool3d(occupied, kernel_size=3, stride=1, padding=1)
        self._occupied = occupied[0, 0] > 0
        self._occupied_shape = torch.as_tensor(self._occupied.shape, device=self.device)

    # -- sampling ---------------------------------------------------------------------------------
    def _sample(self, points_xyz: "torch.Tensor") -> "torch.Tensor":
        """Trilinear values (minus the image minimum) at (..., 3) grid_sample-normalised (x=k, y=j,
        z=i) points; 0 (= the image minimum) outside the grid."""
        import torch.nn.functional as F

        grid = points_xyz.reshape(1, 1, 1, -1, 3)
        values = F.grid_sample(self._field, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
        return values.reshape(points_xyz.shape[:-1])

    def _is_occupied(self, points_index: "torch.Tensor") -> "torch.Tensor":
        """Dilated block occupancy at (..., 3) voxel-index points (clamped to the grid's blocks)."""
        import torch

        blocks = torch.floor(points_index / self.block).long()
        blocks = torch.minimum(blocks.clamp(min=0), self._occupied_shape - 1)
        return self._occupied[blocks[..., 0], blocks[..., 1], blocks[..., 2]]

    # -- rendering --------------------------------------------------------------------------------
    def render(self, camera: Camera, size: int = 256) -> RayCastResult:
        """Ray-cast ``camera``'s view as a (size, size) image (see the module docstring)."""
        import torch

        if isinstance(size, bool) or int(size) != size or size < 8 or size > 4096:
            raise InputError(f"rendering size must be an integer between 8 and 4096 pixels, got {size}")
        size = int(size)
        volume, settings, device = self.volume, self.settings, self.device
        dtype = torch.float32
        shape = np.array(volume.shape, dtype=np.float64)
        world_to_index = np.linalg.inv(volume.affine)
        fine_step = float(settings.step_mm) if settings.step_mm else 0.5 * float(volume.spacing.min())

        # framing: the square enclosing the grid box's projection, centred on the grid
        corners_index = np.array([[a, b, c] for a in (0, shape[0] - 1) for b in (0, shape[1] - 1)
                                  for c in (0, shape[2] - 1)])
        corners = volume.world_coordinates(corners_index)
        centre = corners.mean(axis=0)
        right, up, direction = camera.right, camera.up, camera.direction
        rel = corners - centre
        half = float(max(np.abs(rel @ right).max(), np.abs(rel @ up).max())) + 0.5 * float(volume.spacing.max())
        pixel_mm = 2.0 * half / size
        offsets = -half + (np.arange(size) + 0.5) * pixel_mm
        u = offsets[None, :]                                  # along right: columns
        v = -offsets[:, None]                                 # along up: rows, row 0 on top
        plane = centre + float((rel @ direction).min()) * direction
        origins = (plane + u[..., None] * right + v[..., None] * up).reshape(-1, 3)

        # rays in voxel indices: p(t) = a + t b, t in mm from the image plane; slab test on the box
        a = origins @ world_to_index[:3, :3].T + world_to_index[:3, 3]
        b = world_to_index[:3, :3] @ direction
        low_face, high_face = np.full(3, -0.5), shape - 0.5
        with np.errstate(divide="ignore", invalid="ignore"):
            t0, t1 = (low_face - a) / b, (high_face - a) / b
        inside_slab = (a >= low_face) & (a <= high_face)
        t_low = np.where(b == 0, np.where(inside_slab, -np.inf, np.inf), np.minimum(t0, t1))
        t_high = np.where(b == 0, np.where(inside_slab, np.inf, -np.inf), np.maximum(t0, t1))
        t_enter = np.maximum(t_low.max(axis=1), 0.0)
        t_exit = t_high.min(axis=1)
        # coarse steps move at most one block along every voxel axis
        coarse_step = self.block / float(np.abs(b).max())

        to_xyz = np.ascontiguousarray(np.diag(2.0 / np.maximum(shape - 1.0, 1.0))[::-1])          # index -> normalised x, y, z
        a_index = torch.as_tensor(a, dtype=dtype, device=device)
        b_index = torch.as_tensor(b, dtype=dtype, device=device)
        a_xyz = torch.as_tensor(a @ to_xyz.T - 1.0, dtype=dtype, device=device)
        b_xyz = torch.as_tensor(to_xyz @ b, dtype=dtype, device=device)
        exit_ = torch.as_tensor(t_exit, dtype=dtype, device=device)
        enter = torch.as_tensor(t_enter, dtype=dtype, device=device)
        t_current = enter.clone()
        t_hit = torch.full((size * size,), float("nan"), dtype=dtype, device=device)
        active = torch.nonzero(exit_ >= t_current).flatten()

        coarse_chunk = max(1, int(settings.chunk_samples))
        coarse_offsets = torch.arange(coarse_chunk, dtype=dtype, device=device) * coarse_step
        window = int(np.ceil(2.0 * coarse_step / fine_step)) + 2
        fine_offsets = torch.arange(-1, window, dtype=dtype, device=device) * fine_step

        while active.numel() > 0:
            # 1. coarse: advance each ray to its first sample in an occupied (dilated) block
            found = torch.full((active.numel(),), float("nan"), dtype=dtype, device=device)
            pending = torch.arange(active.numel(), device=device)
            while pending.numel() > 0:
                rays = active[pending]
                t = t_current[rays, None] + coarse_offsets[None, :]
                valid = t <= exit_[rays, None]
                occupied = self._is_occupied(a_index[rays, None, :] + t[..., None] * b_index) & valid
                any_occupied = occupied.any(dim=1)
                first = occupied.to(torch.uint8).argmax(dim=1)
                found[pending[any_occupied]] = t[any_occupied, first[any_occupied]]
                keep = (~any_occupied) & valid[:, -1]
                t_current[rays[keep]] = t[keep, -1] + coarse_step
                pending = pending[keep]
            has_block = torch.isfinite(found)
            active, t_start = active[has_block], found[has_block]
            if active.numel() == 0:
                break
            # 2. fine: a window of trilinear samples from one step before the occupied sample, on
            #    the ray's lattice enter + n * fine_step (so the samples, hence the result, do not
            #    depend on the block grid, i.e. on the voxel order)
            lattice = torch.floor((t_start - enter[active]) / fine_step)
            t = enter[active, None] + (lattice[:, None] + fine_offsets[None, :] / fine_step) * fine_step
            t = torch.maximum(t, enter[active, None])
            valid = t <= exit_[active, None]
            values = self._sample(a_xyz[active, None, :] + t[..., None] * b_xyz)
            above = (values >= self._field_iso) & valid
            hit = above.any(dim=1)
            first = above.to(torch.uint8).argmax(dim=1)
            if bool(hit.any()):
                k = first[hit]
                v_k = values[hit, k]
                v_before = values[hit, (k - 1).clamp(min=0)]
                fraction = torch.where((k > 0) & (v_k > v_before),
                                       (v_k - self._field_iso) / (v_k - v_before).clamp(min=1e-12),
                                       torch.zeros_like(v_k)).clamp(0.0, 1.0)
                t_hit[active[hit]] = t[hit, k] - fraction * fine_step
            # rays without a hit continue the coarse march after the window
            missed = (~hit) & valid[:, -1]
            t_current[active[missed]] = t[missed, -1]
            active = active[missed]

        image = self._shade(camera, a_index, a_xyz, b_xyz, t_hit, world_to_index)
        hit = torch.isfinite(t_hit)
        depth = t_hit.cpu().numpy().astype(np.float64)
        surface = (origins + depth[:, None] * direction).reshape(size, size, 3).astype(np.float32)
        return RayCastResult(image=image.cpu().numpy().reshape(size, size).astype(np.float32),
                             depth_mm=depth.reshape(size, size).astype(np.float32),
                             hit=hit.cpu().numpy().reshape(size, size),
                             surface_mm=surface,
                             iso_level=self.iso_level, pixel_mm=float(pixel_mm), camera=camera)

    def _shade(self, camera: Camera, a_index, a_xyz, b_xyz, t_hit, world_to_index: np.ndarray):
        """Blinn-Phong shading at the hit points; the normal is minus the world intensity gradient."""
        import torch

        settings, device, dtype = self.settings, self.device, torch.float32
        image = torch.zeros(t_hit.shape[0], dtype=dtype, device=device)
        hit_index = torch.nonzero(torch.isfinite(t_hit)).flatten()
        if hit_index.numel() == 0:
            return image
        shape = np.array(self.volume.shape, dtype=np.float64)
        to_xyz = np.ascontiguousarray(np.diag(2.0 / np.maximum(shape - 1.0, 1.0))[::-1])
        points = a_xyz[hit_index] + t_hit[hit_index, None] * b_xyz
        # one voxel along each index axis i, j, k, in normalised x, y, z coordinates
        steps = torch.as_tensor(to_xyz.T, dtype=dtype, device=device)           # row n = unit index axis n
        stencil = torch.cat([points[:, None, :] + steps[None], points[:, None, :] - steps[None]], dim=1)
        values = self._sample(stencil)
        gradient_index = 0.5 * (values[:, :3] - values[:, 3:])
        # d f / d world = (d index / d world)^T d f / d index
        to_world = torch.as_tensor(world_to_index[:3, :3].T, dtype=dtype, device=device)
        gradient = gradient_index @ to_world.T
        length = gradient.norm(dim=1, keepdim=True)
        view_world = -camera.direction
        view_vector = torch.as_tensor(view_world, dtype=dtype, device=device)
        normal = torch.where(length > 1e-12, -gradient / length.clamp(min=1e-12), view_vector[None])
        light = (settings.light[0] * view_world + settings.light[1] * camera.up + settings.light[2] * camera.right)
        light_vector = torch.as_tensor(light / np.linalg.norm(light), dtype=dtype, device=device)
        halfway = light_vector + view_vector
        halfway = halfway / halfway.norm()
        diffuse = (normal @ light_vector).clamp(min=0.0)
        specular = (normal @ halfway).clamp(min=0.0) ** settings.shininess
        shade = settings.ambient + settings.diffuse * diffuse + settings.specular * specular
        image[hit_index] = shade.clamp(0.0, 1.0)
        return image


def ray_cast(volume: Volume, camera: Camera, size: int = 256, iso_level: Optional[float] = None,
             device: Union[str, "object"] = "cpu", settings: Optional[RenderSettings] = None) -> RayCastResult:
    """Render the first iso-surface hit of ``volume`` seen by the orthographic ``camera``."""
    return SurfaceRenderer(volume, iso_level=iso_level, device=device, settings=settings).render(camera, size)


def render_face(volume: Volume, view: str = "anterior", size: int = 256, azimuth_deg: float = 0.0,
                elevation_deg: float = 0.0, iso_level: Optional[float] = None,
                device: Union[str, "object"] = "cpu", settings: Optional[RenderSettings] = None) -> np.ndarray:
    """A shaded skin-surface rendering of ``volume`` as an (size, size) float32 image in [0, 1].

    ``view`` is one of anterior, posterior, left, right, superior, inferior (see
    :mod:`AnonMRILib.rendering.camera`), turned by ``elevation_deg`` and ``azimuth_deg``;
    ``iso_level`` defaults to :func:`skin_iso_level`. Orthographic, framed by the volume's grid,
    row 0 at the top of the image. ``device``: "cpu", "cuda", "auto" or a ``torch.device``.
    """
    camera = make_camera(view, azimuth_deg, elevation_deg)
    return ray_cast(volume, camera, size=size, iso_level=iso_level, device=device, settings=settings).image
