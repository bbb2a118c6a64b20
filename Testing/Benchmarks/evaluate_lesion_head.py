"""Whole-head lesion case (pyradiomics brain1): quality of each face method, and the before/after figure.

For a whole-head scan with a lesion label: one brain mask (HD-BET, or ``--brain-mask``), then
``anonymize_lesions`` with ``--exact-lesion`` for every face method of ``--face-methods``, and the
same with the options given by ``--variants`` (e.g. ``prior=none``, the paper's generator, or the
brain-mask fill off; the default is the library's, the donor-brain prior). Per run: head
outline Dice (Otsu head mask of the output vs the input's, ``evaluate_lesion.head_metrics``),
sharpness ratio inside the brain outside the lesion (pooled over the volume / median slice),
lesion bit-exactness, the fraction of the brain mask the generated brain did not reach (filled),
wall and process CPU seconds. Results go to ``--out`` (JSON) and the figure to ``--figure``:
an axial slice through the lesion and one through the temporal lobes (where the generated brain
covers least of the mask), input then one column per face method.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python Testing/Benchmarks/evaluate_lesion_head.py \\
        PYRAD/data/brain1_image.nrrd PYRAD/data/brain1_label.nrrd --threads 1 \\
        --out docs/evaluation/lesion/whole_head_results.json \\
        --figure docs/evaluation/lesion/whole_head_before_after.png
"""
import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "Training"))

FIGURE_METHODS = ("reface", "remodel", "quickshear", "none")


def parse_variant(text: str):
    """``name:field=value,field=value`` -> (name, {field: value}) with booleans/numbers parsed."""
    name, _, settings = text.partition(":")
    options = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        options[key] = {"true": True, "false": False}.get(value.lower(), value)
        if isinstance(options[key], str):
            try:
                options[key] = float(value) if "." in value else int(value)
            except ValueError:
                pass
    return name, options


def main(argv=None) -> int:
    import torch

    from evaluate_lesion import head_metrics

    from AnonMRILib.io import load_volume
    from AnonMRILib.pipelines.lesion import (LesionAnonymizationConfig, anonymize_lesions_with_details,
                                             load_lesion_models)
    from AnonMRILib.transforms.brain_mask import resolve_brain_mask

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("image", type=Path)
    parser.add_argument("label", type=Path)
    parser.add_argument("--brain-mask", type=Path, default=None, help="default: computed (HD-BET)")
    parser.add_argument("--face-methods", default="reface,remodel,quickshear,none")
    parser.add_argument("--variants", action="append", default=[],
                        help="NAME:face_method=none,fill_brain_mask=false -- an extra run with these config fields")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="results JSON")
    parser.add_argument("--figure", type=Path, default=None, help="before/after PNG")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    image, label = load_volume(args.image), load_volume(args.label)
    lesion = label.array != 0
    wall, cpu = time.perf_counter(), time.process_time()
    mask = load_volume(args.brain_mask) if args.brain_mask else resolve_brain_mask(image)
    results = {"image": args.image.name, "shape": list(image.shape),
               "spacing_mm": [round(float(s), 3) for s in image.spacing], "threads": args.threads,
               "brain_mask": {"source": args.brain_mask.name if args.brain_mask else "hdbet",
                              "wall_s": round(time.perf_counter() - wall, 1),
                              "cpu_s": round(time.process_time() - cpu, 1)},
               "runs": {}}
    brain = (mask.array != 0) | lesion
    # the donor prior (the default) and the paper's generator (prior=none) use different shipped models
    models = {prior: load_lesion_models(None, "cpu", prior=prior == "donor") for prior in ("donor", "none")}
    runs = [(method, {"face_method": method}) for method in args.face_methods.split(",")]
    runs += [parse_variant(text) for text in args.variants]
    outputs = {}
    for name, options in runs:
        config = LesionAnonymizationConfig(exact_lesion=True, **options)
        wall, cpu = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # face method none: the warning is expected here
            output, details = anonymize_lesions_with_details(image, label, config, weights=models[config.prior],
                                                             seed=args.seed, brain_mask=mask)
        run = {"options": options, "wall_s": round(time.perf_counter() - wall, 1),
               "cpu_s": round(time.process_time() - cpu, 1), **head_metrics(image, output, brain, lesion),
               **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in details.items()}}
        results["runs"][name] = run
        outputs[name] = output.array
        print(json.dumps({name: run}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    if args.figure:
        figure(args.figure, image, lesion, mask.array != 0, [(m, outputs[m]) for m in FIGURE_METHODS if m in outputs],
               results["runs"])
    return 0


def figure(path: Path, image, lesion, brain, columns, runs) -> None:
    """Input and one column per face method; rows: the slice with the most lesion, and the slice a
    quarter of the way up the brain (temporal lobes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from AnonMRILib.pipelines.lesion import axial_layout, to_ras_layout

    order, flips = axial_layout(image.affine)
    ras = lambda a: to_ras_layout(np.asarray(a), order, flips)  # noqa: E731
    data, lesion_ras, brain_ras = ras(image.array), ras(lesion), ras(brain)
    present = np.flatnonzero(brain_ras.any(axis=(0, 1)))
    rows = [int(np.argmax(lesion_ras.sum(axis=(0, 1)))), int(present[len(present) // 4])]
    vmax = float(np.percentile(data, 99.5))
    panels = [("input (whole head)", data)] + [(name, ras(array)) for name, array in columns]
    fig, axes = plt.subplots(len(rows), len(panels), figsize=(2.5 * len(panels), 2.7 * len(rows)), squeeze=False)
    for r, k in enumerate(rows):
        for c, (name, volume) in enumerate(panels):
            axis = axes[r, c]
            axis.imshow(np.asarray(volume[:, :, k], dtype=float).T, cmap="gray", origin="lower", vmin=0, vmax=vmax)
            if lesion_ras[:, :, k].any():
                axis.contour(lesion_ras[:, :, k].T, levels=[0.5], colors="r", linewidths=0.4)
            title = name if c == 0 else f"{name}: Dice {runs[name]['head_outline_dice']:.3f}"
            axis.set_title(f"{title}\nslice {k}" if r == 0 else f"slice {k}", fontsize=7)
            axis.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
