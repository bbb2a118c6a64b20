"""``anonmri brainmask IN OUT``: compute the brain mask of a whole-head T1 and save it (uint8 0/1).

The mask is written on the input's own grid, as uint8 0/1, with a scrubbed header. The output path
is checked before the work starts; nothing is written when the mask cannot be computed.
"""
import argparse
from pathlib import Path

import numpy as np

from .common import (add_device_argument, add_input_argument, add_plausibility_argument, add_quiet_argument,
                     add_series_uid_argument, load_input, plausibility_checks_on)


def add_parser(subparsers) -> None:
    from AnonMRILib.transforms.brain_mask import BACKENDS, DEFAULT_BACKEND

    parser = subparsers.add_parser(
        "brainmask", help="compute the brain mask of a whole-head T1 (uint8 0/1, input grid)",
        description="Compute the brain mask of a whole-head T1-weighted MRI and save it as uint8 0/1 "
                    "on the input's grid.")
    add_input_argument(parser)
    parser.add_argument("output", type=Path, help="output mask (.nii.gz, .nrrd, .mha, ...)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help=f"brain-extraction method (default: auto = {DEFAULT_BACKEND})")
    add_device_argument(parser)
    add_series_uid_argument(parser)
    add_plausibility_argument(parser)
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from AnonMRILib.io import check_output_path, save_volume
    from AnonMRILib.progress import TqdmProgress
    from AnonMRILib.transforms.brain_mask import brain_mask

    check_output_path(args.output, inputs=[args.input])
    volume = load_input(args)
    with TqdmProgress("brain mask", disable=args.quiet) as progress:
        mask = brain_mask(volume, backend=args.backend, progress=progress, device=args.device)
    if plausibility_checks_on(args):
        from AnonMRILib.transforms.plausibility import check_brain_mask

        check_brain_mask(volume, mask)
    save_volume(mask, args.output, like=np.uint8, protect=[args.input])
    if not args.quiet:
        volume_ml = float(mask.array.sum()) * float(np.prod(volume.spacing)) / 1000.0
        print(f"brain mask: {int(mask.array.sum())} voxels ({volume_ml:.0f} mL) -> {args.output}")
    return 0
