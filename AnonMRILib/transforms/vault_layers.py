"""The cranial vault of the tissue model drawn as layers in anatomical order, brain to skin.

The tissue model's source head (:mod:`AnonMRILib.transforms.tissue_model`) was labelled from its
intensities, and over the vault that classification scrambled the layers: measured on the shipped
label map (1 mm shells outside its brain mask, vault voxels), bone 1-3 mm out, a 5 mm band of flat
"diploe" 3-8 mm out, "marrow" (the source's scalp fat, as bright) 7-12 mm out directly under the
skin, muscle scattered through the skull (5-19 % of each shell) and no outer table. Rendered, a
remodeled head's vault was a thick, flat grey band under a bright line: no outer table, no marrow
texture, and from 3 mm out far brighter than any real vault (sub-01, 1 mm shells 4-9 mm out, x WM
above air: 0.66-0.95 against the input's 0.47-0.78).

:func:`layer_vault` relabels the vault by each voxel's place between the template's brain edge and
its skin: with d_b its distance outside the brain mask and d_s its depth under the skin (mm),
u = d_b / (d_b + d_s) runs from 0 at the brain to 1 at the skin, and the layers of
:data:`VAULT_LAYERS` take fixed ranges of u (adult textbook thicknesses at a 13 mm brain-to-skin
distance: CSF and dura 1.3 mm, inner table 1, diploe 2.3, outer table 1.6, galea 0.9,
subcutaneous fat 4, skin 1.8). The boundaries undulate by ``undulation`` of u (a smooth seeded
field, so the tables thin and thicken as a real skull's do) and the diploe carries a mottled
marrow texture (:func:`diploe_texture`): both are fixed properties of the template (a fixed seed),
not of any patient. The vault is where the template's brain-to-skin distance lies within
``[min_gap_mm, max_gap_mm]``, ``clearance_mm`` from any class that is not scalp or skull (sinus
and airway air, the eyes, teeth, mucosa, the spine) and ``muscle_clearance_mm`` from bulk muscle
(temporalis, neck): the face, orbits, temples and skull base keep the label map as built.

It runs on the template's own grid before rendering (:meth:`TemplateHead.render_levels`), so the
placement carries it onto the patient like every other class: the inner table follows the
patient's brain edge through the brain-edge refinement, the skin stays where the placement put it.
Only the template changes; nothing of the patient is read.
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError
from .distance import bounding_slices, depth
from .tissue_model import LABEL

#: (class, upper bound of its range of u = d_b / (d_b + d_s)) from the brain's edge (u = 0) to the skin (u = 1)
VAULT_LAYERS: Tuple[Tuple[str, float], ...] = (
    ("csf", 0.06), ("dura", 0.10), ("bone", 0.19), ("diploe", 0.39), ("bone", 0.51), ("muscle", 0.66),
    ("fat", 0.84), ("skin", 1.0))
#: classes that are not part of a scalp or skull: the vault keeps ``clearance_mm`` from them
NOT_VAULT: Tuple[str, ...] = ("air", "vitreous", "lens", "optic_nerve", "teeth", "mucosa", "cord", "vertebra", "disc")
#: the template's fixed seed for the boundaries' undulation and the marrow's texture
TEMPLATE_SEED = 20261207
#: the layered diploe's texture is clipped at this many standard deviations of its mottling
DIPLOE_TEXTURE_LIMIT = 2.5


@dataclass(frozen=True)
class VaultLayerConfig:
    """Where the vault is relabelled and how (lengths in mm, ``undulation`` as a fraction of u,
    ``diploe_texture`` in tissue-scale units: air 0, CSF 1, GM 2, WM 3)."""

    min_gap_mm: float = 6.0
    max_gap_mm: float = 20.0
    clearance_mm: float = 8.0
    #: bulk muscle: thicker than ``muscle_core_mm`` (the temporalis and neck, not the scattered
    #: mislabelled voxels inside the source's skull)
    muscle_core_mm: float = 2.0
    muscle_clearance_mm: float = 4.0
    undulation: float = 0.04
    undulation_scale_mm: float = 8.0
    #: standard deviation of the diploe's mottling and the size of its islands
    diploe_texture: float = 0.35
    diploe_grain_mm: float = 0.8

    def __post_init__(self) -> None:
        lengths = (self.min_gap_mm, self.max_gap_mm, self.clearance_mm, self.muscle_core_mm,
                   self.muscle_clearance_mm, self.undulation_scale_mm, self.diploe_grain_mm)
        if not all(np.isfinite(v) and v > 0 for v in lengths) or self.min_gap_mm >= self.max_gap_mm:
            raise InputError("the vault's lengths must be positive numbers of mm, with min_gap_mm < max_gap_mm")
        if not (0 <= self.undulation < 0.5 and np.isfinite(self.diploe_texture) and self.diploe_texture >= 0):
            raise InputError("the vault's undulation must lie in [0, 0.5) and its diploe texture be >= 0")


def vault_region(labels: np.ndarray, brain: np.ndarray, spacing: Sequence[float], surface_depth: np.ndarray,
                 config: VaultLayerConfig = VaultLayerConfig()) -> Tuple[np.ndarray, np.ndarray]:
    """(vault mask, u) on the label map's grid: the voxels relabelled and their normalised depth
    u = d_b / (d_b + d_s) (0 outside the mask). ``surface_depth``: depth (mm) under the head's
    surface (labels != outside); ``brain``: the template's brain mask."""
    from scipy import ndimage

    spacing = np.asarray(spacing, np.float64)
    labels = np.asarray(labels)
    brain = np.asarray(brain) != 0
    region = np.zeros(labels.shape, bool)
    u = np.zeros(labels.shape, np.float32)
    from_brain = depth(~brain, spacing)
    gap = from_brain + surface_depth
    candidate = (labels != LABEL["outside"]) & ~brain & (gap >= config.min_gap_mm) & (gap <= config.max_gap_mm)
    # the clearances only look this far beyond the candidates
    margin = np.ceil((max(config.clearance_mm, config.muscle_clearance_mm + 2 * config.muscle_core_mm) + 1.0)
                     / spacing).astype(int)
    box = bounding_slices(candidate, margin)
    if box is None:
        return region, u
    near = labels[box]
    clear = depth(~np.isin(near, [LABEL[name] for name in NOT_VAULT]), spacing) > config.clearance_mm
    muscle = near == LABEL["muscle"]
    # the muscle within reach of a core thicker than muscle_core_mm: whole muscles, not thin strands
    reach = int(np.ceil(config.muscle_core_mm / spacing.min())) + 1
    bulk = ndimage.binary_dilation(depth(muscle, spacing) > config.muscle_core_mm,
                                   ndimage.generate_binary_structure(near.ndim, near.ndim), iterations=reach) & muscle
    clear &= depth(~bulk, spacing) > config.muscle_clearance_mm
    region[box] = candidate[box] & clear
    u[region] = from_brain[region] / np.maximum(gap[region], 1e-3)
    return region, u


def _smooth_field(shape: Sequence[int], spacing: Sequence[float], scale_mm: float, rng: np.random.Generator
                  ) -> np.ndarray:
    """A seeded Gaussian random field of unit standard deviation, correlated over ``scale_mm``."""
    from scipy import ndimage

    field = ndimage.gaussian_filter(rng.standard_normal(tuple(shape), dtype=np.float32),
                                    float(scale_mm) / np.asarray(spacing, np.float64))
    return field / max(float(field.std()), 1e-6)


def layer_vault(labels: np.ndarray, brain: np.ndarray, spacing: Sequence[float], surface_depth: np.ndarray,
                config: VaultLayerConfig = VaultLayerConfig()) -> Tuple[np.ndarray, np.ndarray]:
    """(labels with the vault in :data:`VAULT_LAYERS` order, the vault's diploe mask): a copy;
    see the module docstring. Deterministic: the template's fixed seed."""
    region, u = vault_region(labels, brain, spacing, surface_depth, config)
    out = np.array(labels, copy=True)
    if not region.any():
        return out, region
    box = bounding_slices(region)
    wave = _smooth_field(region[box].shape, spacing, config.undulation_scale_mm, np.random.default_rng(TEMPLATE_SEED))
    inside = (u[box] + np.float32(config.undulation) * wave)[region[box]]
    layer = np.full(inside.shape, LABEL[VAULT_LAYERS[-1][0]], np.uint8)
    for name, upper in reversed(VAULT_LAYERS[:-1]):
        layer[inside < upper] = LABEL[name]
    out[region] = layer
    return out, region & (out == LABEL["diploe"])


def diploe_texture(shape: Sequence[int], spacing: Sequence[float], config: VaultLayerConfig = VaultLayerConfig()
                   ) -> np.ndarray:
    """float32 tissue-scale texture of the diploe's marrow on a grid of ``shape``: a seeded field of
    islands about ``diploe_grain_mm`` across, standard deviation ``diploe_texture`` (the template's
    fixed seed)."""
    rng = np.random.default_rng(TEMPLATE_SEED + 1)
    return np.float32(config.diploe_texture) * _smooth_field(shape, spacing, config.diploe_grain_mm, rng)


def with_layered_vault(labels: np.ndarray, texture: Optional[np.ndarray], brain: np.ndarray,
                       spacing: Sequence[float], surface_depth: np.ndarray,
                       config: VaultLayerConfig = VaultLayerConfig()) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(labels, texture) of :func:`layer_vault`, the layered diploe's texture replaced by
    :func:`diploe_texture` and the rest of the diploe's set to 0, flat as built (``texture`` None:
    labels only)."""
    labels, diploe = layer_vault(labels, brain, spacing, surface_depth, config)
    if texture is not None:
        texture = np.array(texture, np.float32, copy=True)
        texture[(labels == LABEL["diploe"]) & ~diploe] = 0.0  # the built diploe elsewhere stays flat
        if diploe.any():
            box = bounding_slices(diploe)
            texture[box][diploe[box]] = diploe_texture(diploe[box].shape, spacing, config)[diploe[box]]
    return labels, texture
