"""``anonmri bids BIDS_DIR OUT_DIR participant``: the BIDS app (BIDS-Apps command-line convention).

OUT_DIR becomes the whole dataset, de-identified, as a raw BIDS dataset to share in place of the
input: every T1w de-identified with ``--method`` (CP-GAN ``remodel`` by default, ``reface`` or a
removal baseline), every T2w/FLAIR/PD(w)/T2starw of the same session given the T1w's face through a
rigid registration (:mod:`AnonMRILib.pipelines.multicontrast`), every other image carried with its
header scrubbed and voxels unchanged (a warning for faces left untreated), every text file carried
through :mod:`AnonMRILib.batch.metadata` (acquisition times removed or ``--date-shift``-ed,
identifying participants.tsv columns dropped). Masks, renderings, per-image records and reports
go under ``derivatives/anonmri/`` (a derivative dataset). The run is resumable: finished images are
skipped, each image's outputs appear together or not at all. BIDS_DIR is only read.
Exit status: 0 when every image is done or skipped, 1 when some failed (listed in the TSV), 2 for
a bad command line or dataset.
"""
import argparse
from pathlib import Path
from typing import Sequence, Tuple

from .common import add_device_argument, add_plausibility_argument, add_quiet_argument


def default_workers() -> int:
    """Half the CPU cores, at least 1 (each worker's torch also uses threads)."""
    import os

    return max(1, (os.cpu_count() or 1) // 2)


def add_parser(subparsers) -> None:
    from AnonMRILib.batch.bids_layout import OTHER_SUFFIXES
    from AnonMRILib.pipelines.baselines import REMOVAL_METHODS

    parser = subparsers.add_parser(
        "bids", help="BIDS app: the whole BIDS dataset, de-identified, as a valid raw dataset (resumable, Dask)",
        description="De-identify a whole BIDS dataset into OUT_DIR, a raw BIDS dataset with a derivative "
                    "derivatives/anonmri (BIDS-Apps convention: BIDS_DIR OUT_DIR participant).")
    parser.add_argument("bids_dir", type=Path, metavar="BIDS_DIR", help="input BIDS dataset (never modified)")
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="output dataset folder (created)")
    parser.add_argument("analysis_level", choices=("participant",), help="BIDS-Apps analysis level")
    parser.add_argument("--participant-label", nargs="+", default=None, metavar="LABEL",
                        help="only these subjects (with or without 'sub-')")
    parser.add_argument("--method", nargs="+", default=["remodel"], metavar="METHOD|SUFFIX=CHOICE",
                        help="the T1w's method: remodel (CP-GAN, default) or one of " + ", ".join(REMOVAL_METHODS)
                             + "; then per-suffix choices for other anatomical images: SUFFIX=carry (the T1w's "
                             "face, default for " + ", ".join(OTHER_SUFFIXES) + ") or SUFFIX=keep (carried "
                             "untreated, with a warning), e.g. --method reface FLAIR=keep angio=carry")
    parser.add_argument("--date-shift", action="store_true",
                        help="shift acquisition times by one random offset per subject (default: remove them)")
    parser.add_argument("--age-bin", type=int, default=0, metavar="YEARS",
                        help="bin participants' ages to YEARS-wide bins (default 0: kept; 89 or older is 89+)")
    parser.add_argument("--brain-masks", type=Path, default=None, metavar="DERIV_DIR",
                        help="BIDS derivative folder with <entities>_desc-brain_mask.nii.gz per T1w "
                             "(default: HD-BET, loaded once per worker)")
    parser.add_argument("--weights", type=Path, default=None, help="CP-GAN weights (default: shipped)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of every scan (default 0)")
    parser.add_argument("--workers", type=int, default=default_workers(),
                        help="local worker processes (a Dask LocalCluster; 1 = in this process; default: half the "
                             f"CPU cores, here {default_workers()})")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="address of a dask.distributed scheduler (e.g. tcp://host:8786) instead of local workers")
    parser.add_argument("--retries", type=int, default=1,
                        help="retries of a scan after an unexpected error (default 1)")
    parser.add_argument("--no-figures", action="store_true", help="no renderings of the de-identified faces (faster)")
    add_device_argument(parser)
    add_plausibility_argument(parser)
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def parse_methods(values: Sequence[str]) -> Tuple[str, Tuple[str, ...]]:
    """(the T1w's method, the anatomical suffixes that receive its face) from ``--method`` values."""
    from AnonMRILib.batch.bids_layout import OTHER_SUFFIXES, REFERENCE_SUFFIX
    from AnonMRILib.errors import InputError
    from AnonMRILib.pipelines.baselines import REMOVAL_METHODS

    methods = ("remodel",) + tuple(REMOVAL_METHODS)
    method, carried = "remodel", list(OTHER_SUFFIXES)
    for value in values:
        suffix, _, choice = value.rpartition("=")
        if suffix in ("", REFERENCE_SUFFIX):
            if choice not in methods:
                raise InputError(f"--method {value}: the T1w's method must be one of {', '.join(methods)}")
            method = choice
        elif choice not in ("carry", "keep") or not suffix.isalnum():
            raise InputError(f"--method {value}: expected SUFFIX=carry or SUFFIX=keep")
        elif choice == "carry" and suffix not in carried:
            carried.append(suffix)
        elif choice == "keep" and suffix in carried:
            carried.remove(suffix)
    return method, tuple(carried)


def run(args: argparse.Namespace) -> int:
    from AnonMRILib.batch.bids_layout import find_scans
    from AnonMRILib.batch.metadata import MetadataSettings, prepare_metadata, write_metadata
    from AnonMRILib.batch.report import (dataset_descriptions, deidentification_summary, write_dataset_descriptions,
                                         write_metadata_tsv, write_scores_tsv, write_subject_pages)
    from AnonMRILib.batch.runner import run_scans
    from AnonMRILib.batch.scan import ScanSettings
    from AnonMRILib.errors import InputError

    bids_dir, out_dir = args.bids_dir.resolve(), args.out_dir.resolve()
    if out_dir == bids_dir or bids_dir in out_dir.parents:
        raise InputError(f"{args.out_dir}: OUT_DIR must lie outside BIDS_DIR (the input is never modified)")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{args.out_dir}: exists and is not a folder")
    if args.retries < 0:
        raise InputError("--retries must be >= 0")
    if args.brain_masks is not None and not args.brain_masks.is_dir():
        raise InputError(f"{args.brain_masks}: no such folder")
    method, carried = parse_methods(args.method)
    metadata = MetadataSettings(date_shift=args.date_shift, age_bin=args.age_bin)
    layout = find_scans(bids_dir, args.participant_label, carried)
    earlier = {p.name[4:] for p in out_dir.glob("sub-*") if p.is_dir()} if out_dir.is_dir() else set()
    texts, decisions = prepare_metadata(layout, metadata, sorted(set(layout.subjects) | earlier))
    settings = ScanSettings(
        bids_dir=str(bids_dir), out_dir=str(out_dir), method=method,
        brain_masks=str(args.brain_masks.resolve()) if args.brain_masks is not None else None,
        weights=str(args.weights) if args.weights is not None else None,
        device=args.device,
        seed=args.seed, plausibility_checks=not args.skip_plausibility_checks, figures=not args.no_figures,
        retries=args.retries)
    descriptions = dataset_descriptions(bids_dir, deidentification_summary(
        method, [s for s in carried if any(scan.suffix == s for scan in layout.others)], args.date_shift,
        args.age_bin))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_dataset_descriptions(out_dir, descriptions)
    records = run_scans(layout, settings, scheduler=args.scheduler, workers=args.workers)
    write_metadata(texts, out_dir)
    write_scores_tsv(out_dir, records)
    write_metadata_tsv(out_dir, decisions)
    write_subject_pages(out_dir, records)
    counts = {}
    for record in records:
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    warned = [r for r in records if r.get("warning")]
    if not args.quiet:
        print(f"{len(records)} images: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
              + f"; {len(texts)} other files carried -> {args.out_dir}")
        for record in records:
            if record["status"] in ("failed", "blocked"):
                print(f"  {record['scan']}: {record['status']}: {record.get('error', '')}")
        if warned:
            print(f"  warning: {len(warned)} image(s) carried with a face left untreated (see "
                  "derivatives/anonmri/anonmri_scans.tsv, column warning)")
        labels = [d[0] for d in decisions if d[2] == "warning"]
        if labels:
            print(f"  warning: folder labels that look like dates (rename before sharing): {', '.join(labels)}")
        if layout.left_out:
            print(f"  not carried: {', '.join(layout.left_out)}")
    return 0 if all(r["status"] in ("done", "skipped") for r in records) else 1
