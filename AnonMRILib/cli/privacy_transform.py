"""``anonmri privacy-transform IN OUTDIR``: write CP-GAN's gamma(x) on the input's grid for inspection.

Writes into OUTDIR (created when missing): ``convex_hull.nii.gz`` (c(x), uint8), ``brain_mask.nii.gz``
(b(x), uint8), ``brain.nii.gz`` (b(x) * x in the input's voxel type) and
``privacy_transform.png`` (mid-slices of input, hull, mask and brain). Existing files of these
names are replaced; the input is never overwritten.
"""
import argparse
import os
from pathlib import Path
from typing import Dict

import numpy as np

from .common import (add_brain_mask_argument, add_device_argument, add_input_argument, add_plausibility_argument,
                     add_quiet_argument, add_series_uid_argument, checked_brain_mask, load_input)

OUTPUT_FILES = {
    "convex_hull": "convex_hull.nii.gz",
    "brain_mask": "brain_mask.nii.gz",
    "brain": "brain.nii.gz",
    "montage": "privacy_transform.png",
}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "privacy-transform",
        help="write CP-GAN's privacy transform (convex hull, brain mask, brain) for inspection",
        description="Compute gamma(x) = [convex hull, brain mask, brain] and write it on the input's grid "
                    "(NIfTI) with a PNG montage of mid-slices.")
    add_input_argument(parser)
    parser.add_argument("outdir", type=Path, help="output folder (created when missing)")
    add_brain_mask_argument(parser)
    add_series_uid_argument(parser)
    parser.add_argument("--size", type=int, choices=(32, 64, 128), default=128,
                        help="model grid size S (S^3 voxels; default 128)")
    parser.add_argument("--rotations", type=int, default=32, metavar="K",
                        help="random rotations for the surface representation (default 32)")
    parser.add_argument("--facets", type=int, default=100, metavar="N",
                        help="hull triangles carving the convex hull; 0 = all (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    add_device_argument(parser)
    add_plausibility_argument(parser)
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def output_paths(outdir: Path, inputs) -> Dict[str, Path]:
    """The output files in ``outdir``, validated before any work (folder exists, no input clobbered)."""
    from AnonMRILib.errors import InputError
    from AnonMRILib.io import check_output_path

    if outdir.exists() and not outdir.is_dir():
        raise InputError(f"{outdir}: is a file, expected an output folder")
    if outdir.is_dir() and not os.access(str(outdir), os.W_OK | os.X_OK):
        raise InputError(f"{outdir}: output folder is not writable")
    paths = {name: outdir / filename for name, filename in OUTPUT_FILES.items()}
    for name, path in paths.items():
        if name != "montage":
            check_output_path(path, inputs)
        elif any(source is not None and path.resolve() == Path(source).resolve() for source in inputs):
            raise InputError(f"{path}: refusing to overwrite the input")
    return paths


def run(args: argparse.Namespace) -> int:
    from AnonMRILib.device import resolve_device
    from AnonMRILib.errors import InputError
    from AnonMRILib.io.writers import OutputTransaction
    from AnonMRILib.progress import TqdmProgress, sub_progress
    from AnonMRILib.transforms.brain_mask import resolve_brain_mask
    from AnonMRILib.transforms.privacy import PrivacyTransformConfig, privacy_transform

    if args.rotations < 1:
        raise InputError("--rotations must be >= 1")
    if args.facets != 0 and args.facets < 4:
        raise InputError("--facets must be 0 (all) or >= 4")
    inputs = [args.input, args.brain_mask]
    paths = output_paths(args.outdir, inputs)
    device = resolve_device(args.device)
    image = load_input(args)
    config = PrivacyTransformConfig(size=args.size, rotations=args.rotations,
                                    facets=None if args.facets == 0 else args.facets)
    with TqdmProgress("privacy-transform", disable=args.quiet) as progress:
        mask = resolve_brain_mask(image, checked_brain_mask(args, image, progress=sub_progress(progress, 0, 0.3),
                                                            device=args.device))
        transform = privacy_transform(image, mask, config, seed=args.seed, device=device,
                                      progress=sub_progress(progress, 0.3, 1.0))
    brain = image.with_array(np.where(transform.brain_mask.array != 0, image.array, 0).astype(image.dtype))
    with OutputTransaction() as outputs:  # all four outputs or none
        outputs.add_volume(transform.convex_hull, paths["convex_hull"], like=np.uint8, protect=inputs)
        outputs.add_volume(transform.brain_mask, paths["brain_mask"], like=np.uint8, protect=inputs)
        outputs.add_volume(brain, paths["brain"], like=image, protect=inputs)
        outputs.add_file(paths["montage"], lambda path: save_montage(path, image, transform), protect=inputs)
    if not args.quiet:
        for name in ("convex_hull", "brain_mask", "brain", "montage"):
            print(paths[name])
    return 0


def save_montage(path: Path, image, transform) -> None:
    """PNG: rows = axial, coronal, sagittal mid-slices (through the brain's centre);
    columns = input, convex hull over the input, brain mask, brain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import nibabel as nib

    def canonical(array):
        # display in RAS orientation whatever the input's voxel order
        ornt = nib.orientations.io_orientation(image.affine)
        return nib.orientations.apply_orientation(np.asarray(array), ornt)

    data = canonical(image.array.astype(np.float32))
    hull = canonical(transform.convex_hull.array)
    brain_mask = canonical(transform.brain_mask.array)
    brain = np.where(brain_mask != 0, data, 0)
    center = [int(round(c)) for c in np.argwhere(brain_mask).mean(axis=0)]
    high = float(np.percentile(data[data > 0], 99.5)) if np.any(data > 0) else 1.0

    def cut(volume, view):
        if view == "axial":
            return volume[:, :, center[2]].T
        if view == "coronal":
            return volume[:, center[1], :].T
        return volume[center[0], :, :].T

    views = ("axial", "coronal", "sagittal")
    columns = ("input", "convex hull", "brain mask", "brain")
    figure, axes = plt.subplots(len(views), len(columns), figsize=(2.6 * len(columns), 2.6 * len(views)))
    for row, view in enumerate(views):
        for col, title in enumerate(columns):
            axis = axes[row, col]
            if title == "input":
                axis.imshow(cut(data, view), cmap="gray", origin="lower", vmin=0, vmax=high)
            elif title == "convex hull":
                axis.imshow(cut(data, view), cmap="gray", origin="lower", vmin=0, vmax=high)
                axis.contour(cut(hull, view), levels=[0.5], colors="tab:orange", linewidths=1.0)
                axis.imshow(np.ma.masked_equal(cut(hull, view), 0), cmap="autumn", alpha=0.25, origin="lower")
            elif title == "brain mask":
                axis.imshow(cut(brain_mask, view), cmap="gray", origin="lower", vmin=0, vmax=1)
            else:
                axis.imshow(cut(brain, view), cmap="gray", origin="lower", vmin=0, vmax=high)
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title(title, fontsize=9)
            if col == 0:
                axis.set_ylabel(view, fontsize=9)
    figure.tight_layout()
    temporary = path.with_name(f".{path.name}.partial.png")
    try:
        figure.savefig(str(temporary), dpi=80)
        os.replace(temporary, path)
    finally:
        plt.close(figure)
        if temporary.exists():
            temporary.unlink()
