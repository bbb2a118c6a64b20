"""``anonmri deface IN OUT --method M``: a removal baseline, keeping every brain voxel.

Methods: quickshear, facemask, deface, skullstrip, blur, black, and reface (the average head
placed from the brain mask and hull; see :mod:`AnonMRILib.pipelines.baselines`). Writes OUT (the input's grid and voxel type, scrubbed
header) and a before/after anterior rendering side by side (both at the original's skin level), by default next to OUT as
``<stem>_before_after.png``. Both paths are checked before any work; nothing is written unless
the brain voxels were verified unchanged.
"""
import argparse
from pathlib import Path

from .common import (add_apply_to_argument, add_bids_sidecar_argument, add_brain_mask_argument,
                     add_dicom_output_arguments, add_input_argument, add_plausibility_argument, add_quiet_argument,
                     add_series_uid_argument, add_slice_thickness_argument, check_image_output, checked_brain_mask,
                     load_input, load_other_contrasts, slice_thickness_of, stage_image_output, stage_other_contrasts)


def add_parser(subparsers) -> None:
    from AnonMRILib.pipelines.baselines import REMOVAL_METHODS

    parser = subparsers.add_parser(
        "deface", help="remove, obscure or replace the face (brain kept exactly)",
        description="De-identify with a removal baseline (QUICKSHEAR, FACE MASK, DEFACE, skull stripping, "
                    "blur, black) or REFACE (everything outside the brain replaced by an average head placed "
                    "from the brain mask and convex hull alone), keeping every brain voxel bit for bit; "
                    "writes a before/after PNG.")
    add_input_argument(parser)
    parser.add_argument("output", type=Path,
                        help="output image (NIfTI, NRRD, MHA, MGZ) or, for a DICOM input, a DICOM output folder")
    parser.add_argument("--method", choices=REMOVAL_METHODS, required=True, help="removal method, or reface")
    add_brain_mask_argument(parser)
    add_series_uid_argument(parser)
    parser.add_argument("--before-after", type=Path, default=None, metavar="PNG",
                        help="before/after rendering (default: <output stem>_before_after.png next to OUT)")
    parser.add_argument("--no-before-after", action="store_true", help="do not write the before/after PNG")
    parser.add_argument("--seed", type=int, default=0, help="random seed (DEFACE registration sampling, REFACE hull)")
    add_slice_thickness_argument(parser, "REFACE averages its template head over this slab in each output slice")
    add_plausibility_argument(parser)
    add_bids_sidecar_argument(parser)
    add_dicom_output_arguments(parser)
    add_apply_to_argument(parser)
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def before_after_path(output: Path) -> Path:
    """Default before/after PNG path: ``<stem>_before_after.png`` beside ``output``."""
    from AnonMRILib.io import stem

    return output.parent / f"{stem(output)}_before_after.png"


def run(args: argparse.Namespace) -> int:
    from AnonMRILib.errors import InputError
    from AnonMRILib.io.writers import OutputTransaction
    from AnonMRILib.pipelines.baselines import deface
    from AnonMRILib.progress import TqdmProgress, sub_progress
    from AnonMRILib.rendering import check_png_path, render_face, save_png, side_by_side, skin_iso_level
    from AnonMRILib.transforms.anatomical_prior import AnatomicalPriorConfig

    inputs = [args.input, args.brain_mask]
    check_image_output(args, inputs)
    figure_path = None
    if not args.no_before_after:
        figure_path = check_png_path(args.before_after or before_after_path(args.output), inputs)
        if figure_path.resolve() == Path(args.output).resolve():
            raise InputError(f"{figure_path}: the before/after PNG cannot be the output image")
    volume = load_input(args)
    others = load_other_contrasts(args, inputs)
    thickness = slice_thickness_of(args) if args.method == "reface" else None
    config = None if thickness is None else AnatomicalPriorConfig(slice_thickness_mm=thickness)
    with TqdmProgress(f"deface ({args.method})", disable=args.quiet) as progress:
        mask = checked_brain_mask(args, volume, progress=sub_progress(progress, 0.0, 0.3))
        defaced = deface(volume, args.method, brain_mask=mask, progress=sub_progress(progress, 0.3, 1.0),
                         seed=args.seed, config=config)
    with OutputTransaction() as outputs:  # all outputs or none: the figure is rendered before anything appears
        stage_image_output(outputs, args, defaced, volume, args.method, inputs)
        stage_other_contrasts(outputs, args, others, volume, defaced, mask, args.method, inputs)
        if figure_path is not None:
            iso_level = skin_iso_level(volume)     # the original's skin level for both panels
            figure = side_by_side([render_face(volume, iso_level=iso_level),
                                   render_face(defaced, iso_level=iso_level)], ["original", args.method])
            outputs.add_file(figure_path, lambda path: save_png(figure, path), protect=inputs)
    if not args.quiet:
        print(f"wrote {args.output}" + (f" and {figure_path}" if figure_path is not None else ""))
    return 0
