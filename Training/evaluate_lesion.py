"""Evaluate lesion-preserving anonymization on held-out patients (paper Tables 3, 4, 5, 7 analogues).

Parts (``--parts``, comma-separated; results are merged into OUT/results.json so parts can run
separately, and the markdown tables/plots are rebuilt from it each time):

* ``reconstruction`` -- Table 3: SSIM / PSNR / MSE of the VAE reconstructions (background region,
  lesion region, whole slice) on held-out slices;
* ``anonymity`` -- Table 7: the PSNR-difference criterion (paper 4.5) for the method (plain and
  with exact lesion voxels) and the 2-D baselines (blur, flip, crop-resize, noise 0.1 / 0.5):
  rate of anonymized slices and mean PSNR(x^_i, x_i). x_j, the "image from another patient", is
  chosen among the held-out patients other than i's, each represented by its slice closest in
  depth D to x_i (anatomically comparable), as (1) ``random``: one of them drawn with a fixed seed
  (the paper's plain reading; primary figure), (2) ``nearest_to_original``: the one most similar
  to x_i (lowest MSE to x_i), (3) ``nearest_to_anonymized``: the one most similar to x^_i -- the
  re-identification attacker's best impostor (Yoon et al.'s min over other samples). Choosing the
  nearest x_j *lowers* the score (the impostor is closer), so (3) is the most lenient and a far
  x_j would be stricter; there is no "strictest" sensible choice, hence all three are reported.
  Rows: the method with ``--candidates`` background draws (source repulsion with the pipeline's
  default typicality filter), with exact lesion voxels, with plain sampling (1 draw), the baselines, and a
  reference "ideal sampler of this population": a real slice of a random *training* patient at
  the closest depth with x_i's lesion pasted in (what a perfect generative model of the data,
  blind to x_i's background, would produce). With the data card beside ``--data`` the failure
  analysis groups slices by base head (generated patient p is made from head p mod #heads):
  how often x^ is nearest to x_i's own base head, and the rates by whether x_j shares it;
* ``utility`` -- Tables 4 and 5: binary tumour segmentation (MONAI UNet (16-32-64), Dice+BCE, Adam lr 3e-3, mIoU = mean of tumour
  and background IoU over test pixels) and grade classification (MONAI ResNet18, 2-D, width 1/4
  for CPU) trained on real / anonymized / mixed (half real + half anonymized, other patients) /
  half-real sets of ``--utility-patients`` training patients, tested on held-out real slices; also
  on the anonymized set with the lesion pixels copied from the input (``--exact-lesion``).

    python Training/evaluate_lesion.py --data slices_64.npz --weights AnonMRILib/weights \\
        --out docs/evaluation/lesion --steps 10 --parts reconstruction,anonymity,utility

The committed report (about 14 min on 2 cores; data from ``Training/make_lesion_slices.py``, the
pyradiomics 3.0.1 source archive unpacked in PYRAD, the ROBEX reference volumes in ROBEX)::

    python Training/evaluate_lesion.py --data /work/runs/lesion/slices_v2_64.npz --out docs/evaluation/lesion \\
        --steps 10 --parts reconstruction,anonymity,utility,real_case --threads 2 --utility-patients 60 \\
        --classification-steps 300 --real-image PYRAD/data/brain1_image.nrrd \\
        --real-label PYRAD/data/brain1_label.nrrd
"""
import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_lesion_vae import load_split  # noqa: E402

from AnonMRILib.evaluation.tumour_segmentation import (PAPER_PATH_SEGMENTER, train_tumour_segmenter,  # noqa: E402
                                                       tumour_iou)


# --- anonymity ---------------------------------------------------------------------------------------------
def other_patient_candidates(depths: np.ndarray, patients: np.ndarray):
    """For each slice i, the indices of one slice per other patient (the one nearest in depth)."""
    unique = np.unique(patients)
    by_patient = {p: np.flatnonzero(patients == p) for p in unique}
    candidates = []
    for index in range(len(depths)):
        row = []
        for patient, members in by_patient.items():
            if patient == patients[index]:
                continue
            row.append(members[np.argmin(np.abs(depths[members] - depths[index]))])
        candidates.append(np.array(row))
    return candidates


def choose_others(originals: np.ndarray, candidates, seed: int):
    """{rule: (N,) index of x_j} for the rules 'random' and 'nearest_to_original'."""
    rng = np.random.default_rng(seed)
    chosen = {"random": [], "nearest_to_original": []}
    for index, row in enumerate(candidates):
        chosen["random"].append(row[rng.integers(len(row))])
        distances = ((originals[row] - originals[index]) ** 2).mean(axis=(1, 2))
        chosen["nearest_to_original"].append(row[np.argmin(distances)])
    return {rule: np.array(values) for rule, values in chosen.items()}


def population_reference(train, test, seed: int) -> np.ndarray:
    """An ideal sampler of the population, blind to x_i's background: for each test slice, the slice
    closest in depth of a random training patient, with the test slice's lesion pixels pasted in."""
    rng = np.random.default_rng(seed)
    patients = np.unique(train.patients)
    by_patient = {p: np.flatnonzero(train.patients == p) for p in patients}
    out = np.empty_like(test.images)
    for index in range(len(test)):
        members = by_patient[patients[rng.integers(len(patients))]]
        source = train.images[members[np.argmin(np.abs(train.depths[members] - test.depths[index]))]]
        out[index] = np.where(test.masks[index] > 0, test.images[index], source)
    return out


def base_heads(data_path: Path, patients: np.ndarray):
    """Base-head index per slice (generated patient p is made from head p mod #heads, see
    make_synthetic_lesion_slices), from the data card beside the .npz; None without one."""
    card = Path(data_path).with_suffix(".json")
    heads = json.loads(card.read_text()).get("heads") if card.is_file() else None
    return np.asarray(patients) % len(heads) if heads else None


def head_analysis(anonymized: np.ndarray, originals: np.ndarray, heads: np.ndarray, candidates, other) -> dict:
    """Failure analysis by base head for one method: x^'s nearest head (lowest mean MSE to the
    candidates x_j of each head), how often it is x_i's own, and the rate (random x_j) by group."""
    from AnonMRILib.evaluation.anonymity import DEFAULT_THRESHOLD_DB, anonymity_score

    passed = np.asarray(anonymity_score(anonymized, originals, originals[other])) <= DEFAULT_THRESHOLD_DB
    nearest = np.empty(len(anonymized), dtype=int)
    for index, row in enumerate(candidates):
        distances = ((originals[row] - anonymized[index]) ** 2).mean(axis=(1, 2))
        per_head = {h: distances[heads[row] == h].mean() for h in np.unique(heads[row])}
        nearest[index] = min(per_head, key=per_head.get)
    own = nearest == heads
    same_j = heads[other] == heads
    groups = {"x_j_same_head": same_j, "x_j_other_head": ~same_j, "own_head_drawn_x_j_other_head": own & ~same_j,
              "other_head_drawn_x_j_other_head": ~own & ~same_j}
    result = {"nearest_head_is_own": float(own.mean()),
              "nearest_head_histogram": np.bincount(nearest, minlength=int(heads.max()) + 1).tolist()}
    for name, members in groups.items():
        result[f"fraction_{name}"] = float(members.mean())
        result[f"rate_{name}"] = float(passed[members].mean()) if members.any() else None
    return result


def realism_proxies(anonymized: np.ndarray, originals: np.ndarray, foreground: float = 0.05) -> dict:
    """Whether a method passes the criterion by shrinking or darkening the brain: per slice, the
    foreground area (pixels above ``foreground``) and mean foreground intensity of x^ relative to
    x_i's; medians, and the fraction of slices below 60 % of x_i's area."""
    def area_and_brightness(images):
        mask = images > foreground
        area = mask.sum(axis=(1, 2)).astype(np.float64)
        return area, (images * mask).sum(axis=(1, 2)) / np.maximum(area, 1.0)

    area, brightness = area_and_brightness(anonymized)
    area_source, brightness_source = area_and_brightness(originals)
    area_ratio = area / np.maximum(area_source, 1.0)
    return {"median_area_ratio": float(np.median(area_ratio)), "fraction_area_below_60": float(np.mean(area_ratio < 0.6)),
            "median_brightness_ratio": float(np.median(brightness / np.maximum(brightness_source, 1e-6)))}


def anonymity_rows(name: str, anonymized: np.ndarray, originals: np.ndarray, candidates, others,
                   patients: np.ndarray = None) -> dict:
    """One table row: anonymity rates for each x_j rule, the realism proxies, and the realism guard
    (:mod:`AnonMRILib.evaluation.realism`: sharpness and area ratios per slice and per patient
    volume, and the "anonymized and realistic" rate with the random x_j)."""
    from AnonMRILib.evaluation.anonymity import DEFAULT_THRESHOLD_DB, anonymity_score, is_anonymized
    from AnonMRILib.evaluation.image_metrics import psnr
    from AnonMRILib.evaluation.realism import realism_summary

    row = {"method": name, "mean_psnr_to_original_db": float(np.mean(np.minimum(psnr(anonymized, originals), 100.0))),
           **realism_proxies(anonymized, originals)}
    nearest_anon = np.array([c[np.argmin(((originals[c] - anonymized[i]) ** 2).mean(axis=(1, 2)))]
                             for i, c in enumerate(candidates)])
    passed_random = None
    for rule, index in list(others.items()) + [("nearest_to_anonymized", nearest_anon)]:
        scores = np.asarray(anonymity_score(anonymized, originals, originals[index]))
        passed = is_anonymized(scores, DEFAULT_THRESHOLD_DB)
        passed_random = passed if rule == "random" else passed_random
        row[f"rate_{rule}"] = float(np.mean(passed))
        row[f"median_score_{rule}_paper_db"] = float(np.median(2 * scores))  # paper's 20 log10 convention
    guard = realism_summary(anonymized, originals, anonymized=passed_random, groups=patients)
    guard["brain_area_ratio_guard"] = guard.pop("median_area_ratio")
    row.update(guard)
    return row


# --- utility -----------------------------------------------------------------------------------------------
#: the utility segmenter (:mod:`AnonMRILib.evaluation.tumour_segmentation`) on this path's 64 x 64 slices
SEGMENTATION_LEARNING_RATE = PAPER_PATH_SEGMENTER.learning_rate


def train_classifier(images, grades, steps: int, seed: int, batch: int = 32):
    import torch
    from monai.networks.nets import resnet18

    torch.manual_seed(seed)
    model = resnet18(spatial_dims=2, n_input_channels=1, num_classes=2, widen_factor=0.25)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.from_numpy(images[:, None].astype(np.float32))
    y = torch.from_numpy(grades.astype(np.int64))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        index = torch.randint(0, len(x), (min(batch, len(x)),), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x[index]), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def classification_accuracy(model, images, grades) -> float:
    import torch

    with torch.no_grad():
        logits = torch.cat([model(torch.from_numpy(images[i:i + 128, None].astype(np.float32)))
                            for i in range(0, len(images), 128)])
    return float((logits.argmax(1).numpy() == grades).mean())


# --- report ------------------------------------------------------------------------------------------------
def fmt(value, digits=2, percent=False):
    if value is None:
        return "-"
    return f"{100 * value:.{digits}f}%" if percent else f"{value:.{digits}f}"


def write_report(out: Path, results: dict) -> None:
    lines = ["# Lesion-preserving anonymization: evaluation", "",
             "Generated by `Training/evaluate_lesion.py` (numbers below are measured, not copied from the paper).", ""]
    setup = results.get("setup", {})
    if setup:
        lines += ["## Setup", "", "```json", json.dumps(setup, indent=2), "```", ""]
    rec = results.get("reconstruction")
    if rec:
        lines += ["## Table 3 analogue: VAE reconstruction on held-out slices", "",
                  f"{rec['slices']} slices of {rec['patients']} held-out patients, {rec['image_size']}x{rec['image_size']} px; "
                  "background = x(1-M) and lesion = xM are whole-slice images (zero outside their region), as in the paper's Fig. 1.", "",
                  "| region | SSIM | PSNR (dB) | MSE |", "|---|---|---|---|"]
        for region in ("background", "lesion", "whole"):
            m = rec[region]
            lines.append(f"| {region} | {fmt(m['ssim'], 4)} | {fmt(m['psnr'])} | {m['mse']:.5f} |")
        lines.append("")
    anon = results.get("anonymity")
    if anon:
        lines += ["## Table 7 analogue: anonymity criterion on held-out patients", "",
                  f"{anon['slices']} slices of {anon['patients']} held-out patients; threshold: MSE(x^,x_j)/MSE(x^,x_i) <= "
                  f"0.7/0.3, i.e. 20 log10 ratio <= 7.36 (paper's convention) = 3.68 dB as a standard PSNR difference. "
                  f"Sampler: {anon['sampler']}, {anon['steps']} steps, seed {anon['seed']}; ours keeps, of "
                  f"{anon.get('candidates', 1)} background draws, the typical one least like x_i outside the lesion "
                  f"(source repulsion, `SourceRepulsionConfig`). Paper's goal: 86 %.", "",
                  "| method | rate (x_j random other patient) | rate (x_j nearest to x_i) | rate (x_j nearest to x^_i) "
                  "| mean PSNR(x^_i, x_i) dB | median Anony (paper dB, random x_j) | brain area x^/x_i (median; < 60 %) "
                  "| brightness x^/x_i (median) |", "|---|---|---|---|---|---|---|---|"]
        for row in anon["rows"]:
            lines.append(f"| {row['method']} | {fmt(row['rate_random'], 1, True)} | {fmt(row['rate_nearest_to_original'], 1, True)} "
                         f"| {fmt(row['rate_nearest_to_anonymized'], 1, True)} | {fmt(row['mean_psnr_to_original_db'])} "
                         f"| {fmt(row['median_score_random_paper_db'])} | {fmt(row.get('median_area_ratio'))}; "
                         f"{fmt(row.get('fraction_area_below_60'), 1, True)} | {fmt(row.get('median_brightness_ratio'))} |")
        lines += ["", "Brain area and brightness: foreground (> 0.05) pixel count and mean foreground intensity of x^ "
                  "relative to x_i; a method that shrinks or darkens the brain moves away from every real slice and "
                  "passes the criterion without anonymizing anything."]
        if "median_sharpness_ratio" in anon["rows"][0]:
            lines += ["", "### Realism guard (anonymity counts only for realistic outputs)", "",
                      "Sharpness ratio = mean in-plane gradient magnitude inside the brain interior (foreground eroded "
                      "by 2 px), x^ / x_i (`AnonMRILib.evaluation.realism`); realistic = sharpness ratio in "
                      "[0.8, 1.25] and brain-area ratio in [0.6, 1.67]. Per volume = the ratio pooled over each "
                      "patient's slices, median over patients. An output blurrier than its input does not count as "
                      "anonymized.", "",
                      "| method | rate (random x_j) | sharpness ratio (median per slice) | slices with sharpness ratio "
                      ">= 0.8 | sharpness ratio (median per volume) | brain-area ratio (median per slice / per volume) "
                      "| realistic slices | **anonymized and realistic** |", "|---|---|---|---|---|---|---|---|"]
            for row in anon["rows"]:
                lines.append(f"| {row['method']} | {fmt(row['rate_random'], 1, True)} | {fmt(row['median_sharpness_ratio'])} "
                             f"| {fmt(row['fraction_sharpness_ok'], 1, True)} | {fmt(row.get('median_volume_sharpness_ratio'))} "
                             f"| {fmt(row['brain_area_ratio_guard'])} / {fmt(row.get('median_volume_area_ratio'))} "
                             f"| {fmt(row['fraction_realistic'], 1, True)} "
                             f"| **{fmt(row['rate_anonymized_and_realistic'], 1, True)}** |")
        lines += ["", f"Lesion latent unchanged (checked on every slice): {anon['lesion_latent_checked']}; "
                  f"lesion voxels bit-exact with exact_lesion: {anon['exact_lesion_bit_exact']}; "
                  f"lesion-region PSNR of ours without exact lesion: {fmt(anon['lesion_region_psnr_db'])} dB.", ""]
        heads = anon.get("head_analysis")
        if heads:
            lines += ["### Failure analysis by base head (random x_j)", "",
                      "Generated patient p is made from base head p mod 4. x^'s nearest head = the head whose other "
                      "held-out patients (slice closest in depth) have the lowest mean MSE to x^; a real slice is "
                      f"nearest to its own head for {fmt(anon.get('real_nearest_head_is_own'), 1, True)} of the slices.", "",
                      "| method | x^ nearest to x_i's head | nearest-head histogram | rate, x_j same head "
                      "| rate, x_j other head | x_i's head drawn, x_j other head: share / rate "
                      "| other head drawn, x_j other head: share / rate |", "|---|---|---|---|---|---|---|"]
            for name, h in heads.items():
                lines.append(f"| {name} | {fmt(h['nearest_head_is_own'], 1, True)} | {h['nearest_head_histogram']} "
                             f"| {fmt(h['rate_x_j_same_head'], 1, True)} | {fmt(h['rate_x_j_other_head'], 1, True)} "
                             f"| {fmt(h['fraction_own_head_drawn_x_j_other_head'], 1, True)} / "
                             f"{fmt(h['rate_own_head_drawn_x_j_other_head'], 1, True)} "
                             f"| {fmt(h['fraction_other_head_drawn_x_j_other_head'], 1, True)} / "
                             f"{fmt(h['rate_other_head_drawn_x_j_other_head'], 1, True)} |")
            lines.append("")
    util = results.get("utility")
    if util:
        lines += ["## Tables 4 and 5 analogues: downstream utility (tested on held-out real slices)", "",
                  f"{util['patients']} training patients; segmentation {util['segmentation_steps']} steps "
                  f"(Adam lr {util.get('segmentation_learning_rate', 1e-3):g}), "
                  f"classification {util['classification_steps']} steps, batch 32, same seed for every set.", "",
                  "| training set | slices | segmentation mIoU | tumour IoU | slices (lesion) | grade accuracy |",
                  "|---|---|---|---|---|---|"]
        for row in util["rows"]:
            lines.append(f"| {row['set']} | {row['segmentation_slices']} | {fmt(row['miou'], 1, True)} | "
                         f"{fmt(row['iou_tumour'], 1, True)} | {row['classification_slices']} | {fmt(row['accuracy'], 1, True)} |")
        lines.append("")
        if "majority_class_accuracy" in util:
            lines += [f"Majority-class accuracy on the test lesion slices: {fmt(util['majority_class_accuracy'], 1, True)}.", ""]
        if all(row["iou_tumour"] < 0.05 for row in util["rows"]):
            lines += ["**The segmentation networks did not converge within this CPU step budget for any training set "
                      "(tumour IoU about 0; mIoU about 49 % is the background class alone), so the segmentation rows "
                      "support no conclusion.** Rerun with more `--segmentation-steps` on a GPU.", ""]
    real = results.get("real_case")
    if real and "runs" in real:
        timing = real["timing_155_slices"]
        lines += ["## Whole-head real case (pyradiomics brain1: post-contrast T1 with skull and face, labelled lesion)", "",
                  f"{real['image']}, {real['shape']} voxels of {real['spacing_mm']} mm, detected as `{real['input_kind']}`; "
                  f"brain mask `{real['brain_mask_backend']}` ({real['brain_mask_seconds']} s); {real['lesion_voxels']} "
                  f"lesion voxels; exact lesion on; {real.get('threads')} torch threads. Head outline Dice = Otsu head "
                  "mask of the output vs the input's; sharpness ratio = mean in-plane gradient magnitude inside the "
                  "brain (outside the lesion, eroded 2 px), output / input, pooled over the volume and median per slice.", "",
                  "| face method | head outline Dice | sharpness ratio (volume / median slice) | lesion bit-exact "
                  "| changed inside brain / outside | seconds (without brain mask) |", "|---|---|---|---|---|---|"]
        for name, run in real["runs"].items():
            if "error" in run:
                lines.append(f"| {name} | not run: {run['error']} | | | | |")
                continue
            lines.append(f"| {name} | {fmt(run['head_outline_dice'], 3)} | {fmt(run['sharpness_ratio_volume'])} / "
                         f"{fmt(run['sharpness_ratio_median_slice'])} | {run['lesion_bit_exact']} "
                         f"| {fmt(run['changed_fraction_inside_brain'], 1, True)} / "
                         f"{fmt(run['changed_fraction_outside_brain'], 1, True)} | {run['seconds_without_brain_mask']} |")
        lines += ["", f"155-slice version (brain1 resampled along S to {timing['shape']}), face method "
                  f"`{timing['face_method']}`: **{timing['seconds_total_with_brain_mask']} s** in total including the "
                  f"brain mask (stages: {timing.get('timings_s')}); head outline Dice {fmt(timing['head_outline_dice'], 3)}, "
                  f"sharpness ratio {fmt(timing['sharpness_ratio_volume'])}, lesion bit-exact {timing['lesion_bit_exact']}.",
                  "", "![real case](real_case.png)", ""]
    elif real:
        lines += ["## Real case (pyradiomics brain1: post-contrast T1 with a labelled lesion)", "",
                  "```json", json.dumps(real, indent=2), "```", "", "![real case](real_case.png)", ""]
    cons = results.get("consistency")
    if cons:
        lines += ["## Consistent volumes: adjacent-slice correlation", "",
                  f"{cons['volumes']} whole held-out generated patients ({cons['slices']} brain slices, 1 mm apart), "
                  f"{cons['candidates']} draws per slice, DDIM {cons['steps']} steps. Correlation of each slice with the "
                  "next over their foreground, mean per volume, then over volumes; ratio = generated / real. "
                  f"Consistency config: `{cons['config']}`.", "",
                  "| generation | adjacent-slice correlation | real volumes | ratio | sharpness ratio (median slice) |",
                  "|---|---|---|---|---|"]
        for name in ("independent", "consistent"):
            c, r = cons[name], cons[f"realism_{name}"]
            lines.append(f"| {name} | {fmt(c['generated'], 3)} | {fmt(c['real'], 3)} | {fmt(c['ratio'], 3)} "
                         f"| {fmt(r['median_sharpness_ratio'])} |")
        lines += ["", "![consistency](consistency.png)", ""]
    lines += ["![examples](examples.png)", "", "![anonymity rates](anonymity_rates.png)", ""]
    (out / "README.md").write_text("\n".join(lines))


def main(argv=None) -> int:
    import torch

    from AnonMRILib.evaluation.image_metrics import psnr, summarize
    from AnonMRILib.evaluation.slice_baselines import SLICE_BASELINES
    from AnonMRILib.pipelines.lesion import SourceRepulsionConfig, anonymize_lesion_slices, load_lesion_models

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--weights", type=Path, default=None, help="folder with the two weights files")
    parser.add_argument("--out", type=Path, default=REPO / "docs/evaluation/lesion")
    parser.add_argument("--parts", default="reconstruction,anonymity,utility")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--candidates", type=int, default=SourceRepulsionConfig.candidates,
                        help="background draws per slice for source repulsion (1 = plain sampling)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--test-fraction", type=float, default=0.2)
    parser.add_argument("--max-test-slices", type=int, default=None)
    parser.add_argument("--utility-patients", type=int, default=40)
    parser.add_argument("--segmentation-steps", type=int, default=1200)
    parser.add_argument("--segmentation-learning-rate", type=float, default=SEGMENTATION_LEARNING_RATE,
                        help="Adam learning rate of the segmentation U-Net")
    parser.add_argument("--classification-steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--real-image", type=Path, default=None,
                        help="part real_case: a real brain MRI with a labelled lesion (e.g. pyradiomics brain1_image.nrrd)")
    parser.add_argument("--real-label", type=Path, default=None, help="its lesion labelmap (brain1_label.nrrd)")
    parser.add_argument("--brain-backend", default="auto", help="real_case: brain-mask backend (default auto = hdbet)")
    parser.add_argument("--face-methods", default="remodel,reface,quickshear,none",
                        help="real_case: face treatments to run outside the brain (comma-separated)")
    parser.add_argument("--data-root", type=Path, default=None,
                        help="consistency: folder with the unpacked head packages (as make_lesion_slices.py)")
    parser.add_argument("--consistency-patients", type=int, default=4, help="consistency: whole volumes to generate")
    parser.add_argument("--timing-face-method", default="remodel", help="real_case: face method of the 155-slice timing run")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    parts = set(args.parts.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    repulsion = SourceRepulsionConfig(candidates=args.candidates)
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}

    models = load_lesion_models(args.weights, "cpu")
    size = models.image_size
    train, test, split = load_split(args.data, args.split_seed, args.test_fraction, size)
    if args.max_test_slices and len(test) > args.max_test_slices:
        test = test.subset(np.sort(np.random.default_rng(args.seed).choice(len(test), args.max_test_slices, replace=False)))
    results["setup"] = {"data": str(args.data), "weights": str(args.weights or "package"), "image_size": size,
                        "train_patients": len(split["train_patients"]), "test_patients": len(split["test_patients"]),
                        "test_slices": len(test), "split_seed": args.split_seed}
    unknown = models.diffusion.config.num_classes
    start = time.time()

    if "reconstruction" in parts:
        with torch.no_grad():
            x = torch.from_numpy(test.images[:, None])
            m = torch.from_numpy(test.masks[:, None].astype(np.float32))
            rec = {k: torch.cat([models.autoencoder.reconstruct(x[i:i + 64], m[i:i + 64])[k] for i in range(0, len(x), 64)])
                   [:, 0].clamp(0, 1).numpy() for k in ("background_hat", "lesion_hat", "whole_hat")}
        results["reconstruction"] = {
            "slices": len(test), "patients": int(len(np.unique(test.patients))), "image_size": size,
            "background": summarize(test.images * (1 - test.masks), rec["background_hat"]),
            "lesion": summarize(test.images * test.masks, rec["lesion_hat"]),
            "whole": summarize(test.images, rec["whole_hat"])}
        print("reconstruction", results["reconstruction"], round(time.time() - start), flush=True)

    if "anonymity" in parts:
        generated, _ = anonymize_lesion_slices(models, test.images, test.masks, test.grades, test.depths,
                                               steps=args.steps, seed=args.seed, return_latents=True,
                                               repulsion=repulsion)
        exact = np.where(test.masks > 0, test.images, generated)
        candidates = other_patient_candidates(test.depths, test.patients)
        others = choose_others(test.images, candidates, args.seed)
        methods = {"latent diffusion (ours)": generated, "latent diffusion + exact lesion": exact}
        if args.candidates > 1:
            methods["latent diffusion, repulsion without sharpness constraint"] = anonymize_lesion_slices(
                models, test.images, test.masks, test.grades, test.depths, steps=args.steps, seed=args.seed,
                repulsion=dataclasses.replace(repulsion, min_sharpness_ratio=0.0))
            methods["latent diffusion, plain sampling (1 draw)"] = anonymize_lesion_slices(
                models, test.images, test.masks, test.grades, test.depths, steps=args.steps, seed=args.seed,
                repulsion=SourceRepulsionConfig(candidates=1))
        methods["reference: random training patient + x_i's lesion"] = population_reference(train, test, args.seed)
        rows = [anonymity_rows(name, images, test.images, candidates, others, test.patients)
                for name, images in methods.items()]
        baseline_images = {}
        for name, function in SLICE_BASELINES.items():
            baseline_images[name] = function(test.images, seed=args.seed)
            rows.append(anonymity_rows(name, baseline_images[name], test.images, candidates, others, test.patients))
        lesion = test.masks > 0
        lesion_psnr = psnr(generated[lesion][None, :, None], test.images[lesion][None, :, None])
        results["anonymity"] = {
            "slices": len(test), "patients": int(len(np.unique(test.patients))), "steps": args.steps, "sampler": "ddim",
            "seed": args.seed, "candidates": args.candidates, "rows": rows, "lesion_latent_checked": True,
            "exact_lesion_bit_exact": bool(np.array_equal(exact[lesion], test.images[lesion])),
            "lesion_region_psnr_db": float(np.atleast_1d(lesion_psnr)[0]),
            "seconds": round(time.time() - start, 1)}
        heads = base_heads(args.data, test.patients)
        if heads is not None and len(np.unique(heads)) > 1:
            results["anonymity"]["head_analysis"] = {
                name: head_analysis(images, test.images, heads, candidates, others["random"])
                for name, images in methods.items() if name != "latent diffusion + exact lesion"}
            results["anonymity"]["real_nearest_head_is_own"] = head_analysis(
                test.images, test.images, heads, candidates, others["random"])["nearest_head_is_own"]
        else:
            results["anonymity"].pop("head_analysis", None)
        print(json.dumps(rows, indent=1), flush=True)
        _plots(args.out, test, generated, exact, baseline_images, rows)

    if "utility" in parts:
        rng = np.random.default_rng(args.seed)
        train_ids = np.array(split["train_patients"])
        chosen = np.sort(rng.choice(train_ids, min(args.utility_patients, len(train_ids)), replace=False))
        half_a, half_b = chosen[: len(chosen) // 2], chosen[len(chosen) // 2:]
        real = train.of_patients(chosen)
        anonymized_images = anonymize_lesion_slices(models, real.images, real.masks, real.grades, real.depths,
                                                    steps=args.steps, seed=args.seed + 1, repulsion=repulsion)
        in_a = np.isin(real.patients, half_a)
        sets = {
            "real": (real.images, real.masks, real.grades),
            "anonymized": (anonymized_images, real.masks, real.grades),
            "anonymized + exact lesion": (np.where(real.masks > 0, real.images, anonymized_images), real.masks,
                                          real.grades),
            "mixed (half real + half anonymized)": (np.where(in_a[:, None, None], real.images, anonymized_images),
                                                   real.masks, real.grades),
            "half real": (real.images[in_a], real.masks[in_a], real.grades[in_a]),
        }
        test_lesion = test.with_lesion()
        rows = []
        for name, (images, masks, grades) in sets.items():
            segmenter = dataclasses.replace(PAPER_PATH_SEGMENTER, steps=args.segmentation_steps,
                                            learning_rate=args.segmentation_learning_rate)
            seg = tumour_iou(train_tumour_segmenter(images, masks, segmenter, args.seed), test.images, test.masks)
            has_lesion = masks.reshape(len(masks), -1).any(1)
            classifier = train_classifier(images[has_lesion], grades[has_lesion], args.classification_steps, args.seed)
            accuracy = classification_accuracy(classifier, test_lesion.images, test_lesion.grades)
            rows.append({"set": name, "segmentation_slices": int(len(images)), **seg,
                         "classification_slices": int(has_lesion.sum()), "accuracy": accuracy})
            print(rows[-1], round(time.time() - start), flush=True)
        results["utility"] = {"majority_class_accuracy": float(max(np.mean(test_lesion.grades == g) for g in (0, 1))),
                              "patients": int(len(chosen)), "segmentation_steps": args.segmentation_steps,
                              "segmentation_learning_rate": args.segmentation_learning_rate,
                              "classification_steps": args.classification_steps, "rows": rows,
                              "seconds": round(time.time() - start, 1)}

    if "real_case" in parts:
        results["real_case"] = real_case(args, models, repulsion)

    if "consistency" in parts:
        results["consistency"] = consistency(args, models, repulsion)

    results_path.write_text(json.dumps(results, indent=2))
    write_report(args.out, results)
    print(f"wrote {results_path} and {args.out / 'README.md'}", flush=True)
    return 0


def generated_volumes(args, size: int):
    """Whole synthetic patients (co-registered like the training data, patient ids 10**6 + p so none
    is a training patient) from the heads under ``--data-root``: [(image, labels, brain)] (S, S, 155)."""
    from make_lesion_slices import default_heads

    from AnonMRILib.datasets.synthetic_lesions import (SubjectVariationConfig, coregistration_target_mm, head_frame,
                                                       load_base_heads, synthesize_patient)

    if args.data_root is None:
        raise SystemExit("--parts consistency needs --data-root (the unpacked head packages)")
    specs, atlas, atlas_mask = default_heads(args.data_root)
    heads = load_base_heads(specs, atlas, atlas_mask)
    target = coregistration_target_mm(heads)
    volumes = []
    for patient in range(args.consistency_patients):
        rng = np.random.default_rng([args.seed, 10 ** 6 + patient])
        head = heads[patient % len(heads)]
        volumes.append(synthesize_patient(head, rng, size, patient % 2, SubjectVariationConfig(),
                                          head_frame(head, target)))
    return volumes


def consistency(args, models, repulsion) -> dict:
    """Adjacent-slice correlation of generated volumes (independent slices, the paper's way, vs
    :class:`VolumeConsistencyConfig`) against the real volumes, on whole held-out synthetic patients."""
    from AnonMRILib.evaluation.realism import realism_summary
    from AnonMRILib.evaluation.volume_consistency import consistency_summary
    from AnonMRILib.pipelines.lesion import VolumeConsistencyConfig, anonymize_lesion_slices

    start = time.time()
    size = models.image_size
    real, independent, consistent = [], [], []
    config = VolumeConsistencyConfig()
    for index, (image, labels, brain) in enumerate(generated_volumes(args, size)):
        present = np.flatnonzero(brain.sum(axis=(0, 1)) >= 0.05 * size * size)
        images = np.moveaxis(image[:, :, present], -1, 0)
        masks = np.moveaxis(labels[:, :, present] > 0, -1, 0).astype(np.uint8)
        grades = np.full(len(present), index % 2)
        depths = present / 154.0
        common = dict(steps=args.steps, seed=args.seed + index, repulsion=repulsion)
        real.append(images)
        independent.append(anonymize_lesion_slices(models, images, masks, grades, depths, **common))
        consistent.append(anonymize_lesion_slices(models, images, masks, grades, depths, **common,
                                                  positions_mm=present.astype(float), consistency=config))
        print(f"consistency volume {index}: {len(present)} slices, {round(time.time() - start)} s", flush=True)
    stack = lambda volumes: np.concatenate(volumes)  # noqa: E731
    patients = np.concatenate([np.full(len(v), i) for i, v in enumerate(real)])
    result = {"volumes": len(real), "slices": int(sum(len(v) for v in real)), "config": dataclasses.asdict(config), "steps": args.steps, "candidates": repulsion.candidates,
              "independent": consistency_summary(independent, real), "consistent": consistency_summary(consistent, real),
              "realism_independent": realism_summary(stack(independent), stack(real), groups=patients),
              "realism_consistent": realism_summary(stack(consistent), stack(real), groups=patients),
              "seconds": round(time.time() - start, 1), "figure": "consistency.png"}
    _consistency_figure(args.out / "consistency.png", real[0], independent[0], consistent[0])
    print("consistency", json.dumps({k: result[k] for k in ("independent", "consistent")}), flush=True)
    return result


def _consistency_figure(path: Path, real, independent, consistent) -> None:
    """Coronal reformats (through the middle) of one volume: real, independent slices, consistent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    column = real.shape[2] // 2
    figure, axes = plt.subplots(1, 3, figsize=(8, 2.6))
    for axis, (title, volume) in zip(axes, (("real", real), ("independent slices (paper)", independent),
                                            ("consistent (neighbour-conditioned)", consistent))):
        axis.imshow(volume[:, :, column], cmap="gray", origin="lower", vmin=0, vmax=1, aspect="auto")
        axis.set_title(title, fontsize=8)
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def resample_slices(volume, count: int, order: int):
    """``volume`` resampled along its most-superior voxel axis to ``count`` slices covering the same
    extent (spline ``order``; 0 for labels): a longer scan of the same head, for timing."""
    from scipy import ndimage

    from AnonMRILib.pipelines.lesion import axial_layout

    (_, _, axis), _ = axial_layout(volume.affine)
    n = volume.shape[axis]
    zoom = [1.0, 1.0, 1.0]
    zoom[axis] = count / n
    array = ndimage.zoom(volume.array.astype(np.float32), zoom, order=order, grid_mode=True, mode="nearest")
    affine = volume.affine.copy()
    affine[:3, axis] *= n / count
    affine[:3, 3] += volume.affine[:3, axis] * (-0.5 + 0.5 * n / count)  # same extent, voxel centres moved
    return type(volume)(np.round(array).astype(volume.dtype) if np.issubdtype(volume.dtype, np.integer)
                        else array.astype(volume.dtype), affine)


def head_metrics(image, output, brain, lesion) -> dict:
    """Head outline Dice (Otsu head mask of output vs input), sharpness ratio inside the brain
    (outside the lesion; per volume pooled, and the median over slices), lesion bit-exactness."""
    from AnonMRILib.evaluation.realism import sharpness_ratio, volume_ratios
    from AnonMRILib.pipelines.lesion import axial_layout, to_ras_layout
    from AnonMRILib.transforms.head_mask import head_mask_array

    head_in, head_out = head_mask_array(image.array), head_mask_array(output.array)
    dice = 2.0 * (head_in & head_out).sum() / max(head_in.sum() + head_out.sum(), 1)
    order, flips = axial_layout(image.affine)
    as_slices = lambda a: np.moveaxis(to_ras_layout(np.asarray(a), order, flips), -1, 0)  # noqa: E731
    region = as_slices(brain & ~lesion)
    keep = region.reshape(len(region), -1).sum(1) > 50
    scale = float(np.percentile(image.array[brain], 99.5)) or 1.0
    ours, theirs = as_slices(output.array)[keep] / scale, as_slices(image.array)[keep] / scale
    per_slice = [volume_ratios(o[None], t[None], region=r[None])["sharpness_ratio"] for o, t, r in zip(ours, theirs, region[keep])]
    return {"head_outline_dice": round(float(dice), 4),
            "sharpness_ratio_volume": round(volume_ratios(ours, theirs, region=region[keep])["sharpness_ratio"], 3),
            "sharpness_ratio_median_slice": round(float(np.nanmedian(per_slice)), 3),
            "lesion_bit_exact": bool(np.array_equal(output.array[lesion], image.array[lesion])),
            "changed_fraction_inside_brain": round(float((output.array != image.array)[brain & ~lesion].mean()), 4),
            "changed_fraction_outside_brain": round(float((output.array != image.array)[~brain].mean()), 4)}


def real_case(args, models, repulsion) -> dict:
    """A real whole-head scan with a labelled lesion (pyradiomics brain1: post-contrast T1 with skull
    and face, 0.78 x 0.78 x 6.5 mm) end to end: brain mask, brain regenerated with exact lesion,
    each face method of ``--face-methods`` outside; head outline Dice, sharpness ratio, times; the
    same without appearance matching (the previous behaviour's smooth brain); a 155-slice version
    (resampled along S) for the time target; the before/after figure."""
    from AnonMRILib.io import load_volume
    from AnonMRILib.pipelines.lesion import LesionAnonymizationConfig, anonymize_lesions_with_details
    from AnonMRILib.transforms.brain_mask import resolve_brain_mask

    image = load_volume(args.real_image)
    label = load_volume(args.real_label)
    lesion = label.array != 0
    start = time.time()
    mask = resolve_brain_mask(image, backend=args.brain_backend)
    mask_seconds = time.time() - start
    brain = (mask.array != 0) | lesion
    runs, outputs = {}, {}
    variants = [(method, True) for method in args.face_methods.split(",")] + [("none", False)]
    for method, matched in variants:
        name = method if matched else "none, no appearance matching (previous smooth brain)"
        config = LesionAnonymizationConfig(steps=args.steps, exact_lesion=True, repulsion=repulsion, face_method=method,
                                           match_appearance=matched)
        start = time.time()
        import warnings

        from AnonMRILib.errors import InputError

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                output, details = anonymize_lesions_with_details(image, label, config, weights=models, seed=args.seed,
                                                                 brain_mask=mask)
        except InputError as error:  # e.g. a face method this version does not have
            runs[name] = {"error": str(error)}
            print(name, runs[name], flush=True)
            continue
        runs[name] = {"seconds_without_brain_mask": round(time.time() - start, 1), **details,
                      **head_metrics(image, output, brain, lesion)}
        outputs[name] = output
        print(name, runs[name], flush=True)
    long_image, long_label = resample_slices(image, 155, 1), resample_slices(label, 155, 0)
    config = LesionAnonymizationConfig(steps=args.steps, exact_lesion=True, repulsion=repulsion,
                                       face_method=args.timing_face_method)
    start = time.time()
    long_mask = resolve_brain_mask(long_image, backend=args.brain_backend)
    long_output, long_details = anonymize_lesions_with_details(long_image, long_label, config, weights=models,
                                                               seed=args.seed, brain_mask=long_mask)
    timing = {"shape": list(long_image.shape), "face_method": args.timing_face_method,
              "seconds_total_with_brain_mask": round(time.time() - start, 1), **long_details,
              **head_metrics(long_image, long_output, (long_mask.array != 0) | (long_label.array != 0),
                             long_label.array != 0)}
    print("155 slices", timing, flush=True)
    _real_case_figure(args.out / "real_case.png", image, lesion, outputs)
    return {"image": Path(args.real_image).name, "shape": list(image.shape),
            "spacing_mm": [round(float(s), 3) for s in image.spacing], "input_kind": runs[variants[0][0]]["input_kind"],
            "brain_mask_backend": args.brain_backend, "brain_mask_seconds": round(mask_seconds, 1),
            "lesion_voxels": int(lesion.sum()), "runs": runs, "timing_155_slices": timing,
            "figure": "real_case.png", "threads": torch_threads()}


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _real_case_figure(path: Path, image, lesion, outputs) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = int(np.argmax(lesion.sum(axis=(0, 1))))
    columns = [("input (whole head)", image.array)] + [(name, out.array) for name, out in outputs.items()]
    figure, axes = plt.subplots(1, len(columns), figsize=(2.6 * len(columns), 2.9))
    vmax = float(np.percentile(image.array, 99.5))
    for axis, (title, data) in zip(np.atleast_1d(axes), columns):
        axis.imshow(np.asarray(data[:, :, k], dtype=float).T, cmap="gray", origin="lower", vmin=0, vmax=vmax)
        axis.contour(lesion[:, :, k].T, levels=[0.5], colors="r", linewidths=0.4)
        axis.set_title(title if len(title) < 30 else title.replace(", ", ",\n"), fontsize=7)
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _plots(out: Path, test, generated, exact, baselines, rows) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lesion_slices = np.flatnonzero(test.masks.reshape(len(test), -1).sum(1) > 20)
    picks = lesion_slices[np.linspace(0, len(lesion_slices) - 1, 4).astype(int)] if len(lesion_slices) >= 4 else \
        np.arange(min(4, len(test)))
    columns = [("original", test.images), ("lesion mask", test.masks.astype(np.float32)), ("ours", generated),
               ("ours + exact lesion", exact)] + [(name, images) for name, images in baselines.items()]
    figure, axes = plt.subplots(len(picks), len(columns), figsize=(1.6 * len(columns), 1.7 * len(picks)))
    axes = np.atleast_2d(axes)
    for r, index in enumerate(picks):
        for c, (title, images) in enumerate(columns):
            axes[r, c].imshow(images[index].T, cmap="gray", origin="lower", vmin=0, vmax=1)
            axes[r, c].axis("off")
            if r == 0:
                axes[r, c].set_title(title, fontsize=7)
    figure.tight_layout()
    figure.savefig(out / "examples.png", dpi=80)
    plt.close(figure)
    figure, axis = plt.subplots(figsize=(7, 3))
    names = [row["method"] for row in rows]
    axis.barh(names, [100 * row["rate_random"] for row in rows], color="tab:blue")
    axis.axvline(86, color="tab:red", linestyle="--", label="paper: 86 %")
    axis.set_xlabel("anonymized slices (%), x_j = random other held-out patient")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out / "anonymity_rates.png", dpi=80)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
