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


def synthetic_head_with_neck():
    """(labels, brain, affine) of a 1 mm RAS head: an ellipsoidal brain (lowest point z = 85 mm,
    midline x = 60 mm) over an elliptic neck (centre y = 80, radii 50 x 70 mm), muscle inside,
    a 2 mm skin, and a wrongly traced "cord" 15 mm right of the midline."""
    from AnonMRILib.transforms.tissue_model import LABEL

    shape = (120, 170, 180)
    x, y, z = np.mgrid[: shape[0], : shape[1], : shape[2]].astype(np.float64)
    brain = ((x - 60) / 45) ** 2 + ((y - 60) / 55) ** 2 + ((z - 130) / 45) ** 2 <= 1.0
    neck = ((x - 60) / 50) ** 2 + ((y - 80) / 70) ** 2 <= 1.0
    head = (neck & (z >= 2)) | (((x - 60) / 56) ** 2 + ((y - 70) / 68) ** 2 + ((z - 125) / 56) ** 2 <= 1.0)
    labels = np.full(shape, LABEL["outside"], np.uint8)
    labels[head] = LABEL["muscle"]
    from scipy import ndimage

    labels[head & (ndimage.distance_transform_edt(head) <= 2)] = LABEL["skin"]
    labels[brain] = LABEL["csf"]
    labels[(np.hypot(x - 75, y - 70) <= 4) & (z < 85) & head & ~brain] = LABEL["cord"]
    return labels, brain, np.eye(4)


def test_cervical_spine_is_drawn_on_the_midline_under_the_medulla():
    """The column hangs from the brain's front at the midline: cord in CSF, vertebral bodies of
    the shape's height over discs, bony arches, the pharynx in front; the old off-midline cord is
    gone and nothing within the skin clearance changes."""
    from reface_tissue_labels import CervicalSpineShape, draw_cervical_spine

    from AnonMRILib.transforms.tissue_model import LABEL

    labels, brain, affine = synthetic_head_with_neck()
    texture = np.full(labels.shape, 0.3, np.float32)
    shape = CervicalSpineShape()
    out, out_texture = draw_cervical_spine(labels, texture, brain, affine, shape)
    front = np.argwhere(brain[55:66, :, 85:96])[:, 1].max()
    y0 = front - shape.stem_depth
    cord = np.argwhere(out[:, :, :60] == LABEL["cord"])
    assert abs(cord[:, 0].mean() - 60) < 0.5 and abs(cord[:, 1].mean() - y0) < 1.0
    assert not np.any(out[70:80, 60:80, :60] == LABEL["cord"])  # the old trace became muscle
    z = 40
    assert out[60, int(y0), z] == LABEL["cord"]
    assert out[60, int(y0) + 6, z] == LABEL["csf"] and out[60, int(y0) - 6, z] == LABEL["csf"]
    # along the bodies' axis: vertebrae (marrow in a bony shell) alternate with discs
    axis = out[60, int(round(y0 + shape.canal_radii[1] + shape.body_radii[1])), :85]
    runs = np.split(axis, np.flatnonzero(np.diff(axis)) + 1)
    discs = [len(r) for r in runs if r[0] == LABEL["disc"]]
    marrow = [len(r) for r in runs if r[0] == LABEL["vertebra"]]
    assert len(discs) >= 3 and all(abs(n - shape.disc_height) <= 1 for n in discs)
    assert all(abs(n - (shape.body_height - 2 * shape.cortex)) <= 2 for n in marrow[1:-1])
    # a spinous process behind the canal and the airway in front of the bodies
    assert np.any(out[60, : int(y0 - shape.canal_radii[1]), :60] == LABEL["vertebra"])
    airway = y0 + shape.canal_radii[1] + 2 * shape.body_radii[1] + shape.prevertebral + shape.mucosa + shape.airway_radii[1]
    assert out[60, int(round(airway)), z] == LABEL["air"]
    # nothing near the skin changed; redrawn voxels carry no texture
    from scipy import ndimage

    near_skin = ndimage.distance_transform_edt(labels != LABEL["outside"]) <= shape.skin_clearance
    changed = out != labels
    assert not np.any(changed & near_skin & (labels != LABEL["cord"]))
    assert np.all(out_texture[changed & (labels != LABEL["cord"])] == 0.0)
    assert labels[60, int(y0), z] == LABEL["muscle"]  # the input is not modified


def synthetic_face():
    """(labels, affine) of a 1 mm RAS head of muscle with two eye globes 64 mm apart (centres at
    x = 28 / 92, y = 120, z = 100 mm) and a 2 mm skin."""
    from scipy import ndimage

    from AnonMRILib.transforms.tissue_model import LABEL

    shape = (120, 160, 150)
    x, y, z = np.mgrid[: shape[0], : shape[1], : shape[2]].astype(np.float64)
    head = ((x - 60) / 58) ** 2 + ((y - 75) / 70) ** 2 + ((z - 75) / 74) ** 2 <= 1.0
    labels = np.full(shape, LABEL["outside"], np.uint8)
    labels[head] = LABEL["muscle"]
    labels[head & (ndimage.distance_transform_edt(head) <= 2)] = LABEL["skin"]
    for cx in (28, 92):
        labels[(x - cx) ** 2 + (y - 120) ** 2 + (z - 100) ** 2 <= 11 ** 2] = LABEL["vitreous"]
    return labels, np.eye(4)


def test_nasal_cavity_is_drawn_between_the_eyes():
    """Air on both sides of a midline septum (mucosa), turbinates (mucosa) on the lateral walls, the
    cavity as wide as the shape says at its floor and roof, placed from the eyes, the septum ending
    behind in the vomer's oblique edge; with the default deviation and irregularity the septum bows
    and wanders, but by no more than they say, and a mid-sagittal slice cuts septum and air."""
    from reface_tissue_labels import NasalCavityShape, draw_nasal_cavity, eye_centres

    from AnonMRILib.transforms.tissue_model import LABEL

    labels, affine = synthetic_face()
    assert np.allclose(np.sort(eye_centres(labels, affine)[:, 0]), [28, 92], atol=0.1)
    shape = NasalCavityShape(irregularity_mm=0.0, septal_deviation=0.0)
    out, _ = draw_nasal_cavity(labels, np.zeros(labels.shape, np.float32), affine, shape)
    floor = int(100 - shape.floor_below_eyes)
    y = int(120 + shape.aperture_before_eyes - 30)  # 30 mm behind the aperture
    cavity = np.flatnonzero(out[:, y, floor + 3] != labels[:, y, floor + 3])
    assert abs(len(cavity) - shape.floor_width) <= 2 and abs(cavity.mean() - 60) <= 0.5
    assert out[60, y, floor + 3] == LABEL["mucosa"]  # the septum
    assert out[60 + 4, y, floor + 16] == LABEL["air"] and out[60 - 4, y, floor + 16] == LABEL["air"]
    # the inferior turbinate against each lateral wall
    inferior = shape.turbinates[0]
    lateral = int(round(0.5 * shape.floor_width - inferior[1] + 0.5 * (shape.roof_width - shape.floor_width) * inferior[0] / shape.height))
    assert out[60 + lateral, y, floor + int(inferior[0])] == LABEL["mucosa"]
    assert out[60 - lateral, y, floor + int(inferior[0])] == LABEL["mucosa"]
    roof = np.flatnonzero(out[:, y, floor + int(shape.height) - 3] != labels[:, y, floor + int(shape.height) - 3])
    assert len(roof) <= shape.roof_width + 2
    assert not np.any(out[:, y, floor - 3] != labels[:, y, floor - 3])  # nothing below the floor
    assert not np.any(out[:, : int(120 + shape.aperture_before_eyes - shape.length) - 2] !=
                      labels[:, : int(120 + shape.aperture_before_eyes - shape.length) - 2])  # nor behind the choanae
    wavy, _ = draw_nasal_cavity(labels, np.zeros(labels.shape, np.float32), affine)

    def septum_centre(row):
        """midpoint of the non-air gap between the two air channels nearest the midline"""
        air = np.flatnonzero(row == LABEL["air"])
        gaps = np.flatnonzero(np.diff(air) > 1)
        mids = [(air[g] + air[g + 1]) / 2 for g in gaps]
        return min(mids, key=lambda m: abs(m - 60))

    septum_x = [septum_centre(wavy[:, yy, floor + 20]) for yy in range(80, 125, 5)]
    assert abs(septum_centre(out[:, y, floor + 20]) - 60) <= 0.5
    default = NasalCavityShape()
    bound = default.septal_deviation + default.irregularity_mm + 1.0
    assert np.ptp(septum_x) > 1.0 and np.all(np.abs(np.array(septum_x) - 60) <= bound)
    # the vomer's oblique edge: near the floor the septum ends well in front of the choanae, near
    # the roof at them; behind it, air joins both sides
    back = int(120 + shape.aperture_before_eyes - shape.length)

    def septum_start(row):  # past the posterior wall's mucosa
        start = back + int(np.ceil(shape.mucosa)) + 1
        return start + int(np.argmax(row[start:] == LABEL["mucosa"]))

    low, high = septum_start(out[60, :, floor + 4]), septum_start(out[60, :, floor + 20])
    assert low - back >= shape.vomer_setback * (1 - 4 / shape.height) - 2
    assert high - back <= shape.vomer_setback * (1 - 20 / shape.height) + 2 and low > high
    assert out[60, back + 5, floor + 4] == LABEL["air"]
    # a mid-sagittal slice of the default (bowed) septum cuts septum and air in turn
    mid = wavy[60, back:int(120 + shape.aperture_before_eyes) - 8, floor + 8:floor + 35]
    assert 0.15 < np.mean(mid == LABEL["air"]) < 0.85 and np.mean(mid == LABEL["mucosa"]) > 0.15
