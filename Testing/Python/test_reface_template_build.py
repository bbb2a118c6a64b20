"""The REFACE template builder's mesh steps (Training/reface_face_mesh.py) on meshes with known solids."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "Training"))

from reface_face_mesh import carry_tissue_onto_surface, rasterize_solid  # noqa: E402


def box_triangles(low, high, open_bottom=False):
    """(F, 3, 3) triangles of an axis-aligned box's surface (mm); without its bottom face if asked."""
    corners = np.array([[x, y, z] for x in (low[0], high[0]) for y in (low[1], high[1]) for z in (low[2], high[2])])
    quads = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (1, 5, 7, 3), (0, 2, 6, 4)]
    if open_bottom:
        quads = [q for q in quads if not all(corners[i][2] == low[2] for i in q)]
    triangles = [[corners[a], corners[b], corners[c]] for a, b, c, d in quads] + \
                [[corners[a], corners[c], corners[d]] for a, b, c, d in quads]
    return np.asarray(triangles, dtype=np.float64)


@pytest.mark.parametrize("open_bottom", [False, True])
def test_rasterized_box_has_the_boxs_volume(open_bottom):
    low, high = np.array([4.0, 5.0, 6.0]), np.array([24.0, 19.0, 30.0])
    solid = rasterize_solid(box_triangles(low, high, open_bottom), np.zeros(3), (64, 48, 72), 0.5)
    volume_mm3 = solid.sum() * 0.5 ** 3
    # the surface is exact to within one fine voxel (0.5 mm) on every side
    assert np.prod(high - low - 1.0) < volume_mm3 < np.prod(high - low + 1.0)
    # filled inside, nothing outside the box
    assert solid[28, 24, 36] and not solid[:, :, :10].any() and not solid[52:].any()


def test_tissue_carried_onto_a_larger_surface_keeps_its_layers():
    """A sphere of 'tissue' (bright shell, darker core, a 'brain' inside) carried onto a larger
    sphere: the skin lies on the new surface, the shell stays bright, the brain stays inside."""
    grid = np.indices((48, 48, 48)).astype(np.float32) - 23.5
    radius = np.sqrt((grid ** 2).sum(axis=0)) * 2.0  # 2 mm voxels
    head = np.where(radius < 30.0, 60.0, 0.0) + np.where((radius >= 24.0) & (radius < 30.0), 60.0, 0.0)
    brain = radius < 16.0
    head[brain] = 100.0
    occupancy = np.clip(34.0 - radius + 0.5, 0.0, 1.0)  # the target surface at 34 mm
    carried, carried_brain = carry_tissue_onto_surface(head.astype(np.float32), brain, occupancy, 2.0)
    assert carried_brain.sum() > 0.8 * brain.sum() and not carried_brain[radius > 24.0].any()
    skin = carried >= 30.0
    assert skin[(radius > 28.0) & (radius < 32.0)].mean() > 0.95  # inside the new surface
    assert not skin[radius > 36.0].any()  # nothing beyond it
    assert carried[(radius > 30.0) & (radius < 32.0)].mean() > 90.0  # the bright shell moved outwards
