"""Attacks of the privacy evaluation: the Siamese attacker per patient split (and the open recognizer).

See :mod:`AnonMRILib.evaluation.reidentification` for the Siamese protocol and
:mod:`AnonMRILib.evaluation.face_recognition` for the open recognizer.
"""
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .privacy_protocol import CACHE_VERSION, EvaluationConfig, fingerprint

logger = logging.getLogger(__name__)


def method_seed(method: str) -> int:
    """A per-method offset of the random seeds (tie-breaks, distractors, bootstrap) that depends on the
    method's name only, so adding or removing a method leaves every other method's figures unchanged."""
    import zlib

    return zlib.crc32(method.encode("utf-8")) % 100_003


def siamese_model_config(config: EvaluationConfig):
    from ..models.reidentification import SiameseConfig

    return SiameseConfig(image_size=config.attacker_image_size, channels=tuple(config.attacker_channels),
                         embedding_dim=config.attacker_embedding_dim,
                         convs_per_block=config.attacker_convs_per_block)


def attacker_training_config(config: EvaluationConfig, split_index: int):
    from .reidentification import AttackerTrainingConfig

    return AttackerTrainingConfig(steps=config.training_steps, batch_size=config.training_batch_size,
                                  learning_rate=config.learning_rate, margin=config.margin,
                                  max_shift_px=config.max_shift_px, intensity_jitter=config.intensity_jitter,
                                  hard_negatives=config.hard_negatives, seed=config.seed + 1000 * split_index)


def train_or_load_attacker(split_index: int, renderings: np.ndarray, subjects: np.ndarray,
                           config: EvaluationConfig, cache_dir: Path, key: str):
    """The split's attacker, from the cache when its key matches, else trained (and cached)."""
    from .reidentification import train_attacker
    from ..models.reidentification import SiameseNetwork

    path = cache_dir / "attackers" / f"split{split_index:03d}.safetensors"
    if path.is_file() and path.with_suffix(".json").is_file():
        card = json.loads(path.with_suffix(".json").read_text())
        if card.get("cache_key") == key:
            network = SiameseNetwork.load(path, device=torch_device(config))
            return network, card.get("training_loss", [])
    started = time.time()
    network, history = train_attacker(renderings, subjects, siamese_model_config(config),
                                      attacker_training_config(config, split_index), device=torch_device(config))
    network.save(path, card={"cache_key": key, "training_loss": history["loss"],
                             "training": history["config"], "train_seconds": time.time() - started})
    return network, history["loss"]


def torch_device(config: EvaluationConfig) -> str:
    if config.device != "auto":
        return config.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_attacks(records: List[Dict], renderings: Dict[str, np.ndarray], methods: Sequence[str],
                config: EvaluationConfig, cache_dir: Path, population_key: str,
                training_pool: Optional[Tuple[np.ndarray, np.ndarray]] = None):
    """The Siamese attack, per split: train on ORIGINAL renderings, attack held-out subjects.

    Without ``training_pool`` the splits are resampled 80/20 splits of the studied subjects (the
    paper). With ``training_pool = (ORIGINAL renderings, subject ids)`` of further subjects, each
    split trains on a resampled ``1 - test_fraction`` of the pool's subjects and attacks EVERY
    studied subject. Besides the rates over all held-out subjects, ``within_head`` gives the
    5-way rate with distractors drawn from the query's base head only (heads with fewer than
    ``n_options`` held-out subjects are skipped).

    Returns ``(identification, retrieval, losses, attackers, splits, within_head)``.
    """
    from .reidentification import (bootstrap_rate, curve_band, identification_trials, patient_splits,
                                   retrieval_ranks, top_alpha_curve)

    subjects = np.array([r["subject"] for r in records])
    heads = np.array([r["head"] for r in records])
    if training_pool is None:
        splits = patient_splits(subjects, config.n_splits, config.test_fraction, seed=config.seed,
                                min_test_subjects=config.n_options)
        pool_images, pool_subjects = renderings["ORIGINAL"], subjects
    else:
        pool_images, pool_subjects = training_pool
        study = np.array(sorted(set(subjects.tolist())))
        splits = [(train, study) for train, _ in patient_splits(pool_subjects, config.n_splits, config.test_fraction,
                                                                seed=config.seed, min_test_subjects=1)]
    alphas = np.linspace(0.0, 1.0, config.alpha_points)
    trials = {m: [] for m in methods}
    head_trials = {m: [] for m in methods}
    per_split_rate = {m: [] for m in methods}
    curves = {m: [] for m in methods}
    mean_ranks = {m: [] for m in methods}
    losses, attackers = [], []
    for index, (train_subjects, test_subjects) in enumerate(splits):
        train = np.isin(pool_subjects, train_subjects)
        test = np.isin(subjects, test_subjects)
        key = fingerprint([population_key, CACHE_VERSION, asdict(siamese_model_config(config)),
                           asdict(attacker_training_config(config, index)), train_subjects.tolist()])
        logger.info(f"split {index + 1}/{len(splits)}: attacker on {int(train.sum())} ORIGINAL renderings of "
                    f"{len(train_subjects)} subjects; {len(test_subjects)} held-out subjects")
        network, loss = train_or_load_attacker(index, pool_images[train], pool_subjects[train],
                                               config, cache_dir, key)
        losses.append(loss)
        attackers.append((network, train_subjects, test_subjects))
        queries = network.embed(renderings["ORIGINAL"][test])
        for method in methods:
            m_index = method_seed(method)
            options = network.embed(renderings[method][test])
            seed = config.seed + 7919 * index + m_index
            outcome = identification_trials(queries, options, subjects[test], n_options=config.n_options,
                                            repeats=config.identification_repeats,
                                            correct_option=config.correct_option, seed=seed)
            trials[method].append(outcome)
            per_split_rate[method].append(float(outcome.mean()))
            ranks = retrieval_ranks(queries, options, subjects[test], correct_option=config.correct_option,
                                    seed=seed)
            curves[method].append(top_alpha_curve(ranks, alphas))
            mean_ranks[method].append(float(ranks.mean()))
            for head in sorted(set(heads[test].tolist())):
                rows = heads[test] == head
                if len(set(subjects[test][rows].tolist())) >= config.n_options:
                    head_trials[method].append(identification_trials(
                        queries[rows], options[rows], subjects[test][rows], n_options=config.n_options,
                        repeats=config.identification_repeats, correct_option=config.correct_option,
                        seed=seed + 104729))
    identification, within_head = {}, {}
    for method in methods:
        m_index = method_seed(method)
        rate = bootstrap_rate(np.concatenate(trials[method]), config.bootstrap_resamples,
                              seed=config.seed + m_index)
        rate["per_split"] = per_split_rate[method]
        identification[method] = rate
        if head_trials[method]:
            within_head[method] = bootstrap_rate(np.concatenate(head_trials[method]), config.bootstrap_resamples,
                                                 seed=config.seed + m_index)
    retrieval = {"alphas": alphas.tolist(), "n_splits": len(splits),
                 "curves": {m: curve_band(np.stack(curves[m])) for m in methods},
                 "mean_relative_rank": {m: float(np.mean(mean_ranks[m])) for m in methods},
                 "probability_top_10_percent": {
                     m: float(np.mean([c[int(round(0.1 * (len(alphas) - 1)))] for c in curves[m]]))
                     for m in methods}}
    return identification, retrieval, losses, attackers, splits, within_head


# --- the open face recognizer ---------------------------------------------------------------------
def describe_head(views: Sequence[np.ndarray], recognizer) -> Tuple[Optional[np.ndarray], float]:
    """One descriptor of a head from several views, and the best detector score (-inf: no face).

    The mean of the descriptors of every view whose face scores > 0; when none does, the
    descriptor of the best-detected view. (On renderings of one sub01 subject's two scans, 4 views:
    0.10-0.12 apart with the mean, 0.11-0.35 with the best view alone, while different subjects
    are >= 0.37 apart: measured in the development of this module.)
    """
    found = []
    for image in views:
        detection = recognizer.detect(image)
        if detection is not None:
            found.append((detection.score, recognizer.descriptor(image, detection)))
    if not found:
        return None, float("-inf")
    best = max(score for score, _ in found)
    confident = [descriptor for score, descriptor in found if score > 0.0]
    if confident:
        return np.mean(confident, axis=0), best
    return max(found, key=lambda item: item[0])[1], best


def describe_all(views: np.ndarray, recognizer) -> Tuple[np.ndarray, np.ndarray]:
    """Descriptors (N, 128; NaN rows without a face) and best detector scores (N; -inf without a
    face) of N heads' view stacks (N, V, S, S), by :func:`describe_head`."""
    descriptors = np.full((len(views), 128), np.nan)
    scores = np.full(len(views), -np.inf)
    for index, stack in enumerate(views):
        descriptor, score = describe_head(list(stack), recognizer)
        if descriptor is not None:
            descriptors[index], scores[index] = descriptor, score
    return descriptors, scores


def gallery_ranks(probes: np.ndarray, gallery: np.ndarray, probe_subjects: np.ndarray,
                  gallery_subjects: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """1-based rank of each probe's subject in a gallery of one descriptor per subject.

    Distances are Euclidean (dlib's convention); gallery entries without a face (NaN) rank last;
    a probe without a face gets a uniformly random rank (the attacker can only guess); ties
    count against the true entry. ``gallery_subjects`` must be distinct and contain every probe
    subject.
    """
    ranks = np.zeros(len(probes), dtype=np.int64)
    for index, (probe, subject) in enumerate(zip(probes, probe_subjects)):
        true = int(np.flatnonzero(gallery_subjects == subject)[0])
        if not np.all(np.isfinite(probe)):
            ranks[index] = 1 + int(rng.integers(len(gallery)))
            continue
        distances = np.linalg.norm(gallery - probe, axis=1)
        distances[~np.isfinite(distances)] = np.inf
        ranks[index] = 1 + int(np.sum(np.delete(distances, true) <= distances[true]))
    return ranks


def _threshold_at_equal_error(same: np.ndarray, different: np.ndarray) -> Dict[str, float]:
    """The distance threshold (same person below it) where the false-match and false-non-match
    rates are closest, and both rates there."""
    candidates = np.unique(np.concatenate([same, different]))
    if candidates.size == 0 or same.size == 0 or different.size == 0:
        return {"threshold": float("nan"), "false_match_rate": float("nan"), "false_non_match_rate": float("nan")}
    false_match = np.array([np.mean(different <= t) for t in candidates])
    false_non_match = np.array([np.mean(same > t) for t in candidates])
    best = int(np.argmin(np.abs(false_match - false_non_match) + 1e-9 * candidates))
    return {"threshold": float(candidates[best]), "false_match_rate": float(false_match[best]),
            "false_non_match_rate": float(false_non_match[best])}


def _distribution(values: np.ndarray) -> Dict[str, float]:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {"n": 0}
    low, q1, median, q3, high = np.percentile(values, [0, 25, 50, 75, 100])
    return {"n": int(values.size), "mean": float(values.mean()), "min": float(low), "p25": float(q1),
            "median": float(median), "p75": float(q3), "max": float(high)}


def run_open_recognizer(records: List[Dict], views: Dict[str, np.ndarray], methods: Sequence[str],
                        config: EvaluationConfig) -> Dict:
    """Schwarz-style identification by dlib's face recognizer (no training on our data).

    Probe: the method's views of scan ``j`` of a subject (best-detected face); gallery: the
    ORIGINAL descriptor of scan ``(j + 1) mod n_scans`` of every subject (the subject's other
    scan). Top-1 and top-5 rates over all studied subjects and with the gallery restricted to the
    probe's base head ("within head"). Calibration on ORIGINAL renderings: the distances of
    same-subject pairs and of different-subject pairs (same base head / other heads) and the
    equal-error threshold. Bootstrap s.d. over probes.
    """
    from .face_recognition import FaceRecognizer
    from .reidentification import bootstrap_rate

    recognizer = FaceRecognizer(upsample=config.recognizer_upsample)
    subjects = np.array([r["subject"] for r in records])
    heads = np.array([r["head"] for r in records])
    scan_index = np.array([int(r["scan"].rsplit("scan", 1)[1]) for r in records])
    n_scans = int(scan_index.max()) + 1
    described = {}
    for method in methods:
        started = time.time()
        described[method] = describe_all(views[method], recognizer)
        logger.info(f"open recognizer: {method} described in {time.time() - started:.0f} s")
    original = described["ORIGINAL"][0]

    def gallery_of(target_scan: int, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        chosen = np.flatnonzero(rows & (scan_index == target_scan))
        return original[chosen], subjects[chosen]

    result: Dict = {"protocol": (
        "probe: the method's rendering views of scan j of a subject (mean descriptor of the views with a "
        f"detected face, else the best-detected view; {len(config.recognizer_views)} views, "
        f"{config.recognizer_render_size} px); gallery: ORIGINAL renderings "
        "of scan (j+1) mod n_scans of every subject (all subjects, or only the probe's base head); rank by "
        "Euclidean descriptor distance; a probe without a detected face gets a uniformly random rank"),
        "views_azimuth_elevation_deg": [list(v) for v in config.recognizer_views],
        "render_size": config.recognizer_render_size, "methods": {}}
    for method in methods:
        m_index = method_seed(method)
        descriptors, scores = described[method]
        rng = np.random.default_rng(config.seed + 31 * m_index)
        all_ranks, head_ranks = [], []
        for j in range(n_scans):
            probes = scan_index == j
            gallery, gallery_subjects = gallery_of((j + 1) % n_scans, np.ones(len(records), bool))
            all_ranks.append(gallery_ranks(descriptors[probes], gallery, subjects[probes], gallery_subjects, rng))
            for head in sorted(set(heads.tolist())):
                rows = probes & (heads == head)
                gallery, gallery_subjects = gallery_of((j + 1) % n_scans, heads == head)
                head_ranks.append(gallery_ranks(descriptors[rows], gallery, subjects[rows], gallery_subjects, rng))
        all_ranks, head_ranks = np.concatenate(all_ranks), np.concatenate(head_ranks)
        entry = {"detected_fraction": float(np.mean(scores > 0.0)),
                 "any_detection_fraction": float(np.mean(np.isfinite(scores))),
                 "median_detector_score": float(np.median(scores)) if np.isfinite(np.median(scores)) else None}
        for name, ranks in (("all", all_ranks), ("within_head", head_ranks)):
            for k in (1, 5):
                rate = bootstrap_rate(ranks <= k, config.bootstrap_resamples, seed=config.seed + m_index)
                entry[f"top{k}_{name}"] = rate["mean"]
                entry[f"top{k}_{name}_sd"] = rate["sd"]
            entry[f"n_probes_{name}"] = int(ranks.size)
            entry[f"gallery_size_{name}"] = (len(set(subjects.tolist())) if name == "all" else
                                             {h: len(set(subjects[heads == h].tolist())) for h in sorted(set(heads))})
        if method != "ORIGINAL":
            same = [np.linalg.norm(descriptors[i] - original[i]) for i in range(len(records))]
            entry["distance_to_own_original"] = _distribution(np.array(same))
        result["methods"][method] = entry
    # calibration on ORIGINAL renderings: every pair of scans of different subjects / the same subject
    same, same_head, other_head = [], [], []
    for a in range(len(records)):
        for b in range(a + 1, len(records)):
            distance = float(np.linalg.norm(original[a] - original[b]))
            if subjects[a] == subjects[b]:
                same.append(distance)
            elif heads[a] == heads[b]:
                same_head.append(distance)
            else:
                other_head.append(distance)
    same, same_head, other_head = (np.array(v) for v in (same, same_head, other_head))
    result["calibration"] = {
        "same_subject": _distribution(same), "different_subject_same_head": _distribution(same_head),
        "different_subject_other_head": _distribution(other_head),
        "equal_error": _threshold_at_equal_error(same[np.isfinite(same)],
                                                 np.concatenate([same_head, other_head])[
                                                     np.isfinite(np.concatenate([same_head, other_head]))]),
        "note": "distances of ORIGINAL renderings (other scan of the same subject vs other subjects); dlib's 0.6 "
                "is for photographs and does not apply to renderings"}
    return result
