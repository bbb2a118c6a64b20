"""Time one Adam step of the lesion VAEs + joint decoder (the paper-resolution training cost).

Random slices (the cost does not depend on the content) of ``--image-size`` pixels, cut to
``--crop`` (0 = whole slices) as ``train_lesion_vae.py`` does, batch ``--batch``, widths
``--channels``. Reports, after ``--warmup`` untimed steps, the wall time and the process CPU time
per step (the CPU time is what the step costs; on a machine shared with other jobs the wall time
is longer), and the parameter count. Example (the figures in the README's lesion section)::

    OMP_NUM_THREADS=2 nice -n 10 python Training/benchmark_lesion_training.py --channels 32 64 128 \\
        --image-size 240 --crop 96 --batch 8 --steps 3 --threads 2
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import torch

    from AnonMRILib.models.lesion_vae import LesionPreservingAutoencoder, LesionVAEConfig, lesion_vae_loss

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--channels", type=int, nargs=3, default=(32, 64, 128))
    parser.add_argument("--image-size", type=int, default=240)
    parser.add_argument("--crop", type=int, default=96)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = LesionVAEConfig(image_size=args.image_size, channels=tuple(args.channels))
    model = LesionPreservingAutoencoder(config).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    side = args.crop or args.image_size
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(args.batch, 1, side, side, generator=generator).to(device)
    m = (torch.rand(args.batch, 1, side, side, generator=generator) > 0.9).float().to(device)
    walls, cpus = [], []
    for step in range(args.warmup + args.steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall, cpu = time.perf_counter(), time.process_time()
        loss, _ = lesion_vae_loss(model(x, m), x, 16.0, config.kl_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    result = {"channels": list(args.channels), "image_size": args.image_size, "crop": args.crop, "batch": args.batch,
              "threads": torch.get_num_threads(), "device": str(device),
              "parameters_millions": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
              "wall_s_per_step": round(sum(walls) / len(walls), 2), "cpu_s_per_step": round(sum(cpus) / len(cpus), 2)}
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
