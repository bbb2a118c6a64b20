"""REFACE and the anatomical prior T(x): placed from gamma(x) alone, brain kept, a real face, MR
tissue outside the brain (the tissue model rendered in the patient's contrast), no seam at the
brain's edge."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.pipelines.reface import reface, reface_with_details
from AnonMRILib.transforms.anatomical_prior import AnatomicalPriorConfig, load_template_head, place_anatomical_prior
from face_judge import assert_another_natural_face

#: a cheaper placement for tests of properties that hold for any setting
FAST = AnatomicalPriorConfig(demons_iterations=(15, 5))


@pytest.fixture(scope="module")
def sample():
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    return load_sample_head(), load_sample_brain_mask()


@pytest.fixture(scope="module")
def refaced(sample):
    head, mask = sample
    return reface_with_details(head, brain_mask=mask, seed=0)


def interior_face_permuted(head, mask, hull, seed=0):
    """The head with the values of its non-brain tissue deep inside the hull (>= 4 voxels from the
    head's surface and 2 from the brain) shuffled: another face anatomy inside the same outline.
    The histogram is unchanged (same head threshold), and so is every voxel at or near the surface,
    so the head mask, the surface and the hull are the same: gamma(x) is the same."""
    from scipy import ndimage

    from AnonMRILib.transforms.head_mask import head_mask_array

    brain = mask.array != 0
    tissue = ndimage.binary_erosion(head_mask_array(head.array), iterations=4)
    region = tissue & ~ndimage.binary_dilation(brain, iterations=2) & (hull.array != 0)
    array = head.array.copy()
    values = array[region]
    np.random.default_rng(seed).shuffle(values)
    array[region] = values
    return head.with_array(array), region


def test_brain_bit_exact_and_everything_else_replaced(sample, refaced):
    head, mask = sample
    output, details = refaced
    brain = mask.array != 0
    assert output.same_grid(head) and output.dtype == head.dtype
    assert np.array_equal(output.array[brain], head.array[brain])
    hull = details["convex_hull"].array != 0
    replaced = hull & ~brain
    assert np.mean(output.array[replaced] != head.array[replaced]) > 0.95


def test_output_outside_the_brain_depends_only_on_gamma(sample, refaced):
    head, mask = sample
    output, details = refaced
    other, region = interior_face_permuted(head, mask, details["convex_hull"])
    assert region.sum() > 5000 and np.mean(other.array[region] != head.array[region]) > 0.5
    output_other, details_other = reface_with_details(other, brain_mask=mask, seed=0)
    assert np.array_equal(details_other["convex_hull"].array, details["convex_hull"].array)
    assert np.array_equal(output_other.array, output.array)


def test_prior_sees_only_brain_mask_and_hull(sample, refaced):
    """place_anatomical_prior's inputs are b, c, the brain's levels (or its median), its noise
    level, b*x for the edge, the air level and the seed; the same inputs give the same T(x), a
    different hull a different one."""
    head, mask = sample
    _, details = refaced
    brain, hull = details["brain_mask"], details["convex_hull"]
    first = place_anatomical_prior(brain, hull, 500.0, 0.0, config=FAST)
    again = place_anatomical_prior(brain, hull, 500.0, 0.0, config=FAST)
    assert np.array_equal(first.array, again.array)
    shifted = hull.with_array(np.roll(hull.array, 4, axis=1) | brain.array)
    moved = place_anatomical_prior(brain, shifted, 500.0, 0.0, config=FAST)
    assert not np.array_equal(moved.array, first.array)
    # intensity scale follows the brain median only
    doubled = place_anatomical_prior(brain, hull, 1000.0, 0.0, config=FAST)
    assert np.allclose(doubled.array, 2.0 * first.array, rtol=1e-4, atol=1e-3)
    # the noise is the seed's
    noisy = [place_anatomical_prior(brain, hull, 500.0, 0.0, config=FAST, noise_sigma=10.0, seed=seed).array
             for seed in (0, 0, 1)]
    assert np.array_equal(noisy[0], noisy[1]) and not np.array_equal(noisy[0], noisy[2])


def test_contrast_outside_the_brain_comes_from_the_brain(sample, refaced):
    """The tissue model is drawn on the brain's own levels: the same head with its brain voxels
    scaled by 1.5 (and nothing else changed) gives tissue 1.5x as bright above air outside."""
    from AnonMRILib.transforms.tissue_model import TissueLevels

    head, mask = sample
    _, details = refaced
    brain, hull = details["brain_mask"], details["convex_hull"]
    levels = TissueLevels(0.0, 300.0, 480.0, 620.0)
    first = place_anatomical_prior(brain, hull, 500.0, 0.0, config=FAST, levels=levels)
    brighter = place_anatomical_prior(brain, hull, 500.0, 0.0, config=FAST, levels=levels.scaled(1.5))
    outside = (hull.array != 0) & (brain.array == 0)
    assert np.allclose(brighter.array[outside], 1.5 * first.array[outside], rtol=1e-4, atol=1e-2)


def test_tissue_outside_the_brain_is_mr_structure_not_an_average(sample, refaced):
    """The head outside the brain has the edges of real tissue layers (skull tables, fat, muscle,
    air spaces), not a smooth average: its mean gradient magnitude more than 3 mm from the brain is
    at least 0.6 of the input's (the average-head template gave 0.46 on a 1 mm head), and air
    spaces (below a quarter of CSF) and fat (above white matter) both occur inside the head."""
    from scipy import ndimage

    from AnonMRILib.transforms.head_mask import head_mask_array, head_threshold
    from AnonMRILib.transforms.tissue_model import brain_tissue_levels

    head, mask = sample
    output, details = refaced
    brain = mask.array != 0
    region = head_mask_array(head.array) & (ndimage.distance_transform_edt(~brain, sampling=head.spacing) > 3.0)

    def gradient(volume):
        return np.sqrt(sum(g ** 2 for g in np.gradient(volume.array.astype(np.float32), *volume.spacing)))

    assert gradient(output)[region].mean() > 0.6 * gradient(head)[region].mean()
    air = float(np.median(head.array[head.array < head_threshold(head.array)]))
    levels = brain_tissue_levels(head.array[brain], air)
    values = output.array[region]
    assert np.mean(values > levels.wm) > 0.03 and np.mean(values < 0.25 * levels.csf) > 0.02


def test_no_dark_ring_or_step_at_the_brain_edge(sample, refaced):
    """The brain mask's outermost millimetre continues outside it: the first millimetre outside
    is as bright as the last one inside within a quarter of the GM-CSF contrast (the average-head
    template left the brain's dark edge against grey tissue: a ring), on the sample at 1.5 mm."""
    from scipy import ndimage

    from AnonMRILib.transforms.tissue_model import brain_tissue_levels

    head, mask = sample
    output, _ = refaced
    brain = mask.array != 0
    inside = ndimage.distance_transform_edt(brain, sampling=head.spacing)
    outside = ndimage.distance_transform_edt(~brain, sampling=head.spacing)
    levels = brain_tissue_levels(head.array[brain], 0.0)
    last = np.median(output.array[brain & (inside <= 1.5)].astype(float))
    first = np.median(output.array[~brain & (outside <= 1.5)].astype(float))
    assert abs(first - last) < 0.25 * (levels.gm - levels.csf)


def test_no_cut_edge_and_air_far_outside_the_hull(sample, refaced):
    from scipy import ndimage

    head, mask = sample
    output, details = refaced
    hull = details["convex_hull"].array != 0
    far = ~ndimage.binary_dilation(hull, iterations=int(np.ceil(8.0 / min(head.spacing))) + 1)
    background = np.median(head.array[~ndimage.binary_dilation(hull, iterations=10)])
    assert np.all(np.abs(output.array[far].astype(float) - background) <= 1)
    # the skin is not at the hull's planes: the output's head is not the hull (a face has concavities)
    from AnonMRILib.transforms.head_mask import head_threshold

    skin = output.array >= head_threshold(head.array)
    front = hull & ~(mask.array != 0)
    air_inside_hull = np.mean(~skin[front])
    assert 0.05 < air_inside_hull < 0.6


def test_open_detector_finds_a_face_that_is_not_the_patients(sample, refaced):
    """dlib's detector finds a face in the refaced rendering (the average head's own skin scored
    0.42 here, MakeHuman's neutral head about 1.5 and more), not the patient's (face_judge)."""
    assert_another_natural_face(sample[0], refaced[0])


def test_neck_continues_the_template_without_a_skirt(sample, refaced):
    """Below the template's lower end the neck is the template's, continued down: the head's
    cross-section in the lowest slices is not wider than 15 mm higher (the hull there is)."""
    from AnonMRILib.transforms.head_mask import head_threshold

    head, _ = sample
    output, details = refaced
    skin = output.array >= head_threshold(head.array)
    hull = details["convex_hull"].array != 0
    axis = int(np.argmax(np.abs(head.affine[2, :3])))
    area = np.moveaxis(skin, axis, -1).sum(axis=(0, 1))
    hull_area = np.moveaxis(hull, axis, -1).sum(axis=(0, 1))
    if head.affine[2, axis] < 0:
        area, hull_area = area[::-1], hull_area[::-1]
    lowest = int(np.flatnonzero(area > 0)[0])
    higher = lowest + int(round(15.0 / head.spacing[axis]))
    assert area[lowest] <= 1.05 * area[higher]
    assert area[lowest] < 0.9 * hull_area[lowest]


@pytest.mark.parametrize("flip", [False, True])
def test_extrude_inferiorly_repeats_the_slice_above_the_covered_end(flip):
    from AnonMRILib.transforms.anatomical_prior import extrude_inferiorly

    values = np.random.default_rng(0).random((4, 5, 12)).astype(np.float32)
    covered = np.zeros(values.shape, bool)
    covered[:, :, 4:] = True
    covered[0, 0] = False  # a column the template never reaches keeps its values
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    if flip:  # index 0 is superior: the same data seen from the other end
        values, covered, affine = values[:, :, ::-1].copy(), covered[:, :, ::-1].copy(), np.diag([2.0, 2.0, -2.0, 1.0])
    out = extrude_inferiorly(values, covered, affine, source_mm=3.0)
    if flip:
        out, values = out[:, :, ::-1], values[:, :, ::-1]
    # 3 mm at 2 mm voxels: two voxels above the lowest covered one (index 4 -> 6)
    assert np.array_equal(out[1:, :, :4], np.repeat(values[1:, :, 6:7], 4, axis=2))
    assert np.array_equal(out[0, 1:, :4], np.repeat(values[0, 1:, 6:7], 4, axis=1))
    assert np.array_equal(out[:, :, 4:], values[:, :, 4:])
    assert np.array_equal(out[0, 0], values[0, 0])


def test_config_and_template_checks(tmp_path, sample):
    head, mask = sample
    with pytest.raises(InputError):
        AnatomicalPriorConfig(demons_spacings_mm=(6.0,), demons_iterations=(10, 10))
    with pytest.raises(InputError):
        load_template_head(AnatomicalPriorConfig(template_dir=tmp_path))
    with pytest.raises(InputError):
        place_anatomical_prior(mask.with_array(np.zeros(mask.shape, np.uint8)), mask, 1.0)


def test_reface_through_deface_and_cli(tmp_path, sample, refaced):
    from AnonMRILib.cli.main import main
    from AnonMRILib.io import load_volume, save_volume
    from AnonMRILib.pipelines.baselines import deface

    head, mask = sample
    via_deface = deface(head, "reface", brain_mask=mask, seed=3, config=FAST)
    via_reface = reface(head, brain_mask=mask, seed=3, config=FAST)
    assert np.array_equal(via_deface.array, via_reface.array)
    save_volume(head, tmp_path / "in.nii.gz")
    save_volume(mask, tmp_path / "mask.nii.gz")
    assert main(["deface", str(tmp_path / "in.nii.gz"), str(tmp_path / "out.nii.gz"), "--method", "reface",
                 "--brain-mask", str(tmp_path / "mask.nii.gz"), "--quiet"]) == 0
    out = load_volume(tmp_path / "out.nii.gz")
    assert np.array_equal(out.array, refaced[0].array)   # same defaults, same seed: the API's output
    assert (tmp_path / "out_before_after.png").is_file()


def test_thick_slices_average_the_rendering_over_the_slab_not_a_wider_gaussian():
    """A 6.5 mm slice integrates its slab (a box), as the brain prior does: an edge crossing the
    slices ramps over exactly the slab (6.5 mm; 5 mm with a 1.5 mm gap), flat beyond it; in-plane
    and near-isotropic axes are left as they were (Gaussian of the extra extent, or none)."""
    from AnonMRILib.io import Volume
    from AnonMRILib.transforms.anatomical_prior import _antialias_for, slab_box_kernel, target_extent_mm

    assert np.allclose(slab_box_kernel(2.0), [0.25, 0.5, 0.25]) and np.isclose(slab_box_kernel(6.5).sum(), 1.0)
    assert np.allclose(slab_box_kernel(5.0), np.full(5, 0.2)) and np.allclose(slab_box_kernel(1.0), [1.0])
    grid = Volume(np.zeros((4, 4, 40), np.float32), np.eye(4))
    step = np.zeros(grid.shape, np.float32)
    step[:, :, 20:] = 1.0  # an edge at z = 19.5 mm, sharp on the template's 1 mm grid
    thick = Volume(np.zeros((8, 8, 4), np.float32), np.diag([0.78, 0.78, 6.5, 1.0]))
    assert np.allclose(target_extent_mm(thick), [0.78, 0.78, 6.5])
    assert np.allclose(target_extent_mm(thick, slice_thickness_mm=5.0), [0.78, 0.78, 5.0])
    for thickness, ramp in ((None, 6.5), (5.0, 5.0)):
        profile = _antialias_for(step, grid, thick, thickness)[1, 1]
        steps = np.diff(profile)
        kernel = slab_box_kernel(ramp)
        rising = np.flatnonzero(steps > 1e-7)
        assert np.allclose(steps[rising], kernel, atol=1e-6), (thickness, profile)  # the box itself
        assert np.isclose(np.sum(kernel), 1.0) and np.isclose(kernel.size, 2 * np.ceil(ramp / 2 - 0.5) + 1)
        assert np.isclose(np.sum(kernel * (np.arange(kernel.size) - kernel.size // 2) ** 2), ramp ** 2 / 12, rtol=0.1)
        assert np.allclose(profile[:15], 0.0) and np.allclose(profile[25:], 1.0)
    assert np.array_equal(_antialias_for(step, grid, Volume(np.zeros((4, 4, 4), np.float32), np.eye(4))), step)
    coarse = _antialias_for(step, grid, Volume(np.zeros((4, 4, 4), np.float32), np.diag([1.5, 1.5, 1.5, 1.0])))
    assert 0.0 < coarse[1, 1, 18] < 0.1 and np.allclose(coarse[1, 1, :15], 0.0)  # the Gaussian of 1.12 mm
    with pytest.raises(InputError):
        AnatomicalPriorConfig(slice_thickness_mm=0.0)


def test_thick_slices_draw_the_bright_tissue_as_bright_as_the_input_has_it(sample):
    """Thick, anisotropic slices get ``thick_slice_bright_stretch``, read from the grid alone; a 3-D
    grid keeps ``bright_stretch``. On the sample averaged into 6 mm slabs, the bright tail outside
    the brain (95th percentile, > 3 mm out, x WM above air) is the input's own (1.76) within 0.15;
    the 3-D stretch draws it more than 0.15 dimmer (1.46); the brain is untouched."""
    from scipy import ndimage

    from AnonMRILib.io import Volume
    from AnonMRILib.transforms.tissue_model import brain_tissue_levels

    grid = lambda *spacing: Volume(np.zeros((4, 4, 4), np.float32), np.diag([*spacing, 1.0]))  # noqa: E731
    config = AnatomicalPriorConfig()
    assert config.is_thick_sliced(grid(0.78, 0.78, 6.5)) and config.is_thick_sliced(grid(3.0, 0.5, 0.5))
    for spacing in ((1.0, 1.0, 1.0), (3.0, 3.0, 3.0), (1.0, 1.0, 2.0), (1.0, 1.0, 1.2)):
        assert not config.is_thick_sliced(grid(*spacing)) and config.rendering_for(grid(*spacing)) is config
    assert not AnatomicalPriorConfig(slice_thickness_mm=2.0).is_thick_sliced(grid(0.78, 0.78, 6.5))  # as given
    assert config.rendering_for(grid(0.78, 0.78, 6.5)).bright_stretch == config.thick_slice_bright_stretch
    with pytest.raises(InputError):
        AnatomicalPriorConfig(thick_slice_bright_stretch=0.0)

    head, mask = sample
    axis = int(np.argmax(np.abs(head.affine[2, :3])))
    slabs = head.shape[axis] // 4

    def slab_mean(array):
        array = np.take(np.asarray(array, np.float32), np.arange(4 * slabs), axis=axis)
        shape = list(array.shape)
        shape[axis:axis + 1] = [slabs, 4]
        return array.reshape(shape).mean(axis=axis + 1)

    affine = head.affine.copy()
    affine[:3, 3] += 1.5 * affine[:3, axis]
    affine[:3, axis] *= 4
    thick = Volume(slab_mean(head.array), affine)
    thick_mask = Volume((slab_mean(mask.array) > 0.5).astype(np.uint8), affine)
    brain = thick_mask.array != 0
    far = ndimage.distance_transform_edt(~brain, sampling=thick.spacing) > 3.0

    def bright_tail(volume):
        values = np.asarray(volume.array, np.float64)
        air = float(np.median(values[values <= np.percentile(values, 20)]))
        wm = brain_tissue_levels(np.asarray(thick.array)[brain], air).wm
        tissue = far & (values > air + 0.2 * (wm - air))
        return float(np.percentile((values[tissue] - air) / (wm - air), 95))

    tails = []
    for stretch in (config.thick_slice_bright_stretch, config.bright_stretch):
        out = reface(thick, brain_mask=thick_mask, seed=0,
                     config=AnatomicalPriorConfig(demons_iterations=(15, 5), thick_slice_bright_stretch=stretch))
        assert np.array_equal(out.array[brain], thick.array[brain])
        tails.append(bright_tail(out))
    own = bright_tail(thick)
    assert abs(tails[0] - own) < 0.15 and tails[1] < own - 0.15, (own, tails)


@pytest.mark.parametrize("command", ["remodel", "deface"])
def test_remodel_and_reface_clis_take_the_slice_thickness_from_the_flag_or_the_bids_sidecar(tmp_path, sample,
                                                                                             monkeypatch, command):
    import json

    import AnonMRILib.pipelines.baselines as baselines
    import AnonMRILib.pipelines.remodel as remodel
    from AnonMRILib.cli.main import main
    from AnonMRILib.io import save_volume

    head, mask = sample
    save_volume(head, tmp_path / "sub-1_T1w.nii.gz")
    save_volume(mask, tmp_path / "mask.nii.gz")
    seen = []

    def fake_remodel(volume, brain_mask=None, prior_config=None, **kwargs):
        seen.append(prior_config)
        return volume

    def fake_deface(volume, method, brain_mask=None, config=None, **kwargs):
        seen.append(config)
        return volume

    monkeypatch.setattr(remodel, "remodel_face", fake_remodel)
    monkeypatch.setattr(baselines, "deface", fake_deface)
    method = ["--method", "reface", "--no-before-after"] if command == "deface" else []
    args = [command, str(tmp_path / "sub-1_T1w.nii.gz"), str(tmp_path / "out.nii.gz"), "--brain-mask",
            str(tmp_path / "mask.nii.gz"), "--quiet", *method]
    assert main(args) == 0 and seen[-1] is None  # no sidecar, no flag: the spacing
    (tmp_path / "sub-1_T1w.json").write_text(json.dumps({"SliceThickness": 5}))
    assert main(args) == 0 and seen[-1].slice_thickness_mm == 5.0
    assert main(args + ["--slice-thickness", "4"]) == 0 and seen[-1].slice_thickness_mm == 4.0  # the flag wins
    calls = len(seen)
    assert main(args + ["--slice-thickness", "0"]) == 2 and len(seen) == calls  # refused before running
    if command == "deface":  # a removal method has no prior to give it to
        assert main([a if a != "reface" else "quickshear" for a in args]) == 0 and seen[-1] is None
