"""Shared pieces of the lesion-model training scripts: config, DDP, checkpoints with resume.

* Config: a dataclass of defaults, overridden by ``--config FILE.json`` and then by flags. A config
  file may hold one section per script (``{"vae": {...}, "diffusion": {...}}``, e.g.
  ``Training/configs/lesion_paper_240.json``); each script reads its own section.
* DDP: launched with ``torchrun --nproc_per_node N script.py ...`` the scripts see ``WORLD_SIZE``
  and use ``torch.distributed`` (NCCL on CUDA, Gloo on CPU); each rank takes every N-th batch and
  only rank 0 writes. A plain ``python script.py`` is world size 1.
* Checkpoints: ``checkpoint.safetensors`` in the output folder holds the model weights
  (``model.*``), the Adam state (``optimizer.*``) and JSON metadata (epoch, step, config,
  optimizer hyper-parameters, loss history), written atomically; ``--resume`` continues from it,
  ``--resume-from FILE`` from a checkpoint elsewhere (e.g. a small one committed to the repository
  after a previous session: ``checkpoint_dtype="bfloat16"`` stores weights and Adam moments in
  bfloat16, half the size; they are restored to float32).
* Random crops (:func:`random_crops`): the networks are fully convolutional (plus self-attention,
  which takes any number of positions), so they can be trained on crops of full-size slices and
  applied at full size.
"""
import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="JSON file of config fields")
    parser.add_argument("--data", type=Path, required=True, help=".npz made by Training/make_lesion_slices.py")
    parser.add_argument("--out", type=Path, required=True, help="output folder (checkpoint, weights, card, log)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.safetensors")
    parser.add_argument("--resume-from", type=Path, default=None, metavar="CHECKPOINT",
                        help="continue from this checkpoint file (e.g. one committed by an earlier session)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop (and save) after this many optimizer steps in this run (timing, short sessions)")
    parser.add_argument("--time-budget-min", type=float, default=None,
                        help="stop (and save) after this many minutes of wall time")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override one config field (repeatable), e.g. --set epochs=40")


def build_config(config_class, args: argparse.Namespace, section: Optional[str] = None):
    """Defaults <- ``--config`` JSON (its ``section`` when it has one; keys starting with ``_`` are
    comments) <- ``--set FIELD=VALUE`` (values parsed as JSON when possible)."""
    values: Dict[str, Any] = {}
    if args.config is not None:
        loaded = json.loads(Path(args.config).read_text())
        if section is not None and isinstance(loaded.get(section), dict):
            loaded = loaded[section]
        values.update({k: v for k, v in loaded.items() if not k.startswith("_") and not isinstance(v, dict)})
    for item in args.set:
        key, _, raw = item.partition("=")
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    names = {f.name for f in dataclasses.fields(config_class)}
    unknown = set(values) - names
    if unknown:
        raise SystemExit(f"unknown config field(s): {', '.join(sorted(unknown))}")
    for f in dataclasses.fields(config_class):
        if f.name in values and isinstance(f.default, tuple):
            values[f.name] = tuple(values[f.name])
    return config_class(**values)


def setup_distributed(device_name: str) -> Tuple[int, int, "object"]:
    """(rank, world size, torch device); initialises the process group under torchrun."""
    import torch

    from AnonMRILib.device import resolve_device

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = resolve_device(device_name)
    if world_size > 1:
        import torch.distributed as dist

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device.type == "cuda":
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return rank, world_size, device


def wrap_ddp(model, device, world_size: int):
    if world_size <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def reduce_mean(value: float, world_size: int) -> float:
    if world_size <= 1:
        return value
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor)
    return float(tensor.item() / world_size)


def save_checkpoint(path: Path, model, optimizer, metadata: Dict[str, Any], dtype: str = "float32") -> None:
    """Model + Adam state + JSON metadata in one safetensors file (atomic). ``dtype="bfloat16"``
    stores floating-point tensors (not step counters or BatchNorm counts) in bfloat16."""
    import torch
    from safetensors.torch import save_file

    def compact(value):
        value = value.detach().cpu().contiguous()
        return value.to(torch.bfloat16) if dtype == "bfloat16" and value.is_floating_point() else value

    tensors = {f"model.{k}": compact(v) for k, v in model.state_dict().items()}
    state = optimizer.state_dict()
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if hasattr(value, "detach"):
                tensors[f"optimizer.{index}.{key}"] = (compact(value) if key != "step" else value.detach().cpu()
                                                       ).reshape(value.shape)
    meta = dict(metadata)
    meta["param_groups"] = state["param_groups"]
    temporary = path.with_name(path.name + ".tmp")
    save_file(tensors, str(temporary), metadata={"json": json.dumps(meta)})
    temporary.replace(path)


def load_checkpoint(path: Path, model, optimizer, device) -> Dict[str, Any]:
    """Restore model and optimizer from :func:`save_checkpoint`; returns its metadata."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as handle:
        meta = json.loads(handle.metadata()["json"])
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    import torch

    as_float = lambda v: v.float() if v.dtype == torch.bfloat16 else v  # noqa: E731 (compact checkpoints)
    model.load_state_dict({k[len("model."):]: as_float(v) for k, v in tensors.items() if k.startswith("model.")})
    state: Dict[int, Dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = as_float(value).to(device) if key != "step" else value
    optimizer.load_state_dict({"state": state, "param_groups": meta.pop("param_groups")})
    return meta


def initialize_from(model, path: Path) -> int:
    """Copy every tensor of ``path`` (a training checkpoint's ``model.*`` or a weights file) whose name and
    shape match into ``model`` (e.g. batch-norm weights into group-norm ones); returns the count."""
    from safetensors import safe_open

    state = model.state_dict()
    copied = 0
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        for name in handle.keys():
            key = name[len("model."):] if name.startswith("model.") else name
            if key in state and tuple(handle.get_slice(name).get_shape()) == tuple(state[key].shape):
                state[key] = handle.get_tensor(name).to(state[key].dtype)
                copied += 1
    model.load_state_dict(state)
    print(f"initialised {copied} of {len(state)} tensors from {path}", flush=True)
    return copied


def resume_state(args: argparse.Namespace, model, optimizer, device) -> Tuple[int, int, list, float]:
    """(epoch, step, history, elapsed_s) from ``args.out/checkpoint.safetensors`` with ``--resume``,
    else a fresh start (0, 0, [], 0.0); restores model and optimizer when resuming."""
    checkpoint_path = args.out / "checkpoint.safetensors"
    if getattr(args, "resume_from", None) is not None:
        if not Path(args.resume_from).is_file():
            raise SystemExit(f"--resume-from: no checkpoint at {args.resume_from}")
        checkpoint_path = Path(args.resume_from)
    elif not (args.resume and checkpoint_path.is_file()):
        return 0, 0, [], 0.0
    meta = load_checkpoint(checkpoint_path, model, optimizer, device)
    learning_rate = getattr(args, "learning_rate", None)
    if learning_rate is not None:  # the run's config wins over the checkpoint's (e.g. a lower rate to finish)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
    print(f"resumed at epoch {meta['epoch']}, step {meta['step']}", flush=True)
    return meta["epoch"], meta["step"], meta["history"], meta["elapsed_s"]


def epoch_batches(count: int, batch_size: int, seed: int, epoch: int, rank: int, world_size: int) -> list:
    """This rank's full batches of one epoch: a permutation seeded by (seed + epoch), shared by all
    ranks, cut into ``batch_size`` index tensors and dealt round-robin over the ranks."""
    import torch

    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed + epoch))
    batches = [order[i:i + batch_size] for i in range(0, count - batch_size + 1, batch_size)]
    return batches[rank::world_size]


class WallClock:
    """Remaining-time bookkeeping for ``--time-budget-min``."""

    def __init__(self, budget_min: Optional[float]) -> None:
        self.start = time.time()
        self.budget_s = None if budget_min is None else 60.0 * budget_min

    @property
    def elapsed(self) -> float:
        return time.time() - self.start

    def out_of_time(self, margin_s: float = 0.0) -> bool:
        return self.budget_s is not None and self.elapsed + margin_s >= self.budget_s


def log_line(path: Path, record: Dict[str, Any]) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def random_crops(generator, size: int, *tensors, foreground_fraction: float = 0.0):
    """The same random ``size`` x ``size`` window of each sample of the (B, C, H, W) ``tensors``
    (a different window per sample; ``size`` >= H, W or 0 returns them unchanged). With
    ``foreground_fraction`` > 0, that share of the windows is centred on a random nonzero pixel of
    the first tensor (the brain, on a skull-stripped slice) instead of anywhere: uniform windows of
    a 240 mm field of view are half background."""
    import torch

    height, width = tensors[0].shape[-2:]
    if not size or (size >= height and size >= width):
        return tensors
    count = tensors[0].shape[0]
    rows = torch.randint(0, height - size + 1, (count,), generator=generator).tolist()
    cols = torch.randint(0, width - size + 1, (count,), generator=generator).tolist()
    if foreground_fraction > 0:
        chosen = (torch.rand(count, generator=generator) < foreground_fraction).tolist()
        for i in range(count):
            pixels = torch.nonzero(tensors[0][i, 0] > 0)
            if chosen[i] and len(pixels):
                r, c = pixels[int(torch.randint(0, len(pixels), (1,), generator=generator))].tolist()
                rows[i] = min(max(r - size // 2, 0), height - size)
                cols[i] = min(max(c - size // 2, 0), width - size)
    return tuple(torch.stack([t[i, :, r:r + size, c:c + size] for i, (r, c) in enumerate(zip(rows, cols))])
                 for t in tensors)


def random_tissue_contrast(images, generator, probability: float, knots: int = 5):
    """Each (B, 1, H, W) image in [0, 1] remapped, with ``probability``, by a random piecewise-linear
    intensity curve through ``knots`` equally spaced knots, applied to its nonzero (brain) pixels only:
    increasing (another T1 weighting), decreasing (T2/PD-like: CSF brightest) or unordered (FLAIR-like:
    grey above white, CSF dark), one third each; knot values uniform in [0.05, 1]. So the VAEs see
    the contrasts the brain prior renders (the data set itself is post-contrast T1-like)."""
    import torch

    out = images.clone()
    for i in range(images.shape[0]):
        if float(torch.rand(1, generator=generator)) >= probability:
            continue
        values = 0.05 + 0.95 * torch.rand(knots, generator=generator)
        kind = int(torch.randint(0, 3, (1,), generator=generator))
        if kind == 0:
            values = values.sort().values
        elif kind == 1:
            values = values.sort(descending=True).values
        x = images[i].clamp(0.0, 1.0) * (knots - 1)
        low = x.floor().clamp(max=knots - 2).long()
        fraction = x - low
        mapped = values[low] * (1.0 - fraction) + values[low + 1] * fraction
        out[i] = torch.where(images[i] > 0, mapped, images[i])
    return out


def autocast(device, enabled: bool):
    """bfloat16 autocast on CUDA or the CPU when ``enabled`` (on a CPU with AMX/AVX-512 BF16 it made
    a VAE step 1.75x faster here; the losses are computed in float32)."""
    import contextlib

    import torch

    if not enabled:
        return contextlib.nullcontext()
    kind = getattr(device, "type", str(device))
    return torch.autocast("cuda" if kind == "cuda" else "cpu", dtype=torch.bfloat16)
