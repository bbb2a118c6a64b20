"""The cranial vault drawn in anatomical layers (AnonMRILib.transforms.vault_layers)."""
import numpy as np

from AnonMRILib.transforms.distance import depth
from AnonMRILib.transforms.tissue_model import LABEL
from AnonMRILib.transforms.vault_layers import (VAULT_LAYERS, VaultLayerConfig, layer_vault, vault_region,
                                                with_layered_vault)


def shell_head(gap_mm=16.0, radius_mm=30.0, size=100):
    """A 1 mm sphere of brain inside a head ``gap_mm`` thicker, the layer between scrambled as the
    source head's classification left its vault: marrow under the skin, muscle inside the bone."""
    grid = np.indices((size,) * 3).astype(np.float32) - (size - 1) / 2.0
    radius = np.sqrt((grid ** 2).sum(axis=0))
    brain = radius <= radius_mm
    labels = np.full(radius.shape, LABEL["outside"], np.uint8)
    labels[radius <= radius_mm + gap_mm] = LABEL["marrow"]
    labels[radius <= radius_mm + 0.45 * gap_mm] = LABEL["muscle"]
    labels[radius <= radius_mm + 0.35 * gap_mm] = LABEL["bone"]
    labels[brain] = LABEL["brain"]
    return labels, brain, radius


def radial_order(labels, radius, radius_mm, gap_mm):
    """The classes met going out from the brain along the shell (the majority of each 0.25 mm step)."""
    order = []
    for r in np.arange(radius_mm + 0.125, radius_mm + gap_mm, 0.25):
        ring = np.abs(radius - r) < 0.2
        values, counts = np.unique(labels[ring], return_counts=True)
        name = [n for n, v in LABEL.items() if v == values[np.argmax(counts)]][0]
        if not order or order[-1] != name:
            order.append(name)
    return order


def test_a_scrambled_vault_becomes_the_anatomical_layers_from_brain_to_skin():
    """CSF, dura, inner table, diploe, outer table, galea, fat and skin, in that order and at the
    fractions of the brain-to-skin distance of VAULT_LAYERS; deterministic (a fixed template seed)."""
    labels, brain, radius = shell_head()
    spacing = (1.0, 1.0, 1.0)
    surface = depth(labels != LABEL["outside"], spacing)
    layered, diploe = layer_vault(labels, brain, spacing, surface)
    again, _ = layer_vault(labels, brain, spacing, surface)
    assert np.array_equal(layered, again)
    assert radial_order(layered, radius, 30.0, 16.0) == [name for name, _ in VAULT_LAYERS]
    assert radial_order(labels, radius, 30.0, 16.0) == ["bone", "muscle", "marrow"]
    # the brain and the air are not touched; the diploe lies between the two tables
    assert np.array_equal(layered[brain], labels[brain])
    assert np.array_equal(layered == LABEL["outside"], labels == LABEL["outside"])
    assert diploe.any() and np.all(layered[diploe] == LABEL["diploe"])
    d = radius[diploe] - 30.0
    assert 0.19 * 16 < np.median(d) < 0.39 * 16
    # the outer table is about 0.12 of the distance thick on average (1.9 mm)
    outer_table = (layered == LABEL["bone"]) & (radius > 30.0 + 0.3 * 16)
    thickness = outer_table.sum() / (4 * np.pi * (30 + 0.45 * 16) ** 2)
    assert 1.4 < thickness < 2.4


def test_the_face_orbits_temples_and_thick_tissue_keep_the_label_map():
    """No voxel within clearance_mm of a non-vault class (here an eye) or of bulk muscle (a
    temporalis) is relabelled, nor where the brain-to-skin distance exceeds max_gap_mm."""
    labels, brain, radius = shell_head()
    grid = np.indices(labels.shape) - (labels.shape[0] - 1) / 2.0
    eye = np.sqrt((grid[0] - 38) ** 2 + grid[1] ** 2 + grid[2] ** 2) <= 4
    labels[eye] = LABEL["vitreous"]
    temporalis = (np.abs(grid[1] - 38) <= 4) & (np.abs(grid[0]) <= 8) & (np.abs(grid[2]) <= 8) & ~brain
    labels[temporalis] = LABEL["muscle"]
    spacing = (1.0, 1.0, 1.0)
    config = VaultLayerConfig()
    region, u = vault_region(labels, brain, spacing, depth(labels != LABEL["outside"], spacing), config)
    near_eye = depth(~eye, spacing) <= config.clearance_mm
    near_muscle = depth(~temporalis, spacing) <= config.muscle_clearance_mm
    assert region.any() and not (region & near_eye).any() and not (region & near_muscle).any()
    assert np.all((u[region] >= 0) & (u[region] <= 1))
    thick, thick_brain, _ = shell_head(gap_mm=config.max_gap_mm + 4, radius_mm=25.0)
    none, _ = vault_region(thick, thick_brain, spacing, depth(thick != LABEL["outside"], spacing), config)
    assert not none.any()


def test_the_diploe_gets_a_mottled_marrow_texture_and_nothing_else_changes():
    labels, brain, _ = shell_head()
    spacing = (1.0, 1.0, 1.0)
    texture = np.full(labels.shape, 0.1, np.float32)
    layered, textured = with_layered_vault(labels, texture, brain, spacing, depth(labels != LABEL["outside"], spacing))
    diploe = layer_vault(labels, brain, spacing, depth(labels != LABEL["outside"], spacing))[1]
    assert 0.25 < textured[diploe].std() < 0.45  # VaultLayerConfig.diploe_texture = 0.35
    assert np.all(textured[~diploe] == np.float32(0.1)) and np.all(texture == np.float32(0.1))


def test_the_shipped_templates_vault_renders_its_tables_and_keeps_the_face():
    """On the shipped tissue model: with the layering, the vault 3-8 mm out of the template's brain
    is no longer mostly flat diploe and marrow under the skin but galea and fat; the face (in front of
    the eyes and below their tops) is drawn exactly as without it."""
    from dataclasses import replace

    from AnonMRILib.transforms.anatomical_prior import AnatomicalPriorConfig, load_template_head
    from AnonMRILib.transforms.tissue_model import TissueLevels

    template = load_template_head()
    labels = np.asarray(template.labels.array)
    brain = np.asarray(template.brain_mask.array) != 0
    spacing = np.asarray(template.labels.spacing)
    surface = depth(labels != LABEL["outside"], spacing)
    layered, _ = layer_vault(labels, brain, spacing, surface)
    from_brain = depth(~brain, spacing)
    top = np.indices(labels.shape)[2] > np.argwhere(brain)[:, 2].mean()
    shell = top & (from_brain > 7) & (from_brain <= 12) & (surface > 2)
    # as built: the scalp's fat read as marrow (0.36), flat diploe (0.37); layered: galea and fat
    assert np.mean(labels[shell] == LABEL["marrow"]) > 0.3 and np.mean(labels[shell] == LABEL["diploe"]) > 0.3
    assert np.mean(layered[shell] == LABEL["marrow"]) < 0.1 and np.mean(layered[shell] == LABEL["diploe"]) < 0.05
    assert np.mean(layered[shell] == LABEL["fat"]) > 0.35
    changed = layered != labels
    eyes = np.isin(labels, [LABEL["vitreous"], LABEL["lens"]])
    where = np.argwhere(eyes)
    index = np.indices(labels.shape)
    face = (index[1] > where[:, 1].min()) & (index[2] <= where[:, 2].max())  # in front of the eyes, below their tops
    assert not (changed & face).any()

    levels = TissueLevels(0.0, 300.0, 550.0, 750.0)
    config = AnatomicalPriorConfig()
    with_layers = template.render(levels, config)
    as_built = template.render(levels, replace(config, vault=None))
    assert np.array_equal(with_layers[face], as_built[face])


def test_bad_vault_settings_are_refused():
    import pytest

    from AnonMRILib.errors import InputError

    for settings in ({"min_gap_mm": 0.0}, {"min_gap_mm": 25.0}, {"clearance_mm": float("nan")},
                     {"undulation": -0.1}, {"undulation": 0.6}, {"diploe_texture": -1.0}):
        with pytest.raises(InputError):
            VaultLayerConfig(**settings)
