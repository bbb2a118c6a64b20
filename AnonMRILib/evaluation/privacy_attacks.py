"""Attacks of the privacy evaluation: the Siamese attacker per patient split (and the open recognizer).

See :mod:`AnonMRILib.evaluation.reidentification` for the Siamese protocol and
:mod:`AnonMRILib.evaluation.face_recognition` for the open recognizer.
"""
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np

from .privacy_protocol import CACHE_VERSION, EvaluationConfig, fingerprint

logger = logging.getLogger(__name__)


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
                config: EvaluationConfig, cache_dir: Path, population_key: str):
    """Per split: train on ORIGINAL renderings of training subjects, attack held-out subjects."""
    from .reidentification import (bootstrap_rate, curve_band, identification_trials,
                                                        patient_splits, retrieval_ranks, top_alpha_curve)

    subjects = np.array([r["subject"] for r in records])
    splits = patient_splits(subjects, config.n_splits, config.test_fraction, seed=config.seed,
                            min_test_subjects=config.n_options)
    alphas = np.linspace(0.0, 1.0, config.alpha_points)
    trials = {m: [] for m in methods}
    per_split_rate = {m: [] for m in methods}
    curves = {m: [] for m in methods}
    mean_ranks = {m: [] for m in methods}
    losses, attackers = [], []
    for index, (train_subjects, test_subjects) in enumerate(splits):
        train = np.isin(subjects, train_subjects)
        test = np.isin(subjects, test_subjects)
        key = fingerprint([population_key, CACHE_VERSION, asdict(siamese_model_config(config)),
                            asdict(attacker_training_config(config, index)), train_subjects.tolist()])
        logger.info(f"split {index + 1}/{len(splits)}: attacker on {int(train.sum())} ORIGINAL renderings of "
             f"{len(train_subjects)} subjects; {len(test_subjects)} held-out subjects")
        network, loss = train_or_load_attacker(index, renderings["ORIGINAL"][train], subjects[train],
                                               config, cache_dir, key)
        losses.append(loss)
        attackers.append((network, train_subjects, test_subjects))
        queries = network.embed(renderings["ORIGINAL"][test])
        for m_index, method in enumerate(methods):
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
    identification = {}
    for m_index, method in enumerate(methods):
        rate = bootstrap_rate(np.concatenate(trials[method]), config.bootstrap_resamples,
                              seed=config.seed + m_index)
        rate["per_split"] = per_split_rate[method]
        identification[method] = rate
    retrieval = {"alphas": alphas.tolist(), "n_splits": len(splits),
                 "curves": {m: curve_band(np.stack(curves[m])) for m in methods},
                 "mean_relative_rank": {m: float(np.mean(mean_ranks[m])) for m in methods},
                 "probability_top_10_percent": {
                     m: float(np.mean([c[int(round(0.1 * (len(alphas) - 1)))] for c in curves[m]]))
                     for m in methods}}
    return identification, retrieval, losses, attackers, splits

