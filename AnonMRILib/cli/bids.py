"""``anonmri bids BIDS_DIR OUT_DIR participant``: the BIDS app (BIDS-Apps command-line convention).

Every T1w of the dataset (or of ``--participant-label`` subjects) is de-identified with ``--method``
(CP-GAN ``remodel`` by default, or a removal baseline), and every T2w/FLAIR/PD of the same session
receives the T1w's face through a rigid registration (:mod:`AnonMRILib.pipelines.multicontrast`).
OUT_DIR mirrors the input names and adds ``*_defacemask`` files, sidecars with
``DeidentificationMethod``/``DeidentificationMethodCodeSequence``, the brain masks used,
``dataset_description.json`` (``GeneratedBy``), ``anonmri_scans.tsv`` (per-scan scores) and a
``sub-<label>.html`` page per subject with before/after renderings. The run is resumable: finished
scans are skipped, each scan's outputs appear together or not at all. BIDS_DIR is only read.
Exit status: 0 when every scan is done or skipped, 1 when some scan failed (listed in the TSV), 2 for
a bad command line or dataset.
"""
import argparse
from pathlib import Path

from .common import add_device_argument, add_plausibility_argument, add_quiet_argument


def default_workers() -> int:
    """Half the CPU cores, at least 1 (each worker's torch also uses threads)."""
    import os

    return max(1, (os.cpu_count() or 1) // 2)


def add_parser(subparsers) -> None:
    from AnonMRILib.pipelines.baselines import REMOVAL_METHODS

    parser = subparsers.add_parser(
        "bids", help="BIDS app: de-identify every anatomical scan of a BIDS dataset (resumable, Dask)",
        description="De-identify a BIDS dataset into OUT_DIR (BIDS-Apps convention: BIDS_DIR OUT_DIR participant).")
    parser.add_argument("bids_dir", type=Path, metavar="BIDS_DIR", help="input BIDS dataset (never modified)")
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="output dataset folder (created)")
    parser.add_argument("analysis_level", choices=("participant",), help="BIDS-Apps analysis level")
    parser.add_argument("--participant-label", nargs="+", default=None, metavar="LABEL",
                        help="only these subjects (with or without 'sub-')")
    parser.add_argument("--method", choices=("remodel",) + tuple(REMOVAL_METHODS), default="remodel",
                        help="remodel (CP-GAN, default) or a removal baseline")
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
    parser.add_argument("--no-figures", action="store_true", help="no before/after PNGs (faster)")
    add_device_argument(parser)
    add_plausibility_argument(parser)
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from AnonMRILib.batch.bids_layout import find_scans
    from AnonMRILib.batch.report import write_dataset_description, write_scores_tsv, write_subject_pages
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
    layout = find_scans(bids_dir, args.participant_label)
    settings = ScanSettings(
        bids_dir=str(bids_dir), out_dir=str(out_dir), method=args.method,
        brain_masks=str(args.brain_masks.resolve()) if args.brain_masks is not None else None,
        weights=str(args.weights) if args.weights is not None else None,
        device=args.device,
        seed=args.seed, plausibility_checks=not args.skip_plausibility_checks, figures=not args.no_figures,
        retries=args.retries)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_dataset_description(bids_dir, out_dir, args.method)
    records = run_scans(layout, settings, scheduler=args.scheduler, workers=args.workers)
    write_scores_tsv(out_dir, records)
    write_subject_pages(out_dir, records)
    counts = {}
    for record in records:
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    if not args.quiet:
        print(f"{len(records)} scans: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
              + f" -> {args.out_dir}")
        for record in records:
            if record["status"] in ("failed", "blocked"):
                print(f"  {record['scan']}: {record['status']}: {record.get('error', '')}")
    return 0 if all(r["status"] in ("done", "skipped") for r in records) else 1
