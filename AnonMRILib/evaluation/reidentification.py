"""Model-based re-identification attack on face renderings (CP-GAN paper, section 4.2).

The attacker is the Siamese network of :mod:`AnonMRILib.models.reidentification`, trained with
the triplet margin loss (margin 5) on face renderings of ORIGINAL scans only: anchor and positive
are two scans of one subject, the negative a scan of another subject. Splits are on subjects
(patients), never on scans, so the attacker never sees a test subject.

Two studies, both on held-out subjects and on the same embeddings:

* **5-way identification** (:func:`identification_trials`): the query is the ORIGINAL rendering
  of a scan ``s`` of subject ``p``; the options are the method's rendering of ``p``'s OTHER scan
  ``s'`` (the correct option) and the method's renderings of one scan of each of four other
  subjects; the prediction is the option closest to the query. This follows the AnonMRI issue;
  the paper's correct option is the method rendering of the same scan ``s``
  (``correct_option="same_scan"`` reproduces that; it is easier for the attacker because
  ORIGINAL then contains the query itself). The identification rate is the fraction of correct
  predictions, its s.d. a bootstrap over trials (1,000 resamples, as in the paper).
* **Retrieval** (:func:`retrieval_ranks`): the same query against the method's renderings of one
  scan of EVERY held-out subject (the correct one is ``p``'s other scan); the relative rank
  ``alpha_C = rank / (n - 1)`` of the correct option, 0 = closest. ``Pr[alpha_C <= alpha]`` is
  computed per split and summarised by its mean and a 95 % band (2.5th / 97.5th percentiles over
  the resampled 80/20 patient splits).

Ties (e.g. BLACK, where every option is the same image) are broken uniformly at random with the
trial's generator, so a method that removes all identity gives chance performance (0.2 and a
uniform ``alpha_C``) rather than whatever the option order happens to favour.
"""
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError
from ..progress import ProgressCallback, report

#: relative distance below which two option distances count as a tie
TIE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class AttackerTrainingConfig:
    """How the Siamese attacker is trained (Adam on random triplets; light 2-D augmentation).

    ``max_shift_px`` shifts renderings by up to that many pixels and ``intensity_jitter`` scales
    them by a factor in [1 - j, 1 + j]; both only during training, to keep the attacker from
    relying on exact pixel positions or brightness. With ``hard_negatives`` each anchor's negative
    is the closest image of another subject in the batch (batch-hard mining, a stronger attacker
    for the same compute; random triplets become easy, loss 0, within tens of steps).
    """

    steps: int = 300
    batch_size: int = 32
    learning_rate: float = 1e-3
    margin: float = 5.0
    max_shift_px: int = 4
    intensity_jitter: float = 0.1
    hard_negatives: bool = True
    seed: int = 0


# --- splits -----------------------------------------------------------------------------------
def patient_splits(subject_ids: Sequence, n_splits: int, test_fraction: float = 0.2,
                   seed: int = 0, min_test_subjects: int = 5) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``n_splits`` resampled subject-level splits: (train subjects, test subjects) arrays.

    Each split puts ``round(test_fraction * n)`` subjects (at least ``min_test_subjects``) in
    its test set, chosen uniformly at random with ``np.random.default_rng(seed)``.
    """
    subjects = np.array(sorted(set(subject_ids)))
    n_test = max(int(min_test_subjects), int(round(test_fraction * len(subjects))))
    if n_splits < 1:
        raise InputError("the number of splits must be at least 1")
    if n_test >= len(subjects) - 1:
        raise InputError(f"{len(subjects)} subjects are too few for {n_test} test subjects and at least "
                         f"two training subjects")
    rng = np.random.default_rng(seed)
    splits = []
    for _ in range(n_splits):
        order = rng.permutation(len(subjects))
        splits.append((np.sort(subjects[order[n_test:]]), np.sort(subjects[order[:n_test]])))
    return splits


# --- training ---------------------------------------------------------------------------------
def train_attacker(renderings: np.ndarray, subject_ids: Sequence, model_config=None,
                   training: Optional[AttackerTrainingConfig] = None, device: str = "cpu",
                   progress: Optional[ProgressCallback] = None):
    """Train the Siamese attacker on ORIGINAL ``renderings`` (N, H, W) in [0, 1] of ``subject_ids``.

    Returns ``(network, history)``: the :class:`~AnonMRILib.models.reidentification.SiameseNetwork`
    in eval mode and ``{"loss": [...per step...], "config": {...}}``. Deterministic for a seed on
    the CPU (initialisation, triplets and augmentation all come from the seed).
    """
    import torch

    from ..models.reidentification import SiameseConfig, SiameseNetwork, build_embedding_network, triplet_loss

    training = training or AttackerTrainingConfig()
    model_config = model_config or SiameseConfig()
    subjects = np.asarray(subject_ids)
    if len(subjects) != len(renderings):
        raise InputError("one subject id is needed per rendering")
    by_subject = _indices_by_subject(subjects)
    eligible = [s for s, idx in by_subject.items() if len(idx) >= 2]
    if not eligible or len(by_subject) < 2:
        raise InputError("training the attacker needs at least two subjects, one of them with two scans")

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(training.seed)
        module = build_embedding_network(model_config)
    network = SiameseNetwork(model_config, module=module, device=device)
    images = network.prepare(renderings)
    optimizer = torch.optim.Adam(network.module.parameters(), lr=training.learning_rate)
    loss_fn = triplet_loss(training.margin)
    rng = np.random.default_rng(training.seed)
    generator = torch.Generator(device="cpu").manual_seed(training.seed)
    subject_list = list(by_subject)
    history: List[float] = []
    network.module.train()
    for step in range(training.steps):
        anchors, positives, negatives = [], [], []
        for _ in range(training.batch_size):
            subject = eligible[rng.integers(len(eligible))]
            a, p = rng.choice(by_subject[subject], size=2, replace=False)
            # uniform over the other subjects: draw among the first n-1, the anchor's slot maps to the last
            other = subject_list[rng.integers(len(subject_list) - 1)]
            if other == subject:
                other = subject_list[-1]
            n = rng.choice(by_subject[other])
            anchors.append(a)
            positives.append(p)
            negatives.append(n)
        batch = torch.cat([images[anchors], images[positives], images[negatives]])
        batch = _augment(batch, training, generator)
        embeddings = network.module(batch)
        ea, ep, en = embeddings.chunk(3)
        if training.hard_negatives:
            en = _hardest_negatives(embeddings, ea, subjects[anchors + positives + negatives],
                                    subjects[anchors])
        loss = loss_fn(ea, ep, en)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(float(loss.detach()))
        if step % 10 == 0 or step == training.steps - 1:
            report(progress, (step + 1) / training.steps, f"attacker step {step + 1}/{training.steps} "
                                                          f"loss {history[-1]:.3f}")
    network.module.eval()
    return network, {"loss": history, "config": asdict(training)}


def _hardest_negatives(embeddings, anchors, batch_subjects: np.ndarray, anchor_subjects: np.ndarray):
    """For each anchor, the closest embedding in the batch that belongs to another subject."""
    import torch

    distances = torch.cdist(anchors, embeddings)
    same = torch.from_numpy(anchor_subjects[:, None] == batch_subjects[None, :]).to(distances.device)
    distances = distances.masked_fill(same, float("inf"))
    return embeddings[distances.argmin(dim=1)]


def _augment(batch, training: AttackerTrainingConfig, generator):
    """Random integer shifts (zero fill) and intensity scaling, per image."""
    import torch

    n = batch.shape[0]
    if training.intensity_jitter > 0:
        scale = 1.0 + (torch.rand(n, 1, 1, 1, generator=generator) * 2 - 1) * training.intensity_jitter
        batch = batch * scale.to(batch.device)
    shift = int(training.max_shift_px)
    if shift > 0:
        padded = torch.nn.functional.pad(batch, (shift, shift, shift, shift))
        offsets = torch.randint(0, 2 * shift + 1, (n, 2), generator=generator)
        h, w = batch.shape[-2:]
        batch = torch.stack([padded[i, :, dy:dy + h, dx:dx + w] for i, (dy, dx) in enumerate(offsets.tolist())])
    return batch


# --- studies ----------------------------------------------------------------------------------
def _indices_by_subject(subjects: np.ndarray) -> Dict:
    groups: Dict = {}
    for index, subject in enumerate(subjects.tolist()):
        groups.setdefault(subject, []).append(index)
    return {s: np.array(v) for s, v in groups.items()}


def _correct_index(query: int, subject_indices: np.ndarray, correct_option: str,
                   rng: np.random.Generator) -> Optional[int]:
    if correct_option == "same_scan":
        return query
    if correct_option != "other_scan":
        raise InputError("correct_option must be 'other_scan' or 'same_scan'")
    others = subject_indices[subject_indices != query]
    return int(rng.choice(others)) if len(others) else None


def _rank_with_ties(distances: np.ndarray, target: int, rng: np.random.Generator) -> int:
    """Rank of ``distances[target]`` (0 = smallest); ties take a uniformly random place among them."""
    d = distances[target]
    tolerance = TIE_TOLERANCE * max(1.0, float(np.max(np.abs(distances))))
    closer = int(np.sum(distances < d - tolerance))
    tied = int(np.sum(np.abs(distances - d) <= tolerance)) - 1
    return closer + (int(rng.integers(tied + 1)) if tied > 0 else 0)


def identification_trials(query_embeddings: np.ndarray, option_embeddings: np.ndarray,
                          subject_ids: Sequence, n_options: int = 5, repeats: int = 1,
                          correct_option: str = "other_scan", seed: int = 0) -> np.ndarray:
    """5-way identification: one boolean per trial (True = the attacker picked the right option).

    Row ``i`` of ``query_embeddings`` (ORIGINAL renderings) and of ``option_embeddings`` (the
    method's renderings) belong to the same scan, of subject ``subject_ids[i]``. Every scan with a
    second scan of its subject is a query ``repeats`` times with fresh distractors.
    """
    queries = np.asarray(query_embeddings, dtype=np.float64)
    options = np.asarray(option_embeddings, dtype=np.float64)
    subjects = np.asarray(subject_ids)
    if queries.shape != options.shape or len(subjects) != len(queries):
        raise InputError("query and option embeddings must have the same shape and one subject id per row")
    groups = _indices_by_subject(subjects)
    names = list(groups)
    if len(names) < n_options:
        raise InputError(f"{n_options}-way identification needs at least {n_options} subjects, got {len(names)}")
    rng = np.random.default_rng(seed)
    outcomes = []
    for _ in range(repeats):
        for query in range(len(queries)):
            subject = subjects[query]
            correct = _correct_index(query, groups[subject], correct_option, rng)
            if correct is None:
                continue
            others = [s for s in names if s != subject]
            chosen = rng.choice(len(others), size=n_options - 1, replace=False)
            distractors = [int(rng.choice(groups[others[c]])) for c in chosen]
            candidates = np.array([correct] + distractors)
            distances = np.linalg.norm(options[candidates] - queries[query], axis=1)
            outcomes.append(_rank_with_ties(distances, 0, rng) == 0)
    return np.array(outcomes, dtype=bool)


def retrieval_ranks(query_embeddings: np.ndarray, option_embeddings: np.ndarray, subject_ids: Sequence,
                    correct_option: str = "other_scan", seed: int = 0) -> np.ndarray:
    """Relative rank alpha_C in [0, 1] of the correct option among one scan per held-out subject."""
    queries = np.asarray(query_embeddings, dtype=np.float64)
    options = np.asarray(option_embeddings, dtype=np.float64)
    subjects = np.asarray(subject_ids)
    groups = _indices_by_subject(subjects)
    names = list(groups)
    if len(names) < 2:
        raise InputError("retrieval needs at least two subjects")
    rng = np.random.default_rng(seed)
    ranks = []
    for query in range(len(queries)):
        subject = subjects[query]
        correct = _correct_index(query, groups[subject], correct_option, rng)
        if correct is None:
            continue
        candidates = [correct] + [int(rng.choice(groups[s])) for s in names if s != subject]
        distances = np.linalg.norm(options[np.array(candidates)] - queries[query], axis=1)
        ranks.append(_rank_with_ties(distances, 0, rng) / (len(candidates) - 1))
    return np.array(ranks, dtype=np.float64)


def top_alpha_curve(relative_ranks: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """Pr[alpha_C <= alpha] for each alpha (the empirical CDF of the relative ranks)."""
    ranks = np.sort(np.asarray(relative_ranks, dtype=np.float64))
    if ranks.size == 0:
        return np.full(len(alphas), np.nan)
    return np.searchsorted(ranks, np.asarray(alphas) + 1e-12, side="right") / ranks.size


def bootstrap_rate(outcomes: np.ndarray, n_resamples: int = 1000, seed: int = 0) -> Dict[str, float]:
    """Mean of boolean ``outcomes`` and its bootstrap s.d. (``n_resamples`` resamples of trials)."""
    outcomes = np.asarray(outcomes, dtype=np.float64)
    if outcomes.size == 0:
        return {"mean": float("nan"), "sd": float("nan"), "n_trials": 0}
    rng = np.random.default_rng(seed)
    means = outcomes[rng.integers(0, outcomes.size, size=(n_resamples, outcomes.size))].mean(axis=1)
    return {"mean": float(outcomes.mean()), "sd": float(means.std(ddof=1)), "n_trials": int(outcomes.size)}


def curve_band(curves: np.ndarray, level: float = 0.95) -> Dict[str, List[float]]:
    """Mean and the central ``level`` percentile band of per-split curves (splits x alphas)."""
    curves = np.atleast_2d(np.asarray(curves, dtype=np.float64))
    tail = 100.0 * (1.0 - level) / 2.0
    return {"mean": curves.mean(axis=0).tolist(),
            "lower": np.percentile(curves, tail, axis=0).tolist(),
            "upper": np.percentile(curves, 100.0 - tail, axis=0).tolist()}
