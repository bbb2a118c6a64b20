"""``anonmri deface IN OUT --method M``: a removal baseline, keeping every brain voxel.

Methods: quickshear, facemask, deface, skullstrip, blur, black, and reface (the average head
placed from the brain mask and hull; see :mod:`AnonMRILib.pipelines.baselines`). Writes OUT (the input's grid and voxel type, scrubbed
header) and a before/after anterior rendering side by side (both at the original's skin level), by default next to OUT as
``<stem>_before_after.png``. Both paths are checked before any work; nothing is written unless
the brain voxels were verified unchanged.
"""
import argparse
from pathlib import Path

from .common import (add_brain_mask_argument, add_input_argument, add_quiet_argument, add_series_uid_argument,
                     load_input, load_user_brain_mask)


def add_parser(subparsers) -> None:
    from AnonMRILib.pipelines.baselines import REMOVAL_METHODS

    parser = subparsers.add_parser(
        "deface", help="remove, obscure or replace the face (brain kept exactly)",
        description="De-identify with a removal baseline (QUICKSHEAR, FACE MASK, DEFACE, skull stripping, "
                    "blur, black) or REFACE (everything outside the brain replaced by an average head placed "
                    "from the brain mask and convex hull alone), keeping every brain voxel bit for bit; "
                    "writes a before/after PNG.")
    add_input_argument(parser)
    parser.add_argument("output", type=Path, help="output image (NIfTI, NRRD, MHA, MGZ)")
    parser.add_argument("--method", choices=REMOVAL_METHODS, required=True, help="removal method, or reface")
    add_brain_mask_argument(parser)
    add_series_uid_argument(parser)
    parser.add_argument("--before-after", type=Path, default=None, metavar="PNG",
                        help="before/after rendering (default: <output stem>_before_after.png next to OUT)")
    parser.add_argument("--no-before-after", action="store_true", help="do not write the before/after PNG")
    parser.add_argument("--seed", type=int, default=0, help="random seed (DEFACE registration sampling, REFACE hull)")
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def before_after_path(output: Path) -> Path:
    """Default before/after PNG path: ``<stem>_before_after.png`` beside ``output``."""
    from AnonMRILib.io import stem

    return output.parent / f"{stem(output)}_before_after.png"


def run(args: argparse.Namespace) -> int:
    from AnonMRILib.errors import InputError
    from AnonMRILib.io import check_output_path, save_volume
    from AnonMRILib.pipelines.baselines import deface
    from AnonMRILib.progress import TqdmProgress
    from AnonMRILib.rendering import check_png_path, render_face, save_png, side_by_side, skin_iso_level

    inputs = [args.input, args.brain_mask]
    check_output_path(args.output, inputs)
    figure_path = None
    if not args.no_before_after:
        figure_path = check_png_path(args.before_after or before_after_path(args.output), inputs)
        if figure_path.resolve() == Path(args.output).resolve():
            raise InputError(f"{figure_path}: the before/after PNG cannot be the output image")
    volume = load_input(args)
    mask = load_user_brain_mask(args, volume)
    with TqdmProgress(f"deface ({args.method})", disable=args.quiet) as progress:
        defaced = deface(volume, args.method, brain_mask=mask, progress=progress, seed=args.seed)
    save_volume(defaced, args.output, like=volume, protect=inputs)
    print(f"wrote {args.output}")
    if figure_path is not None:
        iso_level = skin_iso_level(volume)     # the original's skin level for both panels
        figure = side_by_side([render_face(volume, iso_level=iso_level), render_face(defaced, iso_level=iso_level)],
                              ["original", args.method])
        save_png(figure, figure_path)
        print(f"wrote {figure_path}")
    return 0
