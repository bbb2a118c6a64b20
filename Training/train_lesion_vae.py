"""Train the background VAE, lesion VAE and joint decoder (paper 4.4.1) on lesion slices.

Data: a LesionSliceSet .npz (``Training/make_lesion_slices.py``, or BraTS2020 slices written with
``AnonMRILib.datasets.brats``); the split is by patient (``split_seed``, ``test_fraction``) and the
same split is used by ``train_lesion_diffusion.py`` and ``evaluate_lesion.py``.

Loss: ``alpha_v * (MSE_background + MSE_lesion + MSE_whole) + kl_weight * KL`` with alpha_v = 16
halved every ``halve_every`` epochs down to 1 (paper: 10; the CPU run here used a smaller value so
the schedule completes within its wall-time budget -- the model card records it).

    python Training/train_lesion_vae.py --data slices_64.npz --out runs/vae --time-budget-min 25
    torchrun --nproc_per_node 4 Training/train_lesion_vae.py --data ... --out ...   # DDP

Paper resolution (240 x 240 slices, [32 x 30 x 30] latents): ``--config
Training/configs/lesion_paper_240.json`` trains on random ``crop_size`` crops of the full slices
(the networks are fully convolutional, applied at full size; held-out metrics are computed on
whole 240 x 240 slices), with the widths of that file; ``--device cuda``, ``amp`` (bfloat16
autocast on CUDA), ``checkpoint_dtype="bfloat16"`` for small checkpoints, ``--resume-from`` to
continue one across sessions, ``--max-steps`` to stop after N steps. The README's lesion section
has the exact commands.

Outputs in ``--out``: checkpoint.safetensors (resume), lesion_vae.safetensors (weights),
lesion_vae.json (model card), log.jsonl.
"""
import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lesion_training_common import (WallClock, add_common_arguments, autocast, build_config,  # noqa: E402
                                    epoch_batches, initialize_from, log_line, random_crops, random_tissue_contrast,
                                    reduce_mean, resume_state, save_checkpoint, setup_distributed, wrap_ddp)


@dataclass(frozen=True)
class VAETrainingConfig:
    image_size: int = 64
    latent_channels: int = 16
    channels: Tuple[int, int, int] = (16, 32, 48)
    kl_weight: float = 1e-3
    attention_window: int = 0
    norm: str = "batch"
    output_activation: str = "none"
    #: start from these weights (a checkpoint or weights file; matching tensors only, e.g. another norm)
    init_from: str = ""
    epochs: int = 50
    batch_size: int = 16
    learning_rate: float = 1e-3
    alpha_initial: float = 16.0
    halve_every: int = 10
    alpha_minimum: float = 1.0
    seed: int = 0
    split_seed: int = 0
    test_fraction: float = 0.2
    checkpoint_every_steps: int = 100
    horizontal_flip: bool = True
    crop_size: int = 0
    #: share of the crops centred on the brain (the rest anywhere in the slice)
    crop_foreground_fraction: float = 0.0
    #: share of the training slices given a random tissue contrast (T2/FLAIR-like included)
    contrast_augmentation: float = 0.0
    amp: bool = False
    #: batch-norm layers in eval mode while training (their running statistics fixed, e.g. those of a
    #: resumed run): the weights adapt to the statistics the model is applied with
    freeze_batch_norm: bool = False
    #: channels-last memory on the CPU (group normalisation ran 2.5x faster per step with it here)
    channels_last: bool = False
    checkpoint_dtype: str = "float32"
    eval_max_slices: int = 0
    #: every this many steps, whole-slice SSIM of the joint reconstruction on ``monitor_slices``
    #: held-out slices goes into the log (0: never)
    monitor_every_steps: int = 0
    monitor_slices: int = 16


def load_split(data_path: Path, split_seed: int, test_fraction: float, image_size: int):
    """(train set, test set, split dict) of a LesionSliceSet file, split by patient."""
    from AnonMRILib.datasets.slices import LesionSliceSet, patient_split

    slices = LesionSliceSet.load(data_path).resized(image_size)
    train_ids, test_ids = patient_split(slices.patients, (1.0 - test_fraction, test_fraction), seed=split_seed)
    split = {"train_patients": train_ids.tolist(), "test_patients": test_ids.tolist()}
    return slices.of_patients(train_ids), slices.of_patients(test_ids), split


def main(argv=None) -> int:
    import numpy as np
    import torch

    from AnonMRILib.evaluation.image_metrics import summarize
    from AnonMRILib.models.lesion_vae import LesionPreservingAutoencoder, LesionVAEConfig, alpha_v_schedule, lesion_vae_loss
    from AnonMRILib.models.lesion_weights import save_model, sha256_of

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    config = build_config(VAETrainingConfig, args, section="vae")
    if config.crop_size % 8 or config.image_size % 8:
        raise SystemExit("image_size and crop_size must be multiples of 8")
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world_size, device = setup_distributed(args.device)
    clock = WallClock(args.time_budget_min)
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / "log.jsonl"

    train, test, split = load_split(args.data, config.split_seed, config.test_fraction, config.image_size)
    model_config = LesionVAEConfig(image_size=config.image_size, latent_channels=config.latent_channels,
                                   channels=config.channels, kl_weight=config.kl_weight,
                                   attention_window=config.attention_window, norm=config.norm,
                                   output_activation=config.output_activation)
    torch.manual_seed(config.seed)
    model = LesionPreservingAutoencoder(model_config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    checkpoint_path = args.out / "checkpoint.safetensors"
    if config.init_from:
        initialize_from(model, Path(config.init_from))
    memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    args.learning_rate = config.learning_rate
    epoch, step, history, elapsed_before = resume_state(args, model, optimizer, device)
    trainer = wrap_ddp(model, device, world_size)
    images = torch.from_numpy(train.images[:, None])
    masks = torch.from_numpy(train.masks[:, None].astype(np.float32))
    generator = torch.Generator().manual_seed(config.seed * 1000 + rank)

    def checkpoint(epoch_done: int) -> None:
        if rank == 0:
            save_checkpoint(checkpoint_path, model, optimizer,
                            {"epoch": epoch_done, "step": step, "history": history, "config": asdict(config),
                             "elapsed_s": elapsed_before + clock.elapsed}, dtype=config.checkpoint_dtype)

    monitor = test.subset(np.linspace(0, len(test) - 1, min(config.monitor_slices, len(test))).astype(int))

    def train_mode() -> None:
        model.train()
        if config.freeze_batch_norm:
            for module in model.modules():
                if isinstance(module, torch.nn.BatchNorm2d):
                    module.eval()

    def monitor_ssim() -> float:
        model.eval()
        with torch.no_grad():  # float32, as the pipeline runs the model
            x = torch.from_numpy(monitor.images[:, None]).to(device)
            m = torch.from_numpy(monitor.masks[:, None].astype(np.float32)).to(device)
            whole = model.reconstruct(x, m)["whole_hat"].float().clamp(0, 1)
        train_mode()
        return summarize(monitor.images, whole[:, 0].cpu().numpy())["ssim"]

    stopped_early = False
    steps_this_run = 0
    import time

    step_clock = time.perf_counter()
    while epoch < config.epochs and not stopped_early:
        train_mode()
        alpha_v = alpha_v_schedule(epoch, config.alpha_initial, config.halve_every, config.alpha_minimum)
        sums, done = {}, 0
        for batch_index in epoch_batches(len(images), config.batch_size, config.seed, epoch, rank, world_size):
            x, m = images[batch_index], masks[batch_index]
            if config.horizontal_flip and torch.rand(1, generator=generator).item() < 0.5:
                x, m = x.flip(-2), m.flip(-2)
            x, m = random_crops(generator, config.crop_size, x, m,
                                foreground_fraction=config.crop_foreground_fraction)
            if config.contrast_augmentation > 0:
                x = random_tissue_contrast(x, generator, config.contrast_augmentation)
            x, m = x.to(device, memory_format=memory_format), m.to(device, memory_format=memory_format)
            with autocast(device, config.amp):
                outputs = trainer(x, m, None)
            outputs = {k: v.float() for k, v in outputs.items()}
            loss, parts = lesion_vae_loss(outputs, x, alpha_v, model_config.kl_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            done += 1
            steps_this_run += 1
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + value
            if step % config.checkpoint_every_steps == 0:
                checkpoint(epoch)
            if config.monitor_every_steps and step % config.monitor_every_steps == 0 and rank == 0:
                log_line(log_path, {"step": step, "held_out_monitor_ssim": round(monitor_ssim(), 4),
                                    "elapsed_s": round(elapsed_before + clock.elapsed, 1)})
            if clock.out_of_time() or (args.max_steps is not None and steps_this_run >= args.max_steps):
                stopped_early = True
                break
        count = max(1, done)
        record = {"epoch": epoch, "step": step, "elapsed_s": round(elapsed_before + clock.elapsed, 1),
                  "seconds_per_step": round((time.perf_counter() - step_clock) / count, 3)}
        step_clock = time.perf_counter()
        record.update({k: round(reduce_mean(v / count, world_size), 6) for k, v in sums.items()})
        if not stopped_early:
            history.append(record)
            epoch += 1
        if rank == 0:
            log_line(log_path, record)
        checkpoint(epoch)

    if rank == 0:
        model.eval()
        if config.eval_max_slices and len(test) > config.eval_max_slices:
            test = test.subset(np.linspace(0, len(test) - 1, config.eval_max_slices).astype(int))
        with torch.no_grad():
            x = torch.from_numpy(test.images[:, None]).to(device)
            m = torch.from_numpy(test.masks[:, None].astype(np.float32)).to(device)
            outputs = {k: torch.cat([model.reconstruct(x[i:i + 64], m[i:i + 64])[k] for i in range(0, len(x), 64)])
                       for k in ("background_hat", "lesion_hat", "whole_hat")}
        background, lesion = x * (1 - m), x * m
        metrics = {name: summarize(target[:, 0].cpu().numpy(), outputs[key][:, 0].clamp(0, 1).cpu().numpy())
                   for name, target, key in (("background", background, "background_hat"),
                                             ("lesion", lesion, "lesion_hat"), ("whole", x, "whole_hat"))}
        weights_path = args.out / "lesion_vae.safetensors"
        save_model(weights_path, model, "lesion_vae")
        data_card_path = Path(args.data).with_suffix(".json")
        card = {
            "model": "lesion-preserving VAEs (background_vae, lesion_vae, joint_decoder)",
            "paper": "lesion-preserving-vae-latent-diffusion, section 4.4.1",
            "config": model_config.to_dict(), "training": asdict(config),
            "data": json.loads(data_card_path.read_text()) if data_card_path.is_file() else str(args.data),
            "train_slices": len(train), "test_slices": len(test), "split": split,
            "epochs_done": epoch, "steps": step, "stopped_by_time_budget": stopped_early,
            "wall_time_s": round(elapsed_before + clock.elapsed, 1), "world_size": world_size,
            "device": str(device), "history": history,
            "held_out_reconstruction": metrics,
            "sha256": sha256_of(weights_path), "size_bytes": weights_path.stat().st_size,
        }
        (args.out / "lesion_vae.json").write_text(json.dumps(card, indent=2))
        print(json.dumps({"held_out_reconstruction": metrics, "epochs": epoch, "steps": step}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
