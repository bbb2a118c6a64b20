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


def write_fake_mpfb2(root: Path, shift_mm: float) -> Path:
    """A MakeHuman-like folder: a 'body' column of quads from y = 0 to 900 mm (MakeHuman units:
    dm) and two targets, the neutral one empty and ``tall`` moving every vertex up by ``shift_mm``."""
    import gzip

    (root / "3dobjs").mkdir(parents=True)
    (root / "targets" / "macrodetails").mkdir(parents=True)
    heights = np.arange(0.0, 9.01, 0.5)
    lines, faces = [], []
    for k, y in enumerate(heights):
        lines += [f"v {x} {y} {z}" for x, z in ((0.0, 0.5), (0.5, 0.0), (0.0, -0.5), (-0.5, 0.0))]
        if k:
            a, b = 4 * (k - 1) + 1, 4 * k + 1
            faces += [f"f {a + i} {a + (i + 1) % 4} {b + (i + 1) % 4} {b + i}" for i in range(4)]
    (root / "3dobjs" / "base.obj").write_text("\n".join(lines + ["g body"] + faces) + "\n")
    count = 4 * len(heights)
    for name, offset in (("macrodetails/neutral.target.gz", 0.0), ("macrodetails/tall.target.gz", shift_mm / 100.0)):
        rows = [f"{i} 0 {offset} 0" for i in range(count)] if offset else []
        with gzip.open(root / "targets" / name, "wt") as handle:
            handle.write("\n".join(rows))
    return root


def test_the_neck_cut_follows_a_morphed_persons_height(tmp_path, monkeypatch):
    """A person 120 mm taller keeps the same triangles: the cut moves with the neutral neck vertex."""
    import reface_face_mesh

    mpfb2 = write_fake_mpfb2(tmp_path / "mpfb2", shift_mm=120.0)
    monkeypatch.setattr(reface_face_mesh, "NEUTRAL_TARGETS", {"macrodetails/neutral.target.gz": 1.0})
    neutral_vertices, neutral_triangles = reface_face_mesh.neutral_head_mesh(mpfb2)
    tall_vertices, tall_triangles = reface_face_mesh.neutral_head_mesh(mpfb2, {"macrodetails/tall.target.gz": 1.0})
    assert np.array_equal(neutral_triangles, tall_triangles)
    assert neutral_vertices[np.unique(neutral_triangles), 1].min() >= reface_face_mesh.NECK_CUT_MM
    np.testing.assert_allclose(tall_vertices - neutral_vertices, [[0.0, 120.0, 0.0]] * len(tall_vertices), atol=1e-9)


def test_synthetic_people_are_valid_macro_mixtures():
    from make_synthetic_heads import person_targets

    first, again, other = (person_targets(np.random.default_rng([0, k])) for k in (0, 0, 1))
    assert first == again and first != other
    for targets in (first, other):
        macros = {name: w for name, w in targets.items() if name.startswith("macrodetails/")}
        assert len(macros) == 12 and all(w >= 0 for w in macros.values())
        assert sum(macros.values()) == pytest.approx(1.0)
        assert all(0.0 <= w <= 0.7 for name, w in targets.items() if name.startswith("head/"))


def test_loop_subdivision_rounds_off_a_coarse_meshs_facets():
    """Training/reface_face_mesh.py refines MakeHuman's head by Loop subdivision before rasterising
    its skin: an octahedron (8 flat facets) becomes rounder -- its vertices' distances from the
    centre spread far less than the flat facets' points do."""
    import trimesh

    vertices = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], np.float64) * 20.0
    faces = np.array([[0, 2, 4], [2, 1, 4], [1, 3, 4], [3, 0, 4], [2, 0, 5], [1, 2, 5], [3, 1, 5], [0, 3, 5]])
    fine, fine_faces = trimesh.remesh.subdivide_loop(vertices, faces, iterations=3)
    centres = vertices[faces].mean(axis=1)  # the facets' centres: the flat parts of the coarse mesh
    coarse_spread = np.linalg.norm(np.r_[vertices, centres], axis=1)
    radius = np.linalg.norm(fine, axis=1)
    assert len(fine_faces) == 8 * 4 ** 3
    assert np.ptp(radius) / radius.mean() < 0.35 * np.ptp(coarse_spread) / coarse_spread.mean()
