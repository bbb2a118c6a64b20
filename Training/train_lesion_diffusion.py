"""Train the conditional latent diffusion U-Net on background latents (paper 4.4.2).

The trained VAE (``--vae``, a lesion_vae.safetensors) encodes every training slice's background
``x * (1 - M)`` once (posterior mean, eval mode); the latents are standardised with one global
shift and scale (stored in the weights' metadata) and the U-Net learns eps-prediction with MSE
(eq. 18) at uniformly drawn t in [0, T), conditioned on grade c (10 % dropped to "unknown"),
lesion mask M and slice depth D. The patient split is the VAE's (same ``split_seed``).

    python Training/train_lesion_diffusion.py --data slices_64.npz --vae runs/vae/lesion_vae.safetensors \\
        --out runs/diffusion --time-budget-min 25
    torchrun --nproc_per_node 4 Training/train_lesion_diffusion.py ...   # DDP

Paper resolution: ``--config Training/configs/lesion_paper_240.json`` (its "diffusion" section)
with the 240 x 240 VAE; the latents are [16 x 30 x 30] means (the encoder's [32 x 30 x 30] output
is mean and log-variance) and small, so the U-Net trains on whole latents. ``amp``,
``checkpoint_dtype``, ``--resume-from``, ``init_from`` and ``--max-steps`` as in ``train_lesion_vae.py``;
``--set init_from=AnonMRILib/weights/lesion_prior/lesion_diffusion.safetensors`` goes on from the shipped
(committed) weights in a later session.

Prior-conditioned model (the default lesion method's learned variation, ``prior_conditioned``): the
U-Net also takes the low-pass of a latent as a condition; in training that is the training slice's own
latent, so the model learns the finer anatomy that goes with a coarse layout (``AnonMRILib.models.
latent_diffusion``). ``contrast_copies`` adds that many encodings of every slice in a random tissue
contrast (T2/FLAIR-like included), since at inference the prior comes in the input's contrast.

Outputs in ``--out``: checkpoint.safetensors (resume), lesion_diffusion.safetensors, lesion_diffusion.json, log.jsonl.
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
                                    epoch_batches, initialize_from, log_line, random_tissue_contrast, reduce_mean,
                                    resume_state, save_checkpoint, setup_distributed, wrap_ddp)
from train_lesion_vae import load_split  # noqa: E402


@dataclass(frozen=True)
class DiffusionTrainingConfig:
    channels: Tuple[int, int, int] = (32, 64, 64)
    embedding_dim: int = 128
    mask_channels: int = 32
    num_classes: int = 2
    num_train_timesteps: int = 1000
    epochs: int = 400
    batch_size: int = 64
    learning_rate: float = 1e-3
    label_dropout: float = 0.1
    seed: int = 0
    split_seed: int = 0
    test_fraction: float = 0.2
    checkpoint_every_steps: int = 200
    amp: bool = False
    checkpoint_dtype: str = "float32"
    #: condition on the brain prior's latent (low-passed; ``prior_smoothing_px`` latent pixels)
    prior_conditioned: bool = False
    prior_smoothing_px: float = 1.0
    #: extra encodings of every training slice with a random tissue contrast (and a random
    #: left-right flip), so the model learns latents of every contrast the prior renders
    contrast_copies: int = 0
    #: the share of the extra encodings that is flipped left-right
    flip_fraction: float = 0.5
    #: start from these weights (e.g. the shipped, committed lesion_prior/lesion_diffusion.safetensors:
    #: a later session goes on from the repository, not from a checkpoint outside it)
    init_from: str = ""


def encode_backgrounds(vae, images, masks, device, batch: int = 64, amp: bool = False):
    """Posterior means of the background encoder for (N, 1, S, S) tensors."""
    import torch

    with torch.no_grad(), autocast(device, amp):
        return torch.cat([vae.encode_background(images[i:i + batch].to(device),
                                                masks[i:i + batch].to(device))[0].float().cpu()
                          for i in range(0, len(images), batch)])


def augmented_copies(images, masks, grades, depths, copies: int, flip_fraction: float, seed: int):
    """The training tensors followed by ``copies`` augmented copies (random tissue contrast, a
    left-right flip for ``flip_fraction`` of them)."""
    import torch

    generator = torch.Generator().manual_seed(seed + 4242)
    all_images, all_masks = [images], [masks]
    for _ in range(copies):
        x = random_tissue_contrast(images, generator, 1.0)
        flip = torch.rand(len(x), generator=generator) < flip_fraction
        x = torch.where(flip[:, None, None, None], x.flip(-2), x)
        all_images.append(x)
        all_masks.append(torch.where(flip[:, None, None, None], masks.flip(-2), masks))
    repeat = copies + 1
    return torch.cat(all_images), torch.cat(all_masks), grades.repeat(repeat), depths.repeat(repeat)


def main(argv=None) -> int:
    import numpy as np
    import torch

    from AnonMRILib.models.latent_diffusion import (ConditionalLatentUNet, LatentDiffusionConfig, diffusion_loss,
                                                    make_ddpm_scheduler)
    from AnonMRILib.models.lesion_weights import load_lesion_vae, save_model, sha256_of

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--vae", type=Path, required=True, help="lesion_vae.safetensors")
    args = parser.parse_args(argv)
    config = build_config(DiffusionTrainingConfig, args, section="diffusion")
    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world_size, device = setup_distributed(args.device)
    clock = WallClock(args.time_budget_min)
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / "log.jsonl"

    vae = load_lesion_vae(args.vae, device)
    image_size = vae.config.image_size
    train, _, split = load_split(args.data, config.split_seed, config.test_fraction, image_size)
    images = torch.from_numpy(train.images[:, None])
    masks = torch.from_numpy(train.masks[:, None].astype(np.float32))
    grades = torch.from_numpy(train.grades)
    depths = torch.from_numpy(train.depths)
    if config.contrast_copies:
        images, masks, grades, depths = augmented_copies(images, masks, grades, depths, config.contrast_copies,
                                                         config.flip_fraction, config.seed)
    latents = encode_backgrounds(vae, images, masks, device)  # float32, as at inference
    latent_shift, latent_scale = float(latents.mean()), float(latents.std())
    latents = (latents - latent_shift) / latent_scale
    del vae, images

    model_config = LatentDiffusionConfig(image_size=image_size, latent_channels=latents.shape[1],
                                         channels=config.channels, embedding_dim=config.embedding_dim,
                                         mask_channels=config.mask_channels, num_classes=config.num_classes,
                                         num_train_timesteps=config.num_train_timesteps,
                                         prior_channels=latents.shape[1] if config.prior_conditioned else 0,
                                         prior_smoothing_px=config.prior_smoothing_px)
    torch.manual_seed(config.seed)
    model = ConditionalLatentUNet(model_config).to(device)
    if config.init_from:
        initialize_from(model, Path(config.init_from))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate)
    scheduler = make_ddpm_scheduler(model_config)
    checkpoint_path = args.out / "checkpoint.safetensors"
    args.learning_rate = config.learning_rate
    epoch, step, history, elapsed_before = resume_state(args, model, optimizer, device)
    trainer = wrap_ddp(model, device, world_size)
    generator = torch.Generator().manual_seed(config.seed * 1000 + rank + 7919 * step)

    def checkpoint(epoch_done: int) -> None:
        if rank == 0:
            save_checkpoint(checkpoint_path, model, optimizer,
                            {"epoch": epoch_done, "step": step, "history": history, "config": asdict(config),
                             "elapsed_s": elapsed_before + clock.elapsed}, dtype=config.checkpoint_dtype)

    stopped_early = False
    steps_this_run = 0
    while epoch < config.epochs and not stopped_early:
        model.train()
        total, done = 0.0, 0
        for batch_index in epoch_batches(len(latents), config.batch_size, config.seed, epoch, rank, world_size):
            with autocast(device, config.amp):
                loss = diffusion_loss(trainer, scheduler, latents[batch_index].to(device),
                                      grades[batch_index].to(device), masks[batch_index].to(device),
                                      depths[batch_index].to(device), generator=generator,
                                      label_dropout=config.label_dropout).float()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            done += 1
            total += float(loss.detach())
            if step % config.checkpoint_every_steps == 0:
                checkpoint(epoch)
            steps_this_run += 1
            if clock.out_of_time() or (args.max_steps is not None and steps_this_run >= args.max_steps):
                stopped_early = True
                break
        record = {"epoch": epoch, "step": step, "elapsed_s": round(elapsed_before + clock.elapsed, 1),
                  "loss": round(reduce_mean(total / max(1, done), world_size), 6)}
        if not stopped_early:
            history.append(record)
            epoch += 1
        if rank == 0 and (epoch % 5 == 0 or stopped_early):
            log_line(log_path, record)
        checkpoint(epoch)

    if rank == 0:
        weights_path = args.out / "lesion_diffusion.safetensors"
        save_model(weights_path, model, "lesion_diffusion",
                   {"latent_scale": repr(latent_scale), "latent_shift": repr(latent_shift)})
        data_card_path = Path(args.data).with_suffix(".json")
        card = {
            "model": "conditional latent diffusion U-Net (eps-prediction) on background latents",
            "paper": "lesion-preserving-vae-latent-diffusion, section 4.4.2",
            "config": model_config.to_dict(), "training": asdict(config),
            "vae": {"file": Path(args.vae).name, "sha256": sha256_of(args.vae)},
            "latent_shift": latent_shift, "latent_scale": latent_scale,
            "data": json.loads(data_card_path.read_text()) if data_card_path.is_file() else str(args.data),
            "train_slices": len(train), "training_latents": len(latents), "split": split,
            "epochs_done": epoch, "steps": step, "stopped_by_time_budget": stopped_early,
            "wall_time_s": round(elapsed_before + clock.elapsed, 1), "world_size": world_size,
            "device": str(device), "history": history[-50:],
            "final_loss": history[-1]["loss"] if history else None,
            "sha256": sha256_of(weights_path), "size_bytes": weights_path.stat().st_size,
        }
        (args.out / "lesion_diffusion.json").write_text(json.dumps(card, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
