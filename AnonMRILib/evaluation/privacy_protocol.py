"""The privacy-evaluation protocol (CP-GAN paper, section 4) on a generated population.

For a population generated from real whole-head T1s (:mod:`AnonMRILib.datasets.population`:
few real heads -> many subjects -> two scans each; there is no real population here and every
number reported is on that generated population), :func:`evaluate`

1. anonymizes every scan with every method (:data:`ALL_METHODS`: ORIGINAL, BLURRED (2-D blur of
   the rendering), FACE-MASK, DEFACE, QUICKSHEAR, CP-GAN, BLACK (the same all-black rendering for
   every option), SKULLSTRIP (the paper's MRI WATERSHED), and REFACE where the library has it);
2. renders every result as a face (:mod:`AnonMRILib.evaluation.face_renderings`: a canonical
   2 mm frame centred on the original's head, so renderings of all scans are comparable);
3. attacks every method with the Siamese attacker and the open face recognizer
   (:mod:`AnonMRILib.evaluation.privacy_attacks`);
4. measures brain-analysis agreement (:mod:`AnonMRILib.evaluation.tissue_segmentation`);
5. writes the report folder (:mod:`AnonMRILib.evaluation.privacy_report`).

A work folder caches renderings, tissue results and attackers per scan / split, keyed by the
configuration (a CP-GAN rendering also by the weights' SHA-256), so a re-run with new CP-GAN
weights only recomputes CP-GAN. ``Training/evaluate_privacy.py`` is the command line over it.
"""
import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError, WeightsError
from ..io import Volume, load_volume
from ..models.model_card import sha256_of

logger = logging.getLogger(__name__)
#: the library folder (brain-extraction code and weight cards are fingerprinted from it)
LIBRARY_ROOT = Path(__file__).resolve().parents[1]

#: every method of the study, in the order of the paper's Figure 4
#: (REFACE, the average head placed from the brain mask and hull, where the library has it)
ALL_METHODS = ("ORIGINAL", "BLURRED", "FACE-MASK", "DEFACE", "QUICKSHEAR", "CP-GAN", "REFACE", "BLACK",
               "SKULLSTRIP")
#: study name -> ``AnonMRILib.pipelines.baselines.deface`` method
REMOVAL_METHODS = {"FACE-MASK": "facemask", "DEFACE": "deface", "QUICKSHEAR": "quickshear",
                   "SKULLSTRIP": "skullstrip", "REFACE": "reface"}
#: methods that change the volume (the brain-analysis agreement is computed for these)
VOLUME_METHODS = ("FACE-MASK", "DEFACE", "QUICKSHEAR", "CP-GAN", "REFACE", "SKULLSTRIP")
#: methods whose renderings are derived from the ORIGINAL rendering (2-D controls)
RENDERING_METHODS = ("BLURRED", "BLACK")
#: the cache layout version; bump when what is cached changes meaning
CACHE_VERSION = 2


def library_has_reface() -> bool:
    """Whether ``AnonMRILib.pipelines.baselines.deface`` offers the ``"reface"`` method."""
    from ..pipelines.baselines import REMOVAL_METHODS as LIBRARY_METHODS

    return "reface" in LIBRARY_METHODS


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
    #: BLURRED's Gaussian sigma at ``render_size`` (scaled for the recognizer's views). The paper's
    #: control is "blurred to mildly obscure the patient identity" (its raters: 64.3 % -> 57.2 %);
    #: 0.5 px at 64 px (2 mm on the face) is mild (open recognizer top-1 0.800 -> 0.775), while the
    #: earlier 1.5 px (6 mm) was strong (0.800 -> 0.525)
    blur_sigma_px: float = 0.5
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
    # Siamese attacker's subjects: 0 = resampled 80/20 splits of the studied subjects (the paper);
    # N > 0 = N further subjects per head (ORIGINAL renderings only), resampled per split, and every
    # studied subject is attacked (enough subjects per head for the within-head study)
    attacker_subjects_per_head: int = 0
    # open face recognizer (dlib): views (azimuth, elevation in degrees), size of each view in pixels
    recognizer: bool = True
    recognizer_views: List[List[float]] = field(default_factory=lambda: [[0.0, 0.0], [25.0, 0.0], [-25.0, 0.0],
                                                                         [0.0, 10.0]])
    recognizer_render_size: int = 128
    recognizer_upsample: int = 1
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
    # population: face-shape identity variation (MakeHuman targets; 0 = off)
    face_shape_amplitude: float = 0.0
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
def fingerprint(values) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_json(path: Path, data) -> None:
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
    from ..datasets.population import prepare_head
    from ..transforms.brain_mask import brain_mask, user_brain_mask

    heads = []
    for spec in config.heads:
        name, image_path, mask_path = _parse_head(spec)
        image = _load_3d(image_path)
        if mask_path is not None:
            mask = user_brain_mask(_load_3d(mask_path), image)
        else:
            logger.info(f"brain mask of head {name} ({config.brain_mask_backend})")
            mask = brain_mask(image, backend=config.brain_mask_backend)
        heads.append(prepare_head(name, image, mask, working_spacing_mm=config.working_spacing_mm))
    return heads



class Anonymizers:
    """Applies the volume methods; CP-GAN only when its weights exist."""

    def __init__(self, config: EvaluationConfig) -> None:
        self.config = config
        self.cpgan_weights: Optional[Path] = None
        self.cpgan_note = ""
        if "CP-GAN" in config.methods:
            self.cpgan_weights = self._find_cpgan_weights()
        self.reface = "REFACE" in config.methods and library_has_reface()
        self.reface_note = ("" if self.reface or "REFACE" not in config.methods
                            else "REFACE left out: AnonMRILib.pipelines.baselines has no 'reface' method")

    def _find_cpgan_weights(self) -> Optional[Path]:
        """The weights asked for (which must exist), else the shipped ones (found or fetched), else None (left out)."""
        if self.config.cpgan_weights:
            path = Path(self.config.cpgan_weights)
            if not path.is_file():
                raise InputError(f"CP-GAN weights not found: {path}")
            return path
        from ..models.cpgan_weights import default_weights_file

        try:
            return default_weights_file()
        except WeightsError as error:
            self.cpgan_note = f"CP-GAN left out: {error}"
            return None

    def available(self, method: str) -> bool:
        if method == "REFACE":
            return self.reface
        return method != "CP-GAN" or self.cpgan_weights is not None

    def fingerprint(self, method: str) -> str:
        """What a cached output of ``method`` must match to be reused: for CP-GAN the weights, the
        seed and the anatomical prior it warps; for REFACE that prior."""
        if method == "CP-GAN":
            if not hasattr(self, "_cpgan_sha"):
                self._cpgan_sha = sha256_of(self.cpgan_weights)
            return f"CP-GAN:{self._cpgan_sha}:{self.config.remodel_seed}:{prior_fingerprint()}"
        if method == "DEFACE":
            return f"DEFACE:{self.config.deface_registration_spacing_mm}"
        if method == "REFACE":
            return "REFACE:" + fingerprint([sha256_of(LIBRARY_ROOT / "pipelines" / "reface.py"), prior_fingerprint()])
        return method

    def apply(self, method: str, volume: Volume, brain: Volume) -> Volume:
        if method == "CP-GAN":
            from ..pipelines.remodel import remodel_face

            return remodel_face(volume, brain_mask=brain, weights=str(self.cpgan_weights),
                                device=self.config.device, seed=self.config.remodel_seed)
        from ..pipelines.baselines import deface

        method_config = None
        if method == "DEFACE":
            from ..pipelines.removal.template_deface import DefaceConfig

            method_config = DefaceConfig(registration_spacing_mm=self.config.deface_registration_spacing_mm)
        return deface(volume, REMOVAL_METHODS[method], brain_mask=brain, config=method_config)


def rendering_config(config: EvaluationConfig):
    from .face_renderings import FaceRenderingConfig

    device = "cpu" if config.device == "auto" else config.device
    if config.device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return FaceRenderingConfig(field_of_view_mm=config.field_of_view_mm, grid_size=config.render_grid_size,
                               image_size=config.render_size, device=device)


def recognizer_rendering_config(config: EvaluationConfig):
    """The canonical frame of the recognizer's views: the Siamese frame at ``recognizer_render_size``."""
    from dataclasses import replace

    return replace(rendering_config(config), image_size=int(config.recognizer_render_size))


def views_key(method: str) -> str:
    """Cache / renderings key of a method's recognizer views."""
    return f"{method}@views"


def process_scan(scan, config: EvaluationConfig, anonymizers: Anonymizers, do_tissue: bool,
                 cache_dir: Path, cache_key: str, timings: Optional[Dict[str, float]] = None,
                 tissue_key: Optional[str] = None
                 ) -> Tuple[Dict[str, np.ndarray], Optional[Dict]]:
    """Renderings of every available method for one scan (+ tissue agreement when asked), cached.

    Returns ``{method: (render_size, render_size) float32}`` and, with ``config.recognizer``,
    ``{views_key(method): (V, S, S) uint8}`` (the recognizer's views, :func:`views_key`).
    ``timings`` (when given) receives the seconds spent per method (anonymize + render) and in the
    tissue segmentations.
    """
    timings = {} if timings is None else timings
    tissue_key = tissue_key or cache_key
    from .face_renderings import blur_rendering, head_centre, render_canonical_face, render_canonical_views

    render_config = rendering_config(config)
    views_config = recognizer_rendering_config(config)
    views = [tuple(v) for v in config.recognizer_views]

    def render_views(volume: Volume, centre) -> np.ndarray:
        images = render_canonical_views(volume, centre, views_config, views)
        return np.round(np.clip(images, 0.0, 1.0) * 255.0).astype(np.uint8)

    render_path = cache_dir / "renderings" / f"{scan.scan_id}.npz"
    meta_path = render_path.with_suffix(".json")
    tissue_path = cache_dir / "tissue" / f"{scan.scan_id}.json"
    renderings: Dict[str, np.ndarray] = {}
    meta: Dict[str, str] = {}
    if render_path.is_file() and meta_path.is_file():
        stored_meta = json.loads(meta_path.read_text())
        if stored_meta.get("_key") == cache_key:
            with np.load(render_path) as stored:
                for method, stored_fingerprint in stored_meta.items():
                    if method != "_key" and method in stored.files:
                        renderings[method] = stored[method]
                        meta[method] = stored_fingerprint
    tissue: Dict = {}
    if tissue_path.is_file():
        stored_tissue = json.loads(tissue_path.read_text())
        if stored_tissue.get("_key") == tissue_key:
            tissue = stored_tissue
    tissue.setdefault("_key", tissue_key)

    wanted = [m for m in config.methods if anonymizers.available(m)]

    def stale(method: str) -> bool:
        wanted_fingerprint = anonymizers.fingerprint(method)
        return (meta.get(method) != wanted_fingerprint
                or (config.recognizer and meta.get(views_key(method)) != wanted_fingerprint))

    needs_volume = [m for m in wanted if m in VOLUME_METHODS
                    and (stale(m) or (do_tissue and tissue.get(m, {}).get("_method") != anonymizers.fingerprint(m)))]
    if stale("ORIGINAL") or needs_volume:
        centre = head_centre(scan.volume)
        if "ORIGINAL" not in renderings:
            renderings["ORIGINAL"] = render_canonical_face(scan.volume, centre, render_config)
            meta["ORIGINAL"] = "ORIGINAL"
        if config.recognizer and views_key("ORIGINAL") not in renderings:
            renderings[views_key("ORIGINAL")] = render_views(scan.volume, centre)
            meta[views_key("ORIGINAL")] = "ORIGINAL"
        original_labels = None
        for method in needs_volume:
            started = time.time()
            anonymized = anonymizers.apply(method, scan.volume, scan.brain_mask)
            if stale(method):
                renderings[method] = render_canonical_face(anonymized, centre, render_config)
                meta[method] = anonymizers.fingerprint(method)
                if config.recognizer:
                    renderings[views_key(method)] = render_views(anonymized, centre)
                    meta[views_key(method)] = anonymizers.fingerprint(method)
            timings[method] = time.time() - started
            if do_tissue and tissue.get(method, {}).get("_method") != anonymizers.fingerprint(method):
                from .tissue_segmentation import TissueSegmentationConfig, segment_tissues, tissue_agreement

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
        if config.recognizer:
            # the same blur relative to the face: sigma scales with the image size
            sigma = config.blur_sigma_px * config.recognizer_render_size / config.render_size
            blurred = np.stack([blur_rendering(v / 255.0, sigma) for v in renderings[views_key("ORIGINAL")]])
            renderings[views_key("BLURRED")] = np.round(np.clip(blurred, 0, 1) * 255).astype(np.uint8)
            meta[views_key("BLURRED")] = "BLURRED"
    if "BLACK" in wanted:
        renderings["BLACK"] = np.zeros_like(renderings["ORIGINAL"])
        meta["BLACK"] = "BLACK"
        if config.recognizer:
            renderings[views_key("BLACK")] = np.zeros_like(renderings[views_key("ORIGINAL")])
            meta[views_key("BLACK")] = "BLACK"
    render_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = render_path.with_name(render_path.stem + ".tmp.npz")
    np.savez_compressed(tmp, **renderings)
    tmp.replace(render_path)
    write_json(meta_path, dict(meta, _key=cache_key))
    if do_tissue:
        tissue_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(tissue_path, tissue)
    return renderings, (tissue if do_tissue else None)


def prior_fingerprint() -> str:
    """The anatomical prior's code and every file of its template (a new template or a changed
    placement is a new REFACE, and a new CP-GAN on the prior)."""
    from ..transforms.anatomical_prior import TEMPLATE_DIR

    code = [LIBRARY_ROOT / "transforms" / name for name in ("anatomical_prior.py", "tissue_model.py", "distance.py")]
    code += sorted(Path(TEMPLATE_DIR).glob("reface_template_*"))
    return fingerprint([(f.name, sha256_of(f)) for f in code if f.is_file()])


def brain_extraction_fingerprint() -> str:
    """Hash of the brain-extraction code and weight cards: tissue results are cached under it, so a
    change of the brain-mask backend never mixes old and new segmentations in one table."""
    library = LIBRARY_ROOT
    files = sorted((library / "transforms" / "brain_extraction").glob("*.py"))
    files += [library / "transforms" / "brain_mask.py"]
    files += sorted((library / "weights" / "brain_extraction").glob("*.json"))
    return fingerprint([(f.name, sha256_of(f)) for f in files if f.is_file()])


def _original_labels(scan, tissue_config, cache_dir: Path, cache_key: str) -> Volume:
    """The ORIGINAL scan's tissue labels, cached (uint8, on the scan's grid)."""
    from .tissue_segmentation import segment_tissues

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



# --- main ---------------------------------------------------------------------------------------
def _prepare_run(config: EvaluationConfig, out_dir: Path, work_dir: Path):
    """Validate ``config``, create the folders, and return (population config, heads, anonymizers)."""
    from ..datasets.population import PopulationConfig

    config.validate()
    out_dir.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    population_config = PopulationConfig(subjects_per_head=config.subjects_per_head,
                                         scans_per_subject=config.scans_per_subject, seed=config.population_seed,
                                         face_shape_amplitude=config.face_shape_amplitude)
    return population_config, load_heads(config), Anonymizers(config)


def evaluate(config: EvaluationConfig, out_dir: Path, work_dir: Path, save_attacker: Optional[Path] = None,
             save_reference: Optional[Path] = None, reference_count: int = 16, grid_rows: int = 4,
             discussion: Optional[str] = None) -> Dict:
    """Run the whole evaluation and write the report folder; ``discussion``: markdown written under
    the goals table (why a goal is missed: the person who ran the evaluation reads the figures and
    says so), kept in ``privacy.json`` too."""
    from ..datasets.population import generate_population
    from ..rendering import save_png
    from .privacy_attacks import attacker_training_config, run_attacks, run_open_recognizer
    from .privacy_report import (evaluation_goals, markdown_report, plot_identification, plot_losses,
                                 plot_top_alpha, rendering_grid, summarise_tissue)

    started = time.time()
    population_config, heads, anonymizers = _prepare_run(config, out_dir, work_dir)
    notes = [n for n in (anonymizers.cpgan_note, anonymizers.reface_note) if n]
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
    head_keys = [fingerprint([h.name, h.volume.shape, h.volume.affine.round(4).tolist(),
                               float(np.asarray(h.volume.array, np.float64).sum()),
                               int(np.asarray(h.brain_mask.array).sum())]) for h in heads]
    # a scan depends on (seed, head, subject index, scan index), not on how many subjects there are
    population_values = {k: v for k, v in population_config.to_dict().items() if k != "subjects_per_head"}
    recognizer_values = ([config.recognizer_views, config.recognizer_render_size] if config.recognizer else None)
    population_key = fingerprint([CACHE_VERSION, head_keys, population_values,
                                  asdict(rendering_config(config)), config.brain_mask_backend, recognizer_values])
    tissue_key = fingerprint([population_key, brain_extraction_fingerprint()])
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
            if config.recognizer:
                stacks.setdefault(views_key(method), []).append(renderings[views_key(method)])
        if tissue is not None:
            tissue_results.append({"scan": scan.scan_id, **{m: {t: v for t, v in tissue[m].items() if t != "_method"}
                                                           for m in methods if m in tissue}})
        logger.info(f"scan {count + 1}/{total} {scan.scan_id}: {time.time() - scan_started:.1f} s "
             + " ".join(f"{k}={v:.1f}" for k, v in timings.items()))
    renderings = {m: np.stack(v) for m, v in stacks.items()}
    training_pool = attacker_training_pool(heads, population_config, config, anonymizers, work_dir, population_key)

    identification, retrieval, losses, attackers, splits, within_head = run_attacks(
        records, renderings, methods, config, work_dir, population_key, training_pool)
    recognizer = (run_open_recognizer(records, {m: renderings[views_key(m)] for m in methods}, methods, config)
                  if config.recognizer else None)
    agreement = summarise_tissue(tissue_results, [m for m in methods if m in VOLUME_METHODS],
                                 config.brain_mask_backend)

    # figures (PNG + JSON each)
    plot_top_alpha(retrieval, out_dir / "top_alpha.png")
    write_json(out_dir / "top_alpha.json", retrieval)
    plot_identification(identification, out_dir / "identification_rate.png", config.n_options)
    write_json(out_dir / "identification_rate.json", identification)
    plot_losses(losses, out_dir / "attacker_loss.png")
    write_json(out_dir / "attacker_loss.json", {"loss_per_split": losses})
    grid, grid_scans = rendering_grid(renderings, records, methods, grid_rows, config.seed)
    save_png(grid, out_dir / "renderings_grid.png")
    write_json(out_dir / "renderings_grid.json", {"scans": grid_scans, "methods": methods,
                                                   "render_size": config.render_size})
    write_json(out_dir / "brain_agreement.json", agreement)

    # shipped artefacts: attacker of split 0 and reference renderings of its held-out subjects
    network, train_subjects, test_subjects = attackers[0]
    if save_attacker is not None:
        network.save(save_attacker, card={
            "training_data": "ORIGINAL face renderings of the generated population (AnonMRILib.datasets."
                             "population) built from real heads " + ", ".join(h.name for h in heads)
                             + f"; {len(train_subjects)} training subjects of split 0",
            "rendering": asdict(rendering_config(config)),
            "training": asdict(attacker_training_config(config, 0)), "loss": "TripletMarginLoss(margin=5)",
            "metrics": {"identification_rate_split0_ORIGINAL": identification["ORIGINAL"]["per_split"][0]},
            "held_out_subjects": test_subjects.tolist(),
            "produced_by": "Training/evaluate_privacy.py"})
        logger.info(f"attacker weights written to {save_attacker}")
    if save_reference is not None:
        threshold = recognizer["calibration"]["equal_error"]["threshold"] if recognizer else None
        write_reference_faces(heads, population_config, config, reference_count, save_reference, threshold)

    result = {
        "identification_rate": identification,
        "identification_rate_within_head": within_head,
        "open_recognizer": recognizer,
        "summary": method_summary(methods, identification, within_head, recognizer),
        "retrieval": retrieval,
        "brain_agreement": {k: v for k, v in agreement.items() if k != "per_scan"},
        "goals": evaluation_goals(identification, agreement,
                                  method_summary(methods, identification, within_head, recognizer)),
        "population": {"heads": [h.name for h in heads], "n_subjects": len(subject_ids),
                       "subjects_per_head": config.subjects_per_head,
                       "scans_per_subject": config.scans_per_subject, "config": population_config.to_dict(),
                       "attacker_training_subjects_per_head": config.attacker_subjects_per_head,
                       "identity_variation": (
                           "per subject: smooth random shape warp of face and skull, intensity contrast/scale, bias "
                           "field" + (f", and a face shape from a random combination (weights N(0, "
                                      f"{config.face_shape_amplitude:g})) of MakeHuman's CC0 face morph targets "
                                      "(nose, mouth, eyes, ears, chin, cheeks, forehead) transferred onto the head's "
                                      "skin" if config.face_shape_amplitude > 0 else "")
                           + "; per scan: rigid pose change, intensity jitter, Rician noise"),
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
    write_json(out_dir / "privacy.json", result)
    (out_dir / "report.md").write_text(markdown_report(result))
    logger.info(f"report written to {out_dir} in {result['wall_time_s'] / 60:.1f} min")
    return result


def evaluate_brain_agreement(config: EvaluationConfig, out_dir: Path, work_dir: Path) -> Dict:
    """Only the brain-analysis agreement of :func:`evaluate`: the same population, the same
    ``tissue_scans`` scans (first scan of subjects drawn with ``config.seed``), every volume method
    of ``config.methods``; writes ``brain_agreement.json`` and, when ``privacy.json`` is there,
    replaces its ``brain_agreement`` entry and the goals that read it, and rewrites ``report.md``
    from it (the rest of that report is left as it was). Original
    labels are cached in ``work_dir`` as in :func:`evaluate`."""
    from ..datasets.population import generate_population
    from .privacy_report import summarise_tissue
    from .tissue_segmentation import TissueSegmentationConfig, segment_tissues, tissue_agreement

    population_config, heads, anonymizers = _prepare_run(config, out_dir, work_dir)
    methods = [m for m in config.methods if m in VOLUME_METHODS and anonymizers.available(m)]
    head_keys = [fingerprint([h.name, h.volume.shape, h.volume.affine.round(4).tolist(),
                               float(np.asarray(h.volume.array, np.float64).sum()),
                               int(np.asarray(h.brain_mask.array).sum())]) for h in heads]
    population_values = {k: v for k, v in population_config.to_dict().items() if k != "subjects_per_head"}
    tissue_key = fingerprint([CACHE_VERSION, head_keys, population_values, config.brain_mask_backend,
                              brain_extraction_fingerprint(), "brain-agreement"])
    subject_ids = sorted({f"{h.name}-s{i:04d}" for h in heads for i in range(config.subjects_per_head)})
    tissue_rng = np.random.default_rng(config.seed)
    tissue_subjects = set(tissue_rng.choice(subject_ids, size=min(config.tissue_scans, len(subject_ids)),
                                            replace=False).tolist()) if config.tissue_scans > 0 else set()
    tissue_config = TissueSegmentationConfig(brain_mask_backend=config.brain_mask_backend)
    results = []
    for scan in generate_population(heads, population_config):
        if scan.subject_id not in tissue_subjects or scan.scan_index != 0:
            continue
        started = time.time()
        original_labels = _original_labels(scan, tissue_config, work_dir, tissue_key)
        row: Dict = {"scan": scan.scan_id}
        for method in methods:
            anonymized = anonymizers.apply(method, scan.volume, scan.brain_mask)
            row[method] = tissue_agreement(original_labels, segment_tissues(anonymized, tissue_config))
        results.append(row)
        logger.info(f"brain agreement {scan.scan_id}: {time.time() - started:.0f} s")
    agreement = summarise_tissue(results, methods, config.brain_mask_backend)
    write_json(out_dir / "brain_agreement.json", agreement)
    if (out_dir / "privacy.json").is_file():
        replace_brain_agreement(out_dir, agreement)
    return agreement


def replace_brain_agreement(out_dir: Path, agreement: Dict) -> Dict:
    """``out_dir/privacy.json`` with its ``brain_agreement`` entry replaced by ``agreement`` and the
    goals recomputed (they read the brain Dice per tissue); ``report.md`` rewritten from it. Returns
    the updated report."""
    from .privacy_report import evaluation_goals, markdown_report

    report_path = Path(out_dir) / "privacy.json"
    report = json.loads(report_path.read_text())
    report["brain_agreement"] = {k: v for k, v in agreement.items() if k != "per_scan"}
    report["goals"] = evaluation_goals(report["identification_rate"], agreement, report.get("summary"))
    write_json(report_path, report)
    (Path(out_dir) / "report.md").write_text(markdown_report(report))
    return report


def attacker_training_pool(heads: Sequence, population_config, config: EvaluationConfig, anonymizers: "Anonymizers",
                           work_dir: Path, population_key: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """ORIGINAL renderings and subject ids of ``config.attacker_subjects_per_head`` further subjects per
    head (indices from :data:`ATTACKER_SUBJECT_OFFSET`), or None (attacker trained on splits of the
    studied subjects)."""
    from dataclasses import replace

    from ..datasets.population import generate_population

    if config.attacker_subjects_per_head <= 0:
        return None
    pool_config = replace(config, methods=["ORIGINAL"], recognizer=False, tissue_scans=0)
    indices = range(ATTACKER_SUBJECT_OFFSET, ATTACKER_SUBJECT_OFFSET + config.attacker_subjects_per_head)
    images, subjects = [], []
    for scan in generate_population(heads, population_config, subject_indices=indices):
        renderings, _ = process_scan(scan, pool_config, anonymizers, False, work_dir, population_key)
        images.append(renderings["ORIGINAL"])
        subjects.append(scan.subject_id)
    logger.info(f"attacker training pool: {len(images)} ORIGINAL renderings of {len(set(subjects))} subjects")
    return np.stack(images), np.array(subjects)


def method_summary(methods: Sequence[str], identification: Dict, within_head: Dict,
                   recognizer: Optional[Dict]) -> Dict[str, Dict[str, Optional[float]]]:
    """Per method: the Siamese 5-way rate and the open recognizer's top-1 / top-5, over all subjects
    and within base heads (None where not measured)."""
    summary = {}
    for method in methods:
        entry = {"siamese_5way_all": identification.get(method, {}).get("mean"),
                 "siamese_5way_within_head": within_head.get(method, {}).get("mean")}
        face = (recognizer or {}).get("methods", {}).get(method, {})
        for key in ("top1_all", "top5_all", "top1_within_head", "top5_within_head", "detected_fraction"):
            entry[f"recognizer_{key}"] = face.get(key)
        summary[method] = entry
    return summary


#: subject indices of the attacker's own training subjects (attacker_subjects_per_head > 0)
ATTACKER_SUBJECT_OFFSET = 500
#: subject indices of the reference heads start here, far from the studied subjects 0, 1, ...
REFERENCE_SUBJECT_OFFSET = 1000


def write_reference_faces(heads: Sequence, population_config, config: EvaluationConfig, count: int,
                          path: Path, recognizer_threshold: Optional[float] = None) -> Path:
    """ORIGINAL renderings of ``count`` extra subjects (scan 0), spread over the heads, as uint8 .npz.

    Their subject indices start at :data:`REFERENCE_SUBJECT_OFFSET`, so neither the attacker nor the
    study ever saw them (nor did CP-GAN, trained on other seeds / indices). With
    ``config.recognizer``, also the open recognizer's descriptors (NaN rows: no face) of those
    subjects and of the real heads themselves (``recognizer_ids``), the views they were made from
    and the same-person distance threshold calibrated on renderings (``recognizer_threshold``;
    NaN when not given).
    """
    from ..datasets.population import generate_scan, subject_variation
    from .face_renderings import head_centre, render_canonical_face, render_canonical_views

    render_config = rendering_config(config)
    views_config = recognizer_rendering_config(config)
    views = [tuple(v) for v in config.recognizer_views]
    images, ids, view_stacks, view_ids = [], [], [], []
    for number in range(count):
        head = heads[number % len(heads)]
        index = REFERENCE_SUBJECT_OFFSET + number // len(heads)
        scan = generate_scan(head, index, 0, population_config, subject_variation(head, index, population_config))
        centre = head_centre(scan.volume)
        images.append(render_canonical_face(scan.volume, centre, render_config))
        ids.append(scan.scan_id)
        if config.recognizer:
            view_stacks.append(render_canonical_views(scan.volume, centre, views_config, views))
            view_ids.append(scan.scan_id)
    extra = {}
    if config.recognizer:
        from .face_recognition import FaceRecognizer
        from .privacy_attacks import describe_all

        for head in heads:
            view_stacks.append(render_canonical_views(head.volume, head_centre(head.volume), views_config, views))
            view_ids.append(f"{head.name}-real")
        descriptors, _ = describe_all(np.stack(view_stacks), FaceRecognizer(upsample=config.recognizer_upsample))
        extra = {"recognizer_descriptors": descriptors.astype(np.float32), "recognizer_ids": np.array(view_ids),
                 "recognizer_views": np.array(views, dtype=np.float64),
                 "recognizer_render_size": np.int64(config.recognizer_render_size),
                 "recognizer_threshold": np.float64(np.nan if recognizer_threshold is None else recognizer_threshold)}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, renderings=np.round(np.stack(images) * 255).astype(np.uint8), scan_ids=np.array(ids),
                        field_of_view_mm=np.float64(config.field_of_view_mm),
                        grid_size=np.int64(config.render_grid_size), view=np.array("anterior"), **extra)
    logger.info(f"{count} reference renderings written to {path}")
    return path


def _machine() -> str:
    import os
    import platform

    return f"{platform.machine()} CPU x{os.cpu_count()} ({platform.system()}), shared with other jobs"

