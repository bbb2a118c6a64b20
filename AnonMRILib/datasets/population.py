"""A generated population of heads: many "subjects" and "scans" from a few real heads.

There is no real population of whole-head MRIs here, so training and evaluation use one built
from the few real heads available (see DESIGN.md) by *subject-level* variation, and every number
reported on it says so.

Subject (one per ``(head, subject_index)``; id ``"<head>-s0007"``):

* **face and skull shape**: a smooth random displacement field, the sum of a coarse field
  (``shape_control_points``^3 control points, std ``shape_amplitude_mm``: head length, jaw,
  skull outline) and a finer field (``face_control_points``^3, std ``face_amplitude_mm``) that
  is switched on only in front of the brain (anterior of the brain centroid by more than
  ``face_anterior_mm``: nose, lips, eyes, cheeks). Control points are interpolated with cubic
  splines (then trilinear, see :func:`_smooth_field`). Both fields are multiplied by a weight that is exactly 0
  within ``brain_margin_mm`` of the brain and rises smoothly to 1 over ``ramp_mm``: the brain
  and its surroundings are not deformed at all (rigid), and the maximum displacement stays
  below the distance to the brain so no brain tissue is pulled outside the brain mask;
* **face-shaped identity** (when ``face_shape_amplitude`` > 0): a random combination of
  MakeHuman's face morph targets (nose, mouth, eyes, ears, chin, cheeks, forehead) transferred
  onto the head's skin (:mod:`AnonMRILib.datasets.face_shape`), weighted like the fields above
  (exactly 0 near the brain); its random numbers come from their own stream, so switching it on
  leaves the subject's other variation unchanged;
* **intensity**: ``background + s * p * ((x - background) / p) ** g`` with contrast exponent
  ``g`` in ``gamma_range``, scale ``s`` in ``scale_range`` (p = 99th percentile of the head);
* **bias field**: multiplicative ``exp(smooth field)``, std ``bias_amplitude`` (4^3 control
  points).

Scan (id ``"<head>-s0007-scan01"``): the subject seen with a small rigid pose change (rotation
about the brain centroid, std ``scan_rotation_deg`` per axis; translation std
``scan_translation_mm``), a scan-level intensity jitter and Rician noise (std
``noise_fraction`` of p). Shape warp and pose are composed into *one* sampling of the head
(linear) and of the brain mask (nearest neighbour), so the mask follows the image exactly.

Everything is deterministic: the random numbers of subject ``i`` of head ``h`` come from
``numpy.random.default_rng([seed, crc32(h), i])`` (scans: ``[seed, crc32(h), i, 1 + j]``), so a
subject is the same whichever other subjects are generated. Split helpers split by *subject*
so that no subject has scans on both sides.
"""
import re
import zlib
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError
from ..io.volume import Volume, as_binary_mask, require_same_grid

_HEAD_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_SUBJECT_ID = re.compile(r"^(?P<head>[A-Za-z0-9_]+)-s(?P<index>\d{4,})$")
_SCAN_ID = re.compile(r"^(?P<subject>[A-Za-z0-9_]+-s\d{4,})-scan(?P<index>\d{2,})$")


@dataclass(frozen=True, eq=False)
class HeadSource:
    """A real whole-head T1 and its brain mask (same grid) that subjects are generated from.

    ``name``: letters, digits and underscores (it becomes part of subject ids).
    """

    name: str
    volume: Volume
    brain_mask: Volume

    def __post_init__(self) -> None:
        if not _HEAD_NAME.match(self.name):
            raise InputError(f"head name {self.name!r} may only contain letters, digits and '_'")
        require_same_grid(self.volume, self.brain_mask, what="brain mask")
        object.__setattr__(self, "brain_mask", as_binary_mask(self.brain_mask, what="brain mask"))


@dataclass(frozen=True)
class PopulationConfig:
    """How subjects and scans vary (see the module docstring). Lengths in mm, angles in degrees."""

    subjects_per_head: int = 16
    scans_per_subject: int = 2
    seed: int = 0
    shape_control_points: int = 5
    shape_amplitude_mm: float = 3.0
    face_control_points: int = 9
    face_amplitude_mm: float = 1.5
    face_anterior_mm: float = 35.0
    # face-shaped identity (MakeHuman targets): std of the target weights (0 = off), splat width
    face_shape_amplitude: float = 0.0
    face_shape_sigma_mm: float = 6.0
    brain_margin_mm: float = 5.0
    ramp_mm: float = 20.0
    gamma_range: Tuple[float, float] = (0.85, 1.15)
    scale_range: Tuple[float, float] = (0.9, 1.1)
    bias_amplitude: float = 0.08
    scan_rotation_deg: float = 2.0
    scan_translation_mm: float = 2.0
    scan_intensity_jitter: float = 0.02
    noise_fraction: float = 0.01

    def to_dict(self) -> Dict[str, object]:
        from dataclasses import asdict

        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True, eq=False)
class GeneratedScan:
    """One generated scan: float32 image and its uint8 brain mask on the source head's grid."""

    head: str
    subject_index: int
    scan_index: int
    volume: Volume
    brain_mask: Volume

    @property
    def subject_id(self) -> str:
        return subject_id(self.head, self.subject_index)

    @property
    def scan_id(self) -> str:
        return scan_id(self.head, self.subject_index, self.scan_index)


# --- identifiers and splits ------------------------------------------------------------------

def subject_id(head: str, index: int) -> str:
    """``"<head>-s0007"``: the id of subject ``index`` generated from ``head``."""
    return f"{head}-s{int(index):04d}"


def scan_id(head: str, subject_index: int, scan_index: int) -> str:
    """``"<head>-s0007-scan01"``."""
    return f"{subject_id(head, subject_index)}-scan{int(scan_index):02d}"


def parse_subject_id(identifier: str) -> Tuple[str, int]:
    """(head, subject index) of a subject id, or of the subject of a scan id."""
    scan = _SCAN_ID.match(identifier)
    if scan:
        identifier = scan.group("subject")
    match = _SUBJECT_ID.match(identifier)
    if not match:
        raise InputError(f"{identifier!r} is not a generated subject or scan id")
    return match.group("head"), int(match.group("index"))


def subject_of(identifier: str) -> str:
    """The subject id of a subject or scan id."""
    head, index = parse_subject_id(identifier)
    return subject_id(head, index)


def split_subjects(subject_ids: Iterable[str], test_fraction: float = 0.2, seed: int = 0
                   ) -> Tuple[List[str], List[str]]:
    """Random (train, test) split of distinct subject ids, deterministic per seed, disjoint.

    At least one subject goes to each side when there are two or more.
    """
    ids = sorted(set(subject_ids))
    if not 0.0 <= test_fraction <= 1.0:
        raise InputError("test_fraction must lie in [0, 1]")
    rng = np.random.default_rng([int(seed), 0x5B17])
    order = [ids[i] for i in rng.permutation(len(ids))]
    n_test = int(round(test_fraction * len(ids)))
    if len(ids) >= 2 and 0.0 < test_fraction < 1.0:
        n_test = min(max(n_test, 1), len(ids) - 1)
    return sorted(order[n_test:]), sorted(order[:n_test])


def split_scan_ids(scan_ids: Iterable[str], test_fraction: float = 0.2, seed: int = 0
                   ) -> Tuple[List[str], List[str]]:
    """Split scan ids so that all scans of a subject fall on the same side."""
    scan_ids = list(scan_ids)
    train_subjects, _ = split_subjects((subject_of(s) for s in scan_ids), test_fraction, seed)
    keep = set(train_subjects)
    train = [s for s in scan_ids if subject_of(s) in keep]
    test = [s for s in scan_ids if subject_of(s) not in keep]
    return train, test


def split_by_head(ids: Iterable[str], held_out_heads: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(train, test): every subject/scan generated from a head in ``held_out_heads`` is test."""
    held = set(held_out_heads)
    ids = list(ids)
    return ([i for i in ids if parse_subject_id(i)[0] not in held],
            [i for i in ids if parse_subject_id(i)[0] in held])


# --- preparing real heads --------------------------------------------------------------------

def resample_isotropic(volume: Volume, spacing_mm: float, interpolation: str = "linear") -> Volume:
    """``volume`` on an isotropic grid of ``spacing_mm`` with the same orientation and field of view.

    Linear interpolation first smooths with a Gaussian that makes up the resolution difference
    (anti-aliasing); ``"nearest"`` is for masks. Returns float32 (linear) or the input dtype.
    """
    import SimpleITK as sitk

    from ..io.readers import simpleitk_to_numpy
    from ..io.writers import numpy_to_simpleitk

    spacing = volume.spacing
    extent = np.asarray(volume.shape) * spacing
    shape = tuple(int(max(1, round(e / spacing_mm))) for e in extent)
    affine = np.eye(4)
    affine[:3, :3] = volume.direction * spacing_mm
    # same centre of the field of view
    centre = volume.world_coordinates(np.asarray([(np.asarray(volume.shape) - 1) / 2.0]))[0]
    affine[:3, 3] = centre - affine[:3, :3] @ ((np.asarray(shape) - 1) / 2.0)
    source = numpy_to_simpleitk(np.asarray(volume.array, np.float32), volume.affine)
    reference = numpy_to_simpleitk(np.zeros(shape, np.uint8), affine)
    if interpolation == "linear":
        sigma = np.sqrt(np.maximum(spacing_mm ** 2 - spacing ** 2, 0.0)) / 2.3548
        if np.any(sigma > 0.1):
            smoother = sitk.SmoothingRecursiveGaussianImageFilter()
            smoother.SetSigma([float(max(s, 1e-3)) for s in sigma])
            source = smoother.Execute(source)
        method = sitk.sitkLinear
    elif interpolation == "nearest":
        method = sitk.sitkNearestNeighbor
    else:
        raise InputError(f"unknown interpolation {interpolation!r}")
    resampled = sitk.Resample(source, reference, sitk.Transform(), method, 0.0, sitk.sitkFloat32)
    data, _ = simpleitk_to_numpy(resampled)
    if interpolation == "nearest":
        data = data.astype(volume.dtype)
    return Volume(np.ascontiguousarray(data), affine)


def prepare_head(name: str, volume: Volume, brain_mask: Volume, working_spacing_mm: Optional[float] = 2.0
                 ) -> HeadSource:
    """A :class:`HeadSource` with image and mask resampled to ``working_spacing_mm`` (None: as is).

    The mask is resampled linearly and thresholded at 0.5 (smoother than nearest neighbour).
    """
    require_same_grid(volume, brain_mask, what="brain mask")
    if working_spacing_mm is None:
        return HeadSource(name, volume.with_array(np.asarray(volume.array, np.float32)), brain_mask)
    image = resample_isotropic(volume, working_spacing_mm, "linear")
    mask = resample_isotropic(brain_mask.with_array((np.asarray(brain_mask.array) != 0).astype(np.float32)),
                              working_spacing_mm, "linear")
    return HeadSource(name, image, mask.with_array((mask.array >= 0.5).astype(np.uint8)))


# --- generation ------------------------------------------------------------------------------

def _rng(seed: int, head: str, *indices: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), zlib.crc32(head.encode("utf-8"))] + [int(i) for i in indices])


def _smooth_field(rng: np.random.Generator, components: int, control_points: int, shape: Sequence[int],
                  std: float) -> np.ndarray:
    """(components, *shape) float32: N(0, std) control points, smoothly interpolated.

    Cubic-spline interpolation (``scipy.ndimage.zoom``, order 3) onto a grid 4x finer than the
    control points, then trilinear (torch) to ``shape``: smooth like a full cubic spline at a
    fraction of its cost.
    """
    import torch
    import torch.nn.functional as F
    from scipy import ndimage

    control = rng.normal(0.0, std, size=(components, control_points, control_points, control_points))
    fine = np.stack([ndimage.zoom(c, 4, order=3, mode="nearest", grid_mode=True) for c in control])
    field = F.interpolate(torch.from_numpy(fine.astype(np.float32))[None], size=tuple(int(n) for n in shape),
                          mode="trilinear", align_corners=False)[0]
    return field.numpy()


@dataclass(frozen=True, eq=False)
class SubjectVariation:
    """One subject: voxel displacement field (3, X, Y, Z), intensity exponent and scale, bias field."""

    displacement_voxels: np.ndarray
    contrast_exponent: float
    intensity_scale: float
    bias_field: np.ndarray


def _head_statistics(head: HeadSource) -> Tuple[float, float]:
    """(background level, 99th percentile of the head above it) of a head, in its units."""
    data = np.asarray(head.volume.array, np.float32)
    sample = data.ravel()[:: max(1, data.size // 500_000)]
    background = float(np.percentile(sample, 1.0))
    high = float(np.percentile(sample[sample > background], 99.0)) - background if np.any(sample > background) else 1.0
    return background, max(high, 1e-6)


def _brain_centroid_mm(head: HeadSource) -> np.ndarray:
    indices = np.argwhere(head.brain_mask.array != 0)
    return head.volume.world_coordinates(indices.mean(axis=0, keepdims=True))[0]


def _world_grid(volume: Volume) -> np.ndarray:
    """(3, X, Y, Z) RAS mm of every voxel centre."""
    ijk = np.indices(volume.shape, dtype=np.float32)
    affine = volume.affine.astype(np.float32)
    return np.einsum("ab,bxyz->axyz", affine[:3, :3], ijk) + affine[:3, 3, None, None, None]


def subject_variation(head: HeadSource, subject_index: int, config: PopulationConfig) -> SubjectVariation:
    """The random shape and intensity of subject ``subject_index`` of ``head`` (deterministic)."""
    from scipy import ndimage

    rng = _rng(config.seed, head.name, subject_index)
    shape = head.volume.shape
    brain = head.brain_mask.array != 0
    distance = ndimage.distance_transform_edt(~brain, sampling=head.volume.spacing)
    ramp = np.clip((distance - config.brain_margin_mm) / max(config.ramp_mm, 1e-6), 0.0, 1.0)
    weight = (ramp * ramp * (3.0 - 2.0 * ramp)).astype(np.float32)  # smoothstep, 0 near the brain
    world = _world_grid(head.volume)
    centroid = _brain_centroid_mm(head)
    anterior = world[1] - np.float32(centroid[1])
    face_weight = weight / (1.0 + np.exp(-(anterior - config.face_anterior_mm) / 8.0, dtype=np.float32))
    coarse = _smooth_field(rng, 3, config.shape_control_points, shape, config.shape_amplitude_mm)
    fine = _smooth_field(rng, 3, config.face_control_points, shape, config.face_amplitude_mm)
    displacement_mm = weight[None] * coarse + face_weight[None] * fine
    if config.face_shape_amplitude > 0:
        from .face_shape import face_displacement_field, load_face_shape_model, random_target_weights

        model = load_face_shape_model()
        target_weights = random_target_weights(model, _rng(config.seed, head.name, subject_index, 0x7ACE),
                                               config.face_shape_amplitude)
        forward = face_displacement_field(head.volume, head.brain_mask, model, target_weights,
                                          sigma_mm=config.face_shape_sigma_mm)
        # the scan samples the head at p + u(p): skin that moves by d is found at u = -d
        displacement_mm -= weight[None] * forward
    to_voxels = np.linalg.inv(head.volume.affine[:3, :3]).astype(np.float32)
    displacement = np.einsum("ab,bxyz->axyz", to_voxels, displacement_mm).astype(np.float32)
    exponent = float(rng.uniform(*config.gamma_range))
    scale = float(rng.uniform(*config.scale_range))
    bias = np.exp(_smooth_field(rng, 1, 4, shape, config.bias_amplitude)[0]).astype(np.float32)
    return SubjectVariation(displacement, exponent, scale, bias)


def _rotation_matrix(angles_rad: np.ndarray) -> np.ndarray:
    ax, ay, az = angles_rad
    rx = np.array([[1, 0, 0], [0, np.cos(ax), -np.sin(ax)], [0, np.sin(ax), np.cos(ax)]])
    ry = np.array([[np.cos(ay), 0, np.sin(ay)], [0, 1, 0], [-np.sin(ay), 0, np.cos(ay)]])
    rz = np.array([[np.cos(az), -np.sin(az), 0], [np.sin(az), np.cos(az), 0], [0, 0, 1]])
    return rz @ ry @ rx


def generate_scan(head: HeadSource, subject_index: int, scan_index: int, config: PopulationConfig,
                  variation: Optional[SubjectVariation] = None) -> GeneratedScan:
    """Scan ``scan_index`` of subject ``subject_index`` of ``head``, on the head's grid.

    ``variation``: the subject's :func:`subject_variation` when already computed (it is the same
    for all scans of a subject; passing it saves time). Image float32 in the head's units,
    brain mask uint8 0/1, both on ``head.volume``'s grid.
    """
    from scipy import ndimage

    if variation is None:
        variation = subject_variation(head, subject_index, config)
    rng = _rng(config.seed, head.name, subject_index, 1 + scan_index)
    volume = head.volume
    shape = volume.shape
    # pose: output world q <- source world R^T (q - c - t) + c, about the brain centroid
    rotation = _rotation_matrix(np.deg2rad(rng.normal(0.0, config.scan_rotation_deg, 3)))
    translation = rng.normal(0.0, config.scan_translation_mm, 3)
    centroid = _brain_centroid_mm(head)
    source_from_output = np.eye(4)
    source_from_output[:3, :3] = rotation.T
    source_from_output[:3, 3] = centroid - rotation.T @ (centroid + translation)
    index_map = np.linalg.inv(volume.affine) @ source_from_output @ volume.affine
    ijk = np.indices(shape, dtype=np.float32).reshape(3, -1)
    source = (index_map[:3, :3].astype(np.float32) @ ijk) + index_map[:3, 3, None].astype(np.float32)
    # subject shape warp evaluated where the pose lands: p -> p + u(p)
    displacement = np.stack([ndimage.map_coordinates(variation.displacement_voxels[a], source, order=1,
                                                      mode="nearest") for a in range(3)])
    coordinates = source + displacement
    background, high = _head_statistics(head)
    data = np.asarray(volume.array, np.float32)
    # intensity change of the subject, then sampled with the same coordinates as the mask
    relative = np.clip((data - background) / high, 0.0, None)
    varied = relative ** np.float32(variation.contrast_exponent) * np.float32(variation.intensity_scale)
    varied *= variation.bias_field
    image = ndimage.map_coordinates(varied, coordinates, order=1, mode="constant", cval=0.0).reshape(shape)
    mask = ndimage.map_coordinates(head.brain_mask.array.astype(np.uint8), coordinates, order=0,
                                   mode="constant", cval=0).reshape(shape)
    image *= np.float32(1.0 + rng.normal(0.0, config.scan_intensity_jitter))
    sigma = np.float32(config.noise_fraction)
    noise_real = rng.standard_normal(size=shape, dtype=np.float32) * sigma
    noise_imaginary = rng.standard_normal(size=shape, dtype=np.float32) * sigma
    image = np.sqrt((image + noise_real) ** 2 + noise_imaginary ** 2)  # Rician magnitude noise
    image = (image * np.float32(high) + np.float32(background)).astype(np.float32)
    return GeneratedScan(head.name, int(subject_index), int(scan_index), volume.with_array(image),
                         volume.with_array(mask.astype(np.uint8)))


def generate_subject_scans(head: HeadSource, subject_index: int, config: PopulationConfig) -> List[GeneratedScan]:
    """All ``config.scans_per_subject`` scans of one subject."""
    variation = subject_variation(head, subject_index, config)
    return [generate_scan(head, subject_index, j, config, variation) for j in range(config.scans_per_subject)]


def generate_population(heads: Sequence[HeadSource], config: PopulationConfig,
                        subject_indices: Optional[Sequence[int]] = None) -> Iterator[GeneratedScan]:
    """Every scan of every subject of every head, head by head, subject by subject (a generator).

    ``subject_indices``: which subjects of each head (default ``range(config.subjects_per_head)``).
    """
    names = [h.name for h in heads]
    if len(set(names)) != len(names):
        raise InputError("head names must be distinct")
    indices = range(config.subjects_per_head) if subject_indices is None else subject_indices
    for head in heads:
        for index in indices:
            for scan in generate_subject_scans(head, int(index), config):
                yield scan
