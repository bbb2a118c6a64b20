"""QUICKSHEAR (Schimke, Kuehler & Hale 2011): shear the face off along one plane below the brain.

Algorithm (reimplemented from the paper's description, in world coordinates):

1. Project the brain mask onto the sagittal plane: the (P, S) world coordinates in mm of every
   brain voxel, P = -A (posterior), S = superior.
2. Convex hull of those points (``scipy.spatial.ConvexHull``, Qhull).
3. The shear line is the hull edge that leaves the most anterior hull vertex (lowest P within half
   a voxel, then lowest S) downwards-posteriorly, i.e. the first edge of the lower hull: it runs from the frontal pole
   along the underside of the frontal lobe. Every brain point lies on or above it (it supports
   the hull), so removing what is below it never touches the brain.
4. The line is lowered by ``buffer_mm`` (10 mm by default, the package's 10 voxels at 1 mm) and
   every voxel whose (P, S) lies below it is set to 0: the face, and the neck in front of/below
   the line. The cut is a plane perpendicular to the sagittal plane, valid in any voxel order.

Differences from the PyPI ``quickshear`` 1.2.0 package (checked against it on a real head by the
tests; see ``Testing/Python/test_baselines.py``):

* **Short vertical axes (the package's known fault).** The package evaluates the shear line
  only at the first ``n_S`` anterior-posterior positions (it uses the length of the S axis as the
  number of A-P columns), so on images whose S axis is shorter than their A-P axis (thick axial
  slices, axial slabs) every column posterior of ``n_S`` keeps what lies below the line; with
  an S axis longer than the A-P axis it indexes past the array (IndexError) whenever the line is
  still above the bottom at the last column. Here the line is evaluated at every voxel, whatever the shape.
* The buffer is in millimetres (the package counts voxels of the S axis), so anisotropic voxels
  give the same physical margin.
* A voxel is cut when its centre lies strictly below the line (the package truncates the line's
  height to an integer first): the two differ by at most one voxel per A-P column.
* Orientation comes from the affine in world coordinates (the package reorients the voxel axes to
  the nearest of RPS, which is only approximate for oblique images).
"""
from dataclasses import dataclass
from typing import Tuple

import numpy as np

from ...errors import InputError
from ...io.volume import Volume
from .geometry import A_AXIS, S_AXIS, world_coordinate


@dataclass(frozen=True)
class QuickshearConfig:
    """``buffer_mm``: how far below the brain's hull edge the shear plane lies, in mm."""

    buffer_mm: float = 10.0


@dataclass(frozen=True)
class ShearLine:
    """The shear line in the sagittal plane: ``S = s0 + slope * (P - p0) - buffer_mm`` (mm)."""

    p0: float
    s0: float
    slope: float
    buffer_mm: float

    def height(self, posterior_mm: np.ndarray) -> np.ndarray:
        """S (mm) of the lowered line at the given P = -A positions (mm)."""
        return self.s0 + self.slope * (posterior_mm - self.p0) - self.buffer_mm


def shear_line(brain: np.ndarray, volume: Volume, config: QuickshearConfig = QuickshearConfig()) -> ShearLine:
    """The QUICKSHEAR line of the boolean ``brain`` mask on ``volume``'s grid (steps 1-3 above)."""
    from scipy.spatial import ConvexHull, QhullError

    indices = np.argwhere(brain)
    if indices.shape[0] < 3:
        raise InputError("the brain mask has fewer than 3 voxels; QUICKSHEAR needs a brain outline")
    affine = volume.affine
    posterior = -(indices @ affine[A_AXIS, :3] + affine[A_AXIS, 3])
    superior = indices @ affine[S_AXIS, :3] + affine[S_AXIS, 3]
    points = np.unique(np.round(np.stack([posterior, superior], axis=1), 4), axis=0)
    try:
        hull = ConvexHull(points)
    except (QhullError, ValueError):
        raise InputError("the brain mask's sagittal outline is degenerate (a line or a point); "
                         "QUICKSHEAR needs a 3-D brain") from None
    vertices = points[hull.vertices]              # counter-clockwise in (P, S) for a 2-D hull
    # most anterior vertex, then lowest; "most anterior" within half a voxel, so that a front edge
    # that is vertical in voxel terms but slightly tilted in the world (oblique scans) starts at
    # its bottom, as it does on the voxel grid
    tolerance = 0.5 * float(volume.spacing.min())
    front = np.flatnonzero(vertices[:, 0] <= vertices[:, 0].min() + tolerance)
    first = int(front[np.argmin(vertices[front, 1])])
    following = vertices[(first + 1) % len(vertices)]
    p0, s0 = vertices[first]
    if following[0] <= p0:
        raise InputError("the brain mask's sagittal outline is degenerate; QUICKSHEAR cannot place its line")
    slope = float((following[1] - s0) / (following[0] - p0))
    return ShearLine(p0=float(p0), s0=float(s0), slope=slope, buffer_mm=float(config.buffer_mm))


def quickshear_face_mask(brain: np.ndarray, volume: Volume,
                         config: QuickshearConfig = QuickshearConfig()) -> Tuple[np.ndarray, ShearLine]:
    """Boolean array of the voxels QUICKSHEAR removes (below the lowered line), and the line."""
    line = shear_line(brain, volume, config)
    posterior = -world_coordinate(volume, A_AXIS, np.float64)
    superior = world_coordinate(volume, S_AXIS, np.float64)
    return superior < line.height(posterior), line
