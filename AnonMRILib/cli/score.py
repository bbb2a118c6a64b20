"""``anonmri score ORIGINAL ANONYMIZED [--brain-mask M] [--json]``: privacy and utility scores.

Leads with one verdict, decided by the open face recognizer (dlib; without it "not assessed" and
the install command), then the outline residual (the shipped Siamese attacker's rank of the true
original, and the same for a template face on the scan's hull), then the evidence: brain voxels
preserved, change in the face region (PSNR/SSIM), the PSNR-difference anonymity criterion on face
renderings against a reference set of other heads
(:func:`AnonMRILib.evaluation.scores.scan_scores`). Both scans must share one grid.
"""
import argparse
import json

from .common import add_brain_mask_argument, add_input_argument, add_quiet_argument


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("score", help="score an anonymized scan against its original")
    add_input_argument(parser, "original", help="the original scan (NIfTI, NRRD, MHA/MHD, MGZ or DICOM folder)")
    add_input_argument(parser, "anonymized", help="its anonymized version, on the same grid")
    add_brain_mask_argument(parser)
    parser.add_argument("--reference", default=None, metavar="NPZ",
                        help="reference renderings of other heads (default: the shipped set)")
    parser.add_argument("--attacker-weights", default=None, metavar="SAFETENSORS",
                        help="re-identification attacker weights (default: the shipped ones)")
    parser.add_argument("--no-renderings", action="store_true",
                        help="skip the rendering-based scores (recognizer verdict, anonymity criterion, attacker "
                             "rank)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def _lines(scores: dict, prefix: str = ""):
    for key, value in scores.items():
        if isinstance(value, dict):
            yield from _lines(value, f"{prefix}{key}.")
        elif isinstance(value, list):
            for item in value:
                yield f"{prefix}{key}: {item}"
        elif isinstance(value, float):
            yield f"{prefix}{key} = {value:.4f}"
        else:
            yield f"{prefix}{key} = {value}"


def run(args: argparse.Namespace) -> int:
    from ..evaluation.scores import scan_scores
    from ..progress import TqdmProgress
    from .common import load_input, load_user_brain_mask

    original = load_input(args, "original")
    anonymized = _load_anonymized(args)
    mask = load_user_brain_mask(args, original)
    reference = False if args.no_renderings else args.reference
    with TqdmProgress("score", disable=args.quiet or args.json) as progress:
        scores = scan_scores(original, anonymized, brain_mask=mask, reference_renderings=reference,
                             attacker_weights=args.attacker_weights, progress=progress)
    if args.json:
        print(json.dumps(_json_safe(scores), indent=2, allow_nan=False))
    else:
        for line in _lines(scores):
            print(line)
    return 0


def _json_safe(value):
    """Strict JSON: infinite / NaN floats (e.g. the PSNR of an unchanged region) as "inf", "-inf", "nan"."""
    import math

    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _load_anonymized(args: argparse.Namespace):
    """The anonymized scan; a constant image (e.g. BLACK) is allowed, NaN/Inf are not."""
    import numpy as np

    from ..errors import InputError
    from ..io import load_volume

    volume = load_volume(args.anonymized)
    data = volume.array
    if np.issubdtype(data.dtype, np.floating) and not np.all(np.isfinite(data)):
        raise InputError(f"the anonymized image {args.anonymized} contains NaN or infinite voxel values")
    return volume
