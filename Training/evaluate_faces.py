#!/usr/bin/env python
"""Judge remodeled and refaced faces with an open detector and recognizer (dlib), head by head.

For every head given (``--head NAME=IMAGE[,MASK]``) and every method (``--method reface`` and/or
``--method remodel[=WEIGHTS]``, several ``--seeds``), the script:

1. runs the method (brain mask: the given one, else the default backend) and checks the brain;
2. renders the original and the output in four views -- anterior, both profiles, three-quarter --
   and writes ``OUT/<head>_<method>_seed<N>.png`` (before on top, after below);
3. **detector**: dlib's HOG frontal detector score of the anterior rendering (and of the best of
   anterior / +-20 deg), before and after;
4. **recognizer**: dlib's ResNet descriptor of the best-detected of those three views; distances of
   every output to every original in the gallery (all heads given). Reported per output: the
   distance to its own original, the nearest gallery head and its rank; and per original, a
   re-rendering of the same head (the three views turned by 3 deg azimuth and 2 deg elevation) as
   the same-person calibration;
5. **hull**: the distance of each output to the outputs of the *other* heads (what the hull and
   brain alone make different between two refaced people) next to its distance to its own original;
6. **memorisation**: the distance of every output to each head listed by ``--training-heads``
   (individual heads among ``--head`` that the weights were trained on; an average head is not an
   individual) and to each ``--training-head NAME=IMAGE`` (a training head that is only rendered
   and described, not remodeled and not in the gallery: e.g. the synthetic MakeHuman people of
   ``Training/make_synthetic_heads.py``);
7. **template kinship**: the distance of each ``--reference-head NAME=IMAGE`` (e.g. the REFACE
   template, whose skin every prior-based output wears) to each training head: a training head
   that is this close to the template is as close to any output made from it, memorised or not.

``--method`` may be left out for a calibration-only run (originals, references, training heads).
Writes ``OUT/faces.json`` and ``OUT/faces.md``. Renderings are untextured: dlib's distances are
compressed on them (module docstring of :mod:`AnonMRILib.evaluation.face_recognition`), so the
tables report ranks and the same-person calibration next to raw distances.

Example (the committed docs/cpgan figures)::

    python Training/evaluate_faces.py --out docs/cpgan \\
        --head sub-01=sub-01_T1w.nii.gz,sub-01_mask.nii.gz --head robex-atlas=atlas.nii.gz,atlas_mask.nii.gz \\
        --head sample --method reface --method remodel --seeds 0 1 --training-heads robex-atlas
"""
import argparse
import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

VIEWS = (("anterior", 0.0, 0.0), ("left", 0.0, 0.0), ("right", 0.0, 0.0), ("anterior", 35.0, 10.0))
DETECTION_VIEWS = (("anterior", 0.0, 0.0), ("anterior", 20.0, 0.0), ("anterior", -20.0, 0.0))


def parse_head(text: str):
    from AnonMRILib.io import load_volume
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    name, _, paths = text.partition("=")
    if name == "sample" and not paths:
        return name, load_sample_head(), load_sample_brain_mask()
    image, _, mask = paths.partition(",")
    volume = load_volume(image)
    return name, volume, (load_volume(mask) if mask else None)


def render_views(volume, views, size: int, iso_level: Optional[float] = None) -> List[np.ndarray]:
    from AnonMRILib.rendering import SurfaceRenderer, make_camera

    renderer = SurfaceRenderer(volume, iso_level=iso_level) if iso_level is not None else SurfaceRenderer(volume)
    return [renderer.render(make_camera(v, a, e), size=size).image for v, a, e in views]


def face_record(recognizer, volume, size: int, iso_level: Optional[float] = None) -> Dict:
    """Detector scores and the descriptor of the best-detected view."""
    images = render_views(volume, DETECTION_VIEWS, size, iso_level)
    anterior = recognizer.detect(images[0])
    descriptor, best = recognizer.describe_views(images)
    return {"anterior_score": None if anterior is None else anterior.score,
            "best_score": None if descriptor is None else best, "descriptor": descriptor}


def run_method(method: str, volume, mask, seed: int):
    from AnonMRILib.pipelines.reface import reface_with_details
    from AnonMRILib.pipelines.remodel import remodel_face_with_details

    name, _, weights = method.partition("=")
    if name == "reface":
        return reface_with_details(volume, brain_mask=mask, seed=seed)
    if name == "remodel":
        return remodel_face_with_details(volume, brain_mask=mask, weights=weights or None, device="cpu", seed=seed)
    raise SystemExit(f"unknown method {method!r} (reface, remodel[=WEIGHTS])")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from AnonMRILib.evaluation.face_recognition import FaceRecognizer, face_distance
    from AnonMRILib.rendering import save_png
    from AnonMRILib.transforms.brain_mask import resolve_brain_mask

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", action="append", required=True, help="NAME=IMAGE[,MASK] or 'sample'")
    parser.add_argument("--method", action="append", default=[], help="reface | remodel[=WEIGHTS]")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--training-heads", nargs="*", default=[], help="individual heads the weights saw")
    parser.add_argument("--training-head", action="append", default=[], metavar="NAME=IMAGE",
                        help="a training head outside the gallery, only for the memorisation distances")
    parser.add_argument("--reference-head", action="append", default=[], metavar="NAME=IMAGE",
                        help="a head (e.g. the template) whose distance to every training head is reported")
    parser.add_argument("--size", type=int, default=256, help="rendering size (pixels)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    recognizer = FaceRecognizer()
    heads = [parse_head(text) for text in args.head]
    originals: Dict[str, Dict] = {}
    masks = {}
    for name, volume, mask in heads:
        masks[name] = resolve_brain_mask(volume, mask)
        record = face_record(recognizer, volume, args.size)
        again = render_views(volume, [(v, a + 3.0, e + 2.0) for v, a, e in DETECTION_VIEWS], args.size)
        other = recognizer.describe_views(again)[0]
        record["same_person_distance"] = (face_distance(record["descriptor"], other)
                                          if record["descriptor"] is not None and other is not None else None)
        originals[name] = record
        print(f"{name}: detector {record['anterior_score']}, same-person re-rendering "
              f"{record['same_person_distance']}", flush=True)

    training_only = {}
    for text in args.training_head:
        name, volume, _ = parse_head(text)
        training_only[name] = recognizer.describe_views(render_views(volume, DETECTION_VIEWS, args.size))[0]
    training_descriptors = dict(training_only)
    training_descriptors.update({n: originals[n]["descriptor"] for n in args.training_heads})
    references = {}
    for text in args.reference_head:
        name, volume, _ = parse_head(text)
        descriptor = recognizer.describe_views(render_views(volume, DETECTION_VIEWS, args.size))[0]
        references[name] = {n: (face_distance(descriptor, d) if descriptor is not None and d is not None else None)
                            for n, d in training_descriptors.items()}

    outputs: List[Dict] = []
    for name, volume, _ in heads:
        for method in args.method:
            for seed in args.seeds:
                started = time.time()
                output, details = run_method(method, volume, masks[name], seed)
                seconds = time.time() - started
                brain = np.asarray(masks[name].array) != 0
                assert np.array_equal(np.asarray(output.array)[brain], np.asarray(volume.array)[brain])
                before = render_views(volume, VIEWS, args.size)
                after = render_views(output, VIEWS, args.size)
                name_, _, weights = method.partition("=")
                label = f"{name_}-{Path(weights).stem}" if weights else name_  # two weights files, two labels
                figure = np.concatenate([np.concatenate(before, 1), np.concatenate(after, 1)], 0)
                save_png(figure, args.out / f"{name}_{label}_seed{seed}.png")
                record = face_record(recognizer, output, args.size)
                record.update({"head": name, "method": label, "seed": seed, "seconds": round(seconds, 1)})
                outputs.append(record)
                print(f"{name} {label} seed {seed}: detector {record['anterior_score']} ({seconds:.0f} s)", flush=True)

    names = [name for name, _, _ in heads]
    for record in outputs:
        descriptor = record.pop("descriptor")
        distances = {n: (face_distance(descriptor, originals[n]["descriptor"])
                         if descriptor is not None and originals[n]["descriptor"] is not None else None) for n in names}
        record["distance_to_originals"] = distances
        valid = {n: d for n, d in distances.items() if d is not None}
        record["nearest_original"] = min(valid, key=valid.get) if valid else None
        own = distances.get(record["head"])
        record["rank_of_own_original"] = (1 + sum(1 for n, d in valid.items() if n != record["head"] and d <= own)
                                          if own is not None else None)
        record["descriptor"] = descriptor
    for record in outputs:
        others = [face_distance(record["descriptor"], r["descriptor"]) for r in outputs
                  if r["head"] != record["head"] and r["method"] == record["method"] and r["seed"] == record["seed"]
                  and record["descriptor"] is not None and r["descriptor"] is not None]
        record["distance_to_other_heads_outputs"] = min(others) if others else None
        record["training_head_distances"] = {n: record["distance_to_originals"].get(n) for n in args.training_heads}
        record["training_head_distances"].update(
            {n: (face_distance(record["descriptor"], d) if record["descriptor"] is not None and d is not None else None)
             for n, d in training_only.items()})
    for record in outputs:
        record.pop("descriptor")
    descriptors = {name: record.pop("descriptor") for name, record in originals.items()}
    gallery = {a: {b: None for b in names} for a in names}
    summary = {"originals": originals, "outputs": outputs, "gallery_heads": names, "views": VIEWS,
               "detection_views": DETECTION_VIEWS, "rendering_size": args.size, "distance_between_originals": gallery,
               "reference_to_training_heads": references}
    for a in names:
        for b in names:
            if descriptors[a] is not None and descriptors[b] is not None:
                gallery[a][b] = round(face_distance(descriptors[a], descriptors[b]), 3)
    (args.out / "faces.json").write_text(json.dumps(summary, indent=1, default=float), encoding="utf-8")
    (args.out / "faces.md").write_text(markdown(summary), encoding="utf-8")
    print(markdown(summary))
    return 0


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def markdown(summary: Dict) -> str:
    lines = ["| head | detector score (anterior) | same-person re-rendering distance |", "|---|---|---|"]
    for name, record in summary["originals"].items():
        lines.append(f"| {name} (original) | {_fmt(record['anterior_score'])} | {_fmt(record['same_person_distance'])} |")
    lines += ["", "| head | method | seed | detector (anterior) | detector (best of 3) | distance to own original | "
              "rank of own original | nearest original | nearest other head's output | training-head distances | s |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["outputs"]:
        training = ", ".join(f"{k} {_fmt(v)}" for k, v in r["training_head_distances"].items()) or "-"
        lines.append(f"| {r['head']} | {r['method']} | {r['seed']} | {_fmt(r['anterior_score'])} | {_fmt(r['best_score'])} | "
                     f"{_fmt(r['distance_to_originals'].get(r['head']))} | {_fmt(r['rank_of_own_original'])} | "
                     f"{_fmt(r['nearest_original'])} | {_fmt(r['distance_to_other_heads_outputs'])} | {training} | "
                     f"{_fmt(r['seconds'])} |")
    names = summary["gallery_heads"]
    lines += ["", "Distances between the original heads (dlib descriptor, best of 3 views):", "",
              "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for a in names:
        lines.append(f"| {a} | " + " | ".join(_fmt(summary["distance_between_originals"][a][b]) for b in names) + " |")
    references = summary.get("reference_to_training_heads") or {}
    if references:
        training = list(next(iter(references.values())))
        lines += ["", "Distances of the reference heads to the training heads:", "",
                  "| | " + " | ".join(training) + " |", "|---" * (len(training) + 1) + "|"]
        for name, distances in references.items():
            lines.append(f"| {name} | " + " | ".join(_fmt(distances[n]) for n in training) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
