"""Benchmark: lesion-preserving anonymization of a whole-head scan resampled to 155 slices.

The input (e.g. pyradiomics brain1, post-contrast T1 with skull and face, 25 slices of 6.5 mm) is
resampled along its slice axis to ``--slices`` slices (``evaluate_lesion.resample_slices``); the
brain mask (HD-BET) and each configuration are timed separately, wall and process CPU seconds
(the CPU seconds are what the run used, all threads together; wall time grows when other jobs
share the cores). The last lines give, per configuration, the whole run's CPU seconds (brain mask
included): on 2 idle cores the wall time lies between half of them (both cores busy throughout)
and the critical path (mask + generation + write-back, the face treatment running beside the
generation).

    OMP_WAIT_POLICY=PASSIVE python Testing/Benchmarks/benchmark_lesion_head.py \\
        PYRAD/data/brain1_image.nrrd PYRAD/data/brain1_label.nrrd --threads 1
"""
import argparse
import json
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "Training"))


def main(argv=None) -> int:
    import torch

    from evaluate_lesion import resample_slices

    from AnonMRILib.io import load_volume
    from AnonMRILib.pipelines.lesion import (LesionAnonymizationConfig, anonymize_lesions_with_details,
                                             load_lesion_models)
    from AnonMRILib.transforms.brain_mask import resolve_brain_mask

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("image", type=Path)
    parser.add_argument("label", type=Path)
    parser.add_argument("--slices", type=int, default=155)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=None)
    parser.add_argument("--configs", default="remodel,reface,none,none-independent",
                        help="comma-separated: remodel, reface, none (consistent), none-independent, quickshear")
    parser.add_argument("--prior", choices=("donor", "none"), default="donor",
                        help="the brain's generator: donor (default: the placed donor-brain prior and its models) or "
                             "none (the paper's models)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    image = resample_slices(load_volume(args.image), args.slices, 1)
    label = resample_slices(load_volume(args.label), args.slices, 0)
    wall, cpu = time.perf_counter(), time.process_time()
    mask = resolve_brain_mask(image)
    mask_cpu = time.process_time() - cpu
    print(json.dumps({"stage": "brain mask (hdbet)", "wall_s": round(time.perf_counter() - wall, 1),
                      "cpu_s": round(mask_cpu, 1)}), flush=True)
    models = load_lesion_models(None, "cpu", prior=args.prior == "donor")
    from AnonMRILib.pipelines.lesion import SourceRepulsionConfig

    repulsion = SourceRepulsionConfig() if args.candidates is None else SourceRepulsionConfig(candidates=args.candidates)
    known = {"remodel": ("remodel, consistent (default)", dict(face_method="remodel")),
             "reface": ("reface, consistent", dict(face_method="reface")),
             "quickshear": ("quickshear, consistent", dict(face_method="quickshear")),
             "none": ("none, consistent", dict(face_method="none")),
             "none-independent": ("none, independent slices", dict(face_method="none", consistency=None))}
    totals = {}
    for key in args.configs.split(","):
        name, options = known[key]
        config = LesionAnonymizationConfig(exact_lesion=True, repulsion=repulsion, prior=args.prior, **options)
        wall, cpu = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # face method none: the warning is expected here
            _, details = anonymize_lesions_with_details(image, label, config, weights=models, brain_mask=mask)
        seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
        totals[name] = round(mask_cpu + cpu_seconds, 1)
        print(json.dumps({"stage": name, "wall_s": round(seconds, 1), "cpu_s": round(cpu_seconds, 1),
                          "timings_s": details["timings_s"],
                          "face_in_parallel": bool(details.get("face_in_parallel"))}), flush=True)
    print(json.dumps({"whole run CPU seconds (brain mask included)": totals, "torch_threads": args.threads,
                      "candidates": repulsion.candidates, "slices": args.slices, "prior": args.prior}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
