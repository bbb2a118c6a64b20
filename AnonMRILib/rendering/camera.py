"""Orthographic cameras in RAS world coordinates for face renderings.

A camera looks along the unit vector ``direction`` (RAS, from the viewer into the scene) with the
image's up axis along ``up``; the image's right axis is ``direction x up``. With that convention
the anterior view (viewer at +A looking towards -A, superior up) shows the patient's right on
the image's left, as a photograph of the face does.

Named views (viewer position, image up):

==========  =====================  =========
view        viewer at              up
==========  =====================  =========
anterior    +A (in front)          +S
posterior   -A (behind)            +S
left        -R (patient's left)    +S
right       +R (patient's right)   +S
superior    +S (above)             +A
inferior    -S (below)             +A
==========  =====================  =========

``azimuth_deg`` then turns the viewer about the world S axis (right-hand rule: +90 deg moves the
anterior viewer to the patient's left), after ``elevation_deg`` has raised it towards the view's
up axis (+30 deg looks at the face from above the eyes).
"""
from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np

from ..errors import InputError

#: view name -> (viewing direction, up), both RAS unit vectors
VIEWS: Dict[str, Tuple[Tuple[float, float, float], Tuple[float, float, float]]] = {
    "anterior": ((0.0, -1.0, 0.0), (0.0, 0.0, 1.0)),
    "posterior": ((0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
    "left": ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
    "right": ((-1.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
    "superior": ((0.0, 0.0, -1.0), (0.0, 1.0, 0.0)),
    "inferior": ((0.0, 0.0, 1.0), (0.0, 1.0, 0.0)),
}

VIEW_NAMES = tuple(VIEWS)


@dataclass(frozen=True)
class Camera:
    """An orthographic camera: ``direction`` (into the scene), ``up`` and ``right``, RAS unit vectors."""

    direction: np.ndarray
    up: np.ndarray

    @property
    def right(self) -> np.ndarray:
        return np.cross(self.direction, self.up)


def _rotation_about(axis: np.ndarray, angle_rad: float) -> np.ndarray:
    """Rodrigues' rotation matrix about the unit ``axis`` by ``angle_rad`` (right-hand rule)."""
    axis = np.asarray(axis, dtype=np.float64)
    axis = axis / np.linalg.norm(axis)
    x, y, z = axis
    skew = np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])
    return np.eye(3) + np.sin(angle_rad) * skew + (1.0 - np.cos(angle_rad)) * (skew @ skew)


def make_camera(view: str = "anterior", azimuth_deg: float = 0.0, elevation_deg: float = 0.0) -> Camera:
    """The camera of a named ``view`` turned by ``elevation_deg`` then ``azimuth_deg`` (see module doc)."""
    if view not in VIEWS:
        raise InputError(f"unknown view {view!r}; choose one of {', '.join(VIEW_NAMES)}")
    if not (np.isfinite(azimuth_deg) and np.isfinite(elevation_deg)):
        raise InputError("azimuth and elevation must be finite numbers of degrees")
    direction, up = (np.array(v, dtype=np.float64) for v in VIEWS[view])
    viewer = -direction
    elevation = np.deg2rad(float(elevation_deg))
    viewer, up = (np.cos(elevation) * viewer + np.sin(elevation) * up,
                  np.cos(elevation) * up - np.sin(elevation) * viewer)
    turn = _rotation_about(np.array([0.0, 0.0, 1.0]), np.deg2rad(float(azimuth_deg)))
    viewer, up = turn @ viewer, turn @ up
    return Camera(direction=-viewer / np.linalg.norm(viewer), up=up / np.linalg.norm(up))
