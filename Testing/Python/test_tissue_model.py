"""The tissue-label head model of REFACE and CP-GAN's prior: the brain's levels fix the contrast,
the classes come out in a T1's order, noise is measured and added at the patient's level."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.transforms.tissue_model import (CLASSES, LABEL, TissueClasses, TissueLevels, add_rician_noise,
                                                brain_tissue_levels, from_tissue_scale, noise_sigma, render_tissue,
                                                to_tissue_scale, white_matter_noise)

#: a T1's brain: air < CSF < grey < white matter (arbitrary units)
T1 = TissueLevels(air=10.0, csf=200.0, gm=320.0, wm=420.0)


def test_tissue_scale_knots_and_inverse():
    s = np.array([-0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0], np.float32)
    intensity = from_tissue_scale(s, T1)
    assert np.allclose(intensity[[1, 3, 5, 7]], [T1.air, T1.csf, T1.gm, T1.wm])
    assert intensity[-1] == pytest.approx(2 * T1.wm - T1.air)  # s = 4: twice WM above air
    assert np.allclose(to_tissue_scale(intensity, T1), s, atol=1e-5)
    assert np.all(np.diff(intensity) > 0)
    with pytest.raises(InputError):
        to_tissue_scale(intensity, TissueLevels(air=0.0, csf=400.0, gm=300.0, wm=200.0 + 1e-3))  # a T2's order


def test_brain_levels_are_the_three_classes_medians():
    rng = np.random.default_rng(0)
    brain = np.concatenate([rng.normal(200, 5, 2000), rng.normal(320, 5, 5000), rng.normal(420, 5, 4000)])
    levels = brain_tissue_levels(brain, air=10.0)
    assert levels.csf == pytest.approx(200, abs=3) and levels.gm == pytest.approx(320, abs=3)
    assert levels.wm == pytest.approx(420, abs=3) and levels.air == 10.0
    # affine-equivariant: the levels of 3x + 7 are 3 * levels + 7
    scaled = brain_tissue_levels(3 * brain + 7, air=37.0)
    assert np.allclose(scaled.values(), levels.scaled(3.0, 7.0).values(), rtol=1e-3)


def test_shipped_model_renders_the_expected_class_order_for_a_t1():
    """Per class (flat, no texture) on a T1's levels: air and bone darkest, then CSF and vitreous,
    muscle between CSF and GM, the cord like brain tissue, fat above white matter (a T1's fat is
    about 1.7 x WM above air: the prior's ``fat_level`` stretched by its ``bright_stretch``)."""
    from AnonMRILib.transforms.anatomical_prior import AnatomicalPriorConfig, load_template_head

    template = load_template_head()
    levels = template.classes.levels
    config = AnatomicalPriorConfig()
    flat = {name: float(render_tissue(np.array([LABEL[name]], np.uint8), None, template.classes_for(config), T1,
                                      config.bright_stretch)[0]) for name in CLASSES}
    assert flat["outside"] == T1.air
    assert flat["air"] < flat["bone"] < flat["csf"] < flat["muscle"] < flat["cord"] < T1.wm < flat["fat"]
    assert flat["dura"] < flat["csf"] and flat["teeth"] < flat["csf"] and flat["vitreous"] < flat["muscle"]
    assert flat["marrow"] > T1.wm
    # fat about 1.7 x WM above air, as in the real T1 heads (the source head's own fat level,
    # partial-volumed in its 1.5 mm voxels, draws at 1.4)
    assert T1.wm + 0.6 * (T1.wm - T1.air) < flat["fat"] < T1.wm + 0.8 * (T1.wm - T1.air)
    assert T1.csf < flat["diploe"] < flat["fat"]
    # the drawn cervical spine: marrow brighter than disc and muscle, a disc a little darker than muscle
    assert T1.csf < flat["disc"] < flat["muscle"] < flat["vertebra"] < T1.wm
    # every class the model uses is present in the shipped labels, the template's own brain is not
    present = np.unique(np.asarray(template.labels.array))
    for name in ("csf", "bone", "marrow", "fat", "muscle", "skin", "air", "vitreous", "lens", "optic_nerve", "cord",
                 "teeth", "mucosa", "dura", "diploe", "vertebra", "disc"):
        assert LABEL[name] in present, name
    assert LABEL["brain"] not in present
    assert levels.shape == (len(CLASSES),)


def test_rendering_follows_the_patients_contrast():
    """The same labels on two brains: intensities are the tissue scale read on each brain's levels
    (doubling every level doubles the rendering) and texture stays within each class's limit."""
    classes = TissueClasses(np.linspace(0.0, 3.5, len(CLASSES)).astype(np.float32),
                            np.full(len(CLASSES), 0.2, np.float32))
    labels = np.arange(len(CLASSES), dtype=np.uint8).repeat(4)
    texture = np.tile(np.array([-1.0, -0.1, 0.1, 1.0], np.float32), len(CLASSES))
    once = render_tissue(labels, texture, classes, T1)
    twice = render_tissue(labels, texture, classes, T1.scaled(2.0))
    assert np.allclose(twice, 2 * once, rtol=1e-5)
    s = to_tissue_scale(once[labels != LABEL["outside"]], T1)
    assert np.all(np.abs(s - classes.levels[labels[labels != LABEL["outside"]]]) <= 0.2 + 1e-4)
    with pytest.raises(InputError):
        render_tissue(np.array([len(CLASSES)], np.uint8), None, classes, T1)


def test_noise_is_measured_in_white_matter_and_added_as_magnitude_noise():
    rng = np.random.default_rng(1)
    volume = np.full((40, 40, 40), 320.0, np.float32)
    volume[10:30, 10:30, 10:30] = 420.0  # white matter
    brain = np.zeros(volume.shape, bool)
    brain[5:35, 5:35, 5:35] = True
    noisy = volume + rng.normal(0.0, 12.0, volume.shape).astype(np.float32)
    assert white_matter_noise(noisy, brain, T1) == pytest.approx(12.0, rel=0.1)
    assert noise_sigma(volume, brain) < 1e-3
    # reads only the brain: values outside it do not matter
    other = np.where(brain, noisy, 1e6).astype(np.float32)
    assert white_matter_noise(other, brain, T1) == white_matter_noise(noisy, brain, T1)
    signal = np.full((60, 60, 60), 420.0, np.float32)
    added = add_rician_noise(signal, 12.0, T1.air, np.random.default_rng(2))
    assert noise_sigma(added, np.ones(signal.shape, bool)) == pytest.approx(12.0, rel=0.1)
    air = add_rician_noise(np.full((60, 60, 60), T1.air, np.float32), 12.0, T1.air, np.random.default_rng(2))
    assert np.all(air >= T1.air) and float(np.mean(air - T1.air)) == pytest.approx(12.0 * np.sqrt(np.pi / 2), rel=0.05)
    same = add_rician_noise(signal, 12.0, T1.air, np.random.default_rng(2))
    assert np.array_equal(same, added)
    untouched = add_rician_noise(signal, 12.0, T1.air, np.random.default_rng(2), weight=np.zeros(signal.shape))
    assert np.array_equal(untouched, signal)


def test_thick_slices_measure_noise_in_plane_only():
    """Neighbours across 6.5 mm slices differ by anatomy: only in-plane neighbours measure the noise."""
    from AnonMRILib.transforms.tissue_model import noise_axes

    assert noise_axes((0.78, 0.78, 6.5)) == (0, 1)
    assert noise_axes((1.0, 1.0, 1.2)) == (0, 1, 2)
    assert noise_axes(None) == (0, 1, 2)
    rng = np.random.default_rng(3)
    volume = np.full((48, 48, 12), 420.0, np.float32)
    volume += (np.arange(12) % 2 * 60.0).astype(np.float32)  # slice-to-slice anatomy
    volume += rng.normal(0.0, 12.0, volume.shape).astype(np.float32)
    brain = np.ones(volume.shape, bool)
    assert white_matter_noise(volume, brain, T1, spacing=(0.78, 0.78, 6.5)) == pytest.approx(12.0, rel=0.1)
    assert white_matter_noise(volume, brain, T1) > 20.0
    # a thick slab also mixes anatomy into the in-plane neighbours (stripes of partial volume along
    # one in-plane axis here): Immerkaer's operator cancels them, a 4-neighbour residual does not
    from AnonMRILib.transforms.tissue_model import noise_sigma

    striped = np.full((48, 48, 12), 420.0, np.float32)
    striped += (100.0 * np.sin(2 * np.pi * np.arange(48) / 5.0))[:, None, None].astype(np.float32)
    striped += rng.normal(0.0, 12.0, striped.shape).astype(np.float32)
    assert white_matter_noise(striped, brain, T1, spacing=(0.78, 0.78, 6.5)) == pytest.approx(12.0, rel=0.12)
    assert noise_sigma(striped, brain, spacing=(0.78, 0.78, 6.5)) > 20.0


def test_prior_noise_follows_the_signal_and_leaves_air_clean():
    from AnonMRILib.transforms.anatomical_prior import PriorNoise

    values = np.full((30, 30, 30), T1.air, np.float32)
    values[10:20] = T1.wm
    noise = PriorNoise((slice(None),) * 3, 12.0, T1.air, T1.csf, seed=0)
    out = noise.apply(values)
    assert np.array_equal(out[:10], values[:10])  # air: no grain around the head
    assert float(np.std(out[12:18])) == pytest.approx(12.0, rel=0.1)
    assert np.array_equal(noise.apply(values), out)  # seeded


def test_the_outer_layer_is_one_smooth_skin_whatever_lies_under_it():
    """The template's outer 1-2 mm: with the skin layer, little of the label map's skull, fat and
    air shows through (what a rendering's normals read); without it, their steps do."""
    from scipy import ndimage

    from AnonMRILib.transforms.anatomical_prior import AnatomicalPriorConfig, load_template_head

    template = load_template_head()
    labels = np.asarray(template.labels.array)
    head = labels != LABEL["outside"]
    depth = ndimage.distance_transform_edt(head, sampling=template.labels.spacing)
    band = (depth > 1.0) & (depth <= 2.0)
    spread = {}
    for layer in (0.0, AnatomicalPriorConfig().skin_layer_mm):
        values = template.render(T1, AnatomicalPriorConfig(skin_layer_mm=layer, texture=False))
        spread[layer] = float(np.std(values[band]))
    assert spread[AnatomicalPriorConfig().skin_layer_mm] < 0.5 * spread[0.0]


def test_subcutaneous_fat_replaces_skull_and_air_just_under_the_skin():
    from AnonMRILib.transforms.tissue_model import with_subcutaneous_fat

    labels = np.full((20, 20, 20), LABEL["outside"], np.uint8)
    labels[2:18, 2:18, 2:18] = LABEL["skin"]
    labels[3:17, 3:17, 3:17] = LABEL["bone"]
    labels[8:12, 8:12, 8:12] = LABEL["vitreous"]
    out = with_subcutaneous_fat(labels, (1.0, 1.0, 1.0), 3.0)
    assert out[4, 10, 10] == LABEL["fat"] and out[6, 10, 10] == LABEL["bone"]  # 3 mm deep, then bone
    assert np.all(out[labels == LABEL["vitreous"]] == LABEL["vitreous"])
    assert np.array_equal(with_subcutaneous_fat(labels, (1.0, 1.0, 1.0), 0.0), labels)


def test_the_neck_has_a_ring_of_subcutaneous_fat():
    """30-60 mm below the template's brain, the 3-6 mm layer under the skin is fat on at least 80 %
    of its voxels (as built: 9 %); above the brain's lowest slice the face keeps its 3 mm,
    and 0 mm turns the layer off everywhere. The depths are per slice."""
    from AnonMRILib.transforms.anatomical_prior import AnatomicalPriorConfig, load_template_head
    from AnonMRILib.transforms.distance import depth as depth_of
    from AnonMRILib.transforms.tissue_model import with_subcutaneous_fat

    template = load_template_head()
    labels = np.asarray(template.labels.array)
    spacing = template.labels.spacing
    depth = depth_of(labels != LABEL["outside"], spacing)
    config = AnatomicalPriorConfig()
    per_slice = template.subcutaneous_depth_mm(config)
    lowest = int(np.flatnonzero(np.asarray(template.brain_mask.array).any(axis=(0, 1)))[0])
    assert per_slice.shape == (1, 1, labels.shape[2])
    assert per_slice[0, 0, lowest] == config.subcutaneous_mm and per_slice[0, 0, lowest + 40] == config.subcutaneous_mm
    assert per_slice[0, 0, lowest - 30] == config.neck_subcutaneous_mm
    assert np.all(np.diff(per_slice[0, 0, :lowest + 1]) <= 0)  # growing downwards, no step
    neck = np.zeros(labels.shape, bool)
    neck[:, :, lowest - 60:lowest - 30] = True
    layer = neck & (depth > 3.0) & (depth <= 6.0)
    fat = LABEL["fat"]
    assert (labels[layer] == fat).mean() < 0.15
    assert (with_subcutaneous_fat(labels, spacing, per_slice, depth)[layer] == fat).mean() > 0.8
    face = (depth > 1.0) & (depth <= 6.0)
    face[:, :, :lowest] = False
    drawn = with_subcutaneous_fat(labels, spacing, per_slice, depth)
    assert np.array_equal(drawn[face], with_subcutaneous_fat(labels, spacing, config.subcutaneous_mm, depth)[face])
    assert not template.subcutaneous_depth_mm(AnatomicalPriorConfig(subcutaneous_mm=0.0)).any()
    with pytest.raises(InputError):
        AnatomicalPriorConfig(neck_fat_span_mm=(20.0, 0.0))


def test_shipped_skin_is_the_labels_outline_with_a_sharper_edge(tmp_path):
    """The template's skin occupancy (MakeHuman's subdivided head at 0.5 mm) has the label map's
    outline (Dice of the half-occupancy solids >= 0.99) and a narrower edge than the label map's
    head smoothed by LABEL_SKIN_SMOOTHING_MM (fewer voxels strictly between 0.1 and 0.9); without the
    file the label-based occupancy is used, and a skin on another grid is refused."""
    import shutil

    from AnonMRILib.errors import InputError
    from AnonMRILib.io import Volume, save_volume
    from AnonMRILib.transforms.anatomical_prior import (SKIN_FILE, TEMPLATE_DIR, TEMPLATE_FILES,
                                                        AnatomicalPriorConfig, load_template_head)

    template = load_template_head()
    assert template.skin is not None
    shipped = template.skin_occupancy()
    labels = np.asarray(template.labels.array) != LABEL["outside"]
    inside = shipped >= 0.5
    assert 2 * (inside & labels).sum() / (inside.sum() + labels.sum()) >= 0.99
    for name in TEMPLATE_FILES:
        shutil.copy(TEMPLATE_DIR / name, tmp_path / name)
    fallback = load_template_head(AnatomicalPriorConfig(template_dir=tmp_path))
    assert fallback.skin is None
    smooth = fallback.skin_occupancy()
    edge = lambda occupancy: int(((occupancy > 0.1) & (occupancy < 0.9)).sum())  # noqa: E731
    assert edge(shipped) < 0.75 * edge(smooth)
    assert edge(template.skin_occupancy(1.0)) > edge(shipped)  # the extra smoothing widens it
    save_volume(Volume(np.asarray(template.skin.array)[1:], template.skin.affine), tmp_path / SKIN_FILE)
    with pytest.raises(InputError, match="grid"):
        load_template_head(AnatomicalPriorConfig(template_dir=tmp_path))
