"""Convex hull c(x) of a head from its surface representation Z (CP-GAN sec. 3.1, "Convex Hull").

1. Points: voxel indices sampled from Bernoulli(Z) (Z from :mod:`.surface`).
2. Facets: ``scipy.spatial.ConvexHull`` (Qhull, Quickhull). The paper uses Chan's algorithm; both
   return *the* convex hull of the points (it is unique), Qhull is the well-kept implementation.
3. A random subset of the hull's triangles (100 by default, as in the paper; ``None`` = all).
4. c = 1 everywhere, then every voxel on the outward side of a chosen triangle's plane is set to
   0: c is the intersection of the chosen half-spaces, a convex polytope that contains the
   sampled points' hull (fewer facets -> a looser, smoother hull that hides more of the face).

Choices: a voxel is inside when its centre is at most ``margin_voxels`` (default 0.5) outside
every chosen plane, so surface voxels whose centres lie on the hull count as inside. Half-spaces
are kept as a :class:`HalfSpaces` object and voxelised on any grid (the model grid, or the
input's own grid, exactly) with a per-column interval test: along each column of voxels a convex
set is one interval, whose ends follow from the facets in O(columns x facets), so the volume is
filled without testing every voxel against every plane.

Same seed (``torch.Generator`` state) -> same points, same facets, same c.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..errors import InputError
from .head_mask import ThresholdMethod
from .surface import DEFAULT_ROTATIONS, surface_representation

#: default number of hull triangles whose half-spaces carve c (the paper's "100 suffice")
DEFAULT_FACETS = 100


@dataclass(frozen=True)
class ConvexHullConfig:
    """How c(x) is made.

    rotations: K, rotations for Z. facets: number of hull triangles used (None = all).
    margin_voxels: tolerance of the half-space test, in voxels of the grid the hull is computed
    on. threshold: head binarisation rule (see :mod:`.head_mask`) where the caller binarises.
    """

    rotations: int = DEFAULT_ROTATIONS
    facets: Optional[int] = DEFAULT_FACETS
    margin_voxels: float = 0.5
    threshold: ThresholdMethod = "otsu"

    def __post_init__(self) -> None:
        if self.rotations < 1:
            raise InputError("the number of rotations must be >= 1")
        if self.facets is not None and self.facets < 4:
            raise InputError("at least 4 hull facets are needed to bound a volume")
        if self.margin_voxels < 0:
            raise InputError("the hull margin must be >= 0 voxels")


@dataclass(frozen=True, eq=False)
class HalfSpaces:
    """Intersection of half-spaces ``normals @ x + offsets <= 0`` in some frame's coordinates.

    ``normals`` (F, 3), ``offsets`` (F,), float64. The frame is the voxel index frame (i, j, k) of
    the grid the hull was computed on, unless re-expressed with :meth:`in_frame`.
    """

    normals: np.ndarray
    offsets: np.ndarray

    @property
    def count(self) -> int:
        return int(self.normals.shape[0])

    def contains(self, points: np.ndarray) -> np.ndarray:
        """Bool (N,): which (N, 3) points satisfy every inequality."""
        values = np.asarray(points, np.float64) @ self.normals.T + self.offsets
        return np.all(values <= 1e-9, axis=1)

    def in_frame(self, transform: np.ndarray) -> "HalfSpaces":
        """The same set in another frame, where ``x_this = transform @ [y, 1]`` (4x4) maps it."""
        transform = np.asarray(transform, np.float64)
        normals = self.normals @ transform[:3, :3]
        offsets = self.normals @ transform[:3, 3] + self.offsets
        return HalfSpaces(normals, offsets)

    def voxelize(self, shape) -> np.ndarray:
        """Bool array of ``shape``: voxels (i, j, k) whose centres lie in the intersection."""
        shape = tuple(int(n) for n in shape)
        i = np.arange(shape[0], dtype=np.float64)[:, None, None]
        j = np.arange(shape[1], dtype=np.float64)[None, :, None]
        a, b, c, d = self.normals[:, 0], self.normals[:, 1], self.normals[:, 2], self.offsets
        # per column (i, j): a i + b j + c k + d <= 0 bounds k from above (c > 0) or below (c < 0)
        eps = 1e-12
        lower = np.full(shape[:2], -np.inf)
        upper = np.full(shape[:2], np.inf)
        for select, bound, reduce in ((c > eps, upper, np.minimum), (c < -eps, lower, np.maximum)):
            if select.any():
                f = np.flatnonzero(select)
                limit = -(a[f] * i + b[f] * j + d[f]) / c[f]  # (I, J, F_selected)
                reduce(bound, limit.min(axis=2) if reduce is np.minimum else limit.max(axis=2), out=bound)
        flat = np.flatnonzero(np.abs(c) <= eps)
        if flat.size:
            blocked = np.any(a[flat] * i + b[flat] * j + d[flat] > 1e-9, axis=2)
            upper[blocked] = -np.inf
        k_low = np.ceil(np.clip(lower, -1, shape[2]) - 1e-9)
        k_high = np.floor(np.clip(upper, -1, shape[2]) + 1e-9)
        k = np.arange(shape[2], dtype=np.float64)
        return (k >= k_low[:, :, None]) & (k <= k_high[:, :, None])


@dataclass(frozen=True, eq=False)
class ConvexHull:
    """c(x) and how it was made: ``mask`` (bool, the head grid's shape), ``half_spaces`` (voxel
    frame of that grid, margin included), ``points`` (sampled (N, 3) voxel indices),
    ``surface`` (Z, float32 numpy)."""

    mask: np.ndarray
    half_spaces: HalfSpaces
    points: np.ndarray
    surface: np.ndarray


def sample_surface_points(surface, generator=None) -> np.ndarray:
    """Voxel indices (N, 3) int64 drawn from Bernoulli(Z), one independent draw per voxel.

    Uniform numbers come from ``generator`` (CPU) so results do not depend on Z's device.
    """
    import torch

    probability = torch.as_tensor(surface).detach().to("cpu", torch.float32)
    uniform = torch.rand(probability.shape, generator=generator)
    return torch.nonzero(uniform < probability).numpy().astype(np.int64)


def hull_half_spaces(points: np.ndarray, facets: Optional[int] = DEFAULT_FACETS, generator=None,
                     margin: float = 0.5) -> HalfSpaces:
    """Half-spaces of ``facets`` random triangles of the convex hull of ``points`` (N, 3).

    Each inequality reads ``n . x + d <= margin`` with n the unit outward normal (stored with the
    margin folded into the offset). Raises InputError when the points span no volume.
    """
    import torch
    from scipy.spatial import ConvexHull as QhullHull, QhullError

    points = np.asarray(points, np.float64)
    if points.shape[0] < 4:
        raise InputError("too few surface points to build a convex hull (is there a head in the image?)")
    try:
        hull = QhullHull(points)
    except QhullError:
        raise InputError("the head's surface points are flat or degenerate; cannot build a convex hull") from None
    equations = hull.equations  # (F, 4): unit outward normal, offset; inside <=> n.x + d <= 0
    if facets is not None and facets < equations.shape[0]:
        chosen = torch.randperm(equations.shape[0], generator=generator)[:facets].numpy()
        equations = equations[np.sort(chosen)]
    return HalfSpaces(equations[:, :3].copy(), equations[:, 3] - float(margin))


def convex_hull(head, config: Optional[ConvexHullConfig] = None, generator=None, device=None) -> ConvexHull:
    """c(x) of a binary head volume (numpy or torch, nonzero = head, isotropic voxels).

    Z (:func:`.surface.surface_representation`, on ``device``), Bernoulli points, Qhull, random
    facets, voxelised. ``generator``: CPU ``torch.Generator`` (default: torch's global RNG).
    """
    config = config or ConvexHullConfig()
    surface = surface_representation(head, config.rotations, generator=generator, device=device)
    points = sample_surface_points(surface, generator)
    half_spaces = hull_half_spaces(points, config.facets, generator, config.margin_voxels)
    mask = half_spaces.voxelize(tuple(surface.shape))
    return ConvexHull(mask=mask, half_spaces=half_spaces, points=points, surface=surface.cpu().numpy())
