"""Throughput of ``anonmri bids`` (scans/hour) against the number of Dask workers on this machine.

    nice -n 10 python Testing/Benchmarks/benchmark_batch.py --subjects 4 --workers 1 2 --method remodel

Builds a BIDS dataset of ``--subjects`` subjects (T1w + T2w each) from the embedded sample head
decimated by ``--step`` (2 = 3 mm voxels), with its brain mask as a derivative (so that the figures
measure the de-identification and the T2w registration, not HD-BET; add ``--compute-brain-masks`` to
include HD-BET, loaded once per worker), then runs the BIDS app once per worker count into a fresh
output folder and prints one line per run: workers, scans, seconds, scans/hour. The subjects are the
same head with intensity scaling and a different T2w motion each; the figures hold for heads of that
size only (a 1 mm head is ~8x the voxels of a 2 mm one).
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "Python"))


def build_dataset(root: Path, subjects: int, step: int) -> tuple:
    from dicom_fixtures import small_sample
    from multicontrast_fixtures import t2_like

    from AnonMRILib.io import save_volume

    bids, masks = root / "bids", root / "masks"
    bids.mkdir(parents=True)
    (bids / "dataset_description.json").write_text(json.dumps({"Name": "benchmark", "BIDSVersion": "1.9.0"}))
    head, brain = small_sample(step=step)
    for index in range(subjects):
        label = f"sub-{index + 1:02d}"
        t1 = head.with_array(np.rint(head.array * (1.0 + 0.1 * index)).astype(head.dtype))
        (bids / label / "anat").mkdir(parents=True)
        (masks / label / "anat").mkdir(parents=True)
        save_volume(t1, bids / label / "anat" / f"{label}_T1w.nii.gz")
        save_volume(t2_like(t1, angle_deg=-6.0 + 3.0 * index)[0], bids / label / "anat" / f"{label}_T2w.nii.gz")
        save_volume(brain, masks / label / "anat" / f"{label}_desc-brain_mask.nii.gz")
    return bids, masks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subjects", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--method", default="remodel")
    parser.add_argument("--step", type=int, default=2, help="decimation of the 1.5 mm sample head (2 = 3 mm)")
    parser.add_argument("--compute-brain-masks", action="store_true", help="HD-BET instead of the given masks")
    args = parser.parse_args(argv)

    from AnonMRILib.cli.main import main as anonmri

    with tempfile.TemporaryDirectory(prefix="anonmri-benchmark-") as scratch:
        bids, masks = build_dataset(Path(scratch), args.subjects, args.step)
        print(f"{args.subjects} subjects x (T1w + T2w), sample head decimated by {args.step}, method {args.method}")
        print("workers\tscans\tseconds\tscans_per_hour")
        for workers in args.workers:
            out = Path(scratch) / f"out_{workers}"
            command = ["bids", str(bids), str(out), "participant", "--method", args.method, "--workers", str(workers),
                       "--device", "cpu", "--no-figures", "--quiet"]
            if not args.compute_brain_masks:
                command += ["--brain-masks", str(masks)]
            started = time.perf_counter()
            status = anonmri(command)
            seconds = time.perf_counter() - started
            scans = 2 * args.subjects
            print(f"{workers}\t{scans}\t{seconds:.1f}\t{3600.0 * scans / seconds:.0f}" + ("" if status == 0 else
                                                                                      f"\t(exit {status})"))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
