"""Privacy transform gamma(x): probabilistic pooling, head threshold, surface Z, convex hull,
model grid, brain preservation, gamma itself and the ``privacy-transform`` command."""
import numpy as np
import pytest
import torch

from AnonMRILib.errors import InputError, InvariantError
from AnonMRILib.io import Volume, load_volume
from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head, sample_brain_mask_path, sample_head_path
from AnonMRILib.transforms import pooling
from AnonMRILib.transforms.brain_preservation import check_brain_preserved, compose_preserving
from AnonMRILib.transforms.convex_hull import ConvexHullConfig, HalfSpaces, convex_hull, hull_half_spaces
from AnonMRILib.transforms.head_mask import head_mask_array, head_threshold
from AnonMRILib.transforms.model_grid import build_model_grid
from AnonMRILib.transforms.privacy import PrivacyTransformConfig, privacy_transform
from AnonMRILib.transforms.surface import (boundary_voxels, first_hit_maps, random_rotations,
                                           surface_representation, surface_representation_volumetric)


def generator(seed):
    return torch.Generator().manual_seed(seed)


def ellipsoid(shape, center, radii):
    i, j, k = np.meshgrid(*[np.arange(n, dtype=np.float32) for n in shape], indexing="ij")
    return (((i - center[0]) / radii[0]) ** 2 + ((j - center[1]) / radii[1]) ** 2
            + ((k - center[2]) / radii[2]) ** 2) <= 1


def synthetic_head(scale=1.0, nose=True):
    """Bool head (ellipsoid + nose bump towards +j) and brain (inner ellipsoid), inside the volume."""
    shape = tuple(int(round(n * scale)) for n in (72, 88, 80))
    c = np.array(shape) / 2
    head = ellipsoid(shape, c, np.array([26, 32, 29]) * scale)
    if nose:
        head |= ellipsoid(shape, c + np.array([0, 32, -3]) * scale, np.array([4, 7, 6]) * scale)
    brain = ellipsoid(shape, c + np.array([0, -3, 4]) * scale, np.array([19, 24, 19]) * scale)
    return head, brain


def dice(a, b):
    return 2.0 * np.count_nonzero(a & b) / (np.count_nonzero(a) + np.count_nonzero(b))


@pytest.fixture(scope="module")
def sample():
    return load_sample_head(), load_sample_brain_mask()


@pytest.fixture(scope="module")
def sample_transform(sample):
    head, brain = sample
    return privacy_transform(head, brain, PrivacyTransformConfig(size=64, rotations=16), seed=3)


# --- probabilistic average pooling ------------------------------------------------------------

def test_probabilistic_pooling_matches_average_pooling_in_expectation():
    binary = (torch.rand(1, 1, 16, 16, 16, generator=generator(0)) < 0.4).float()
    expected = pooling.average_pool(binary, 2)
    draws = torch.stack([pooling.probabilistic_average_pool(binary, 2, generator(seed)) for seed in range(400)])
    assert draws.shape == (400, 1, 1, 8, 8, 8)
    assert set(torch.unique(draws).tolist()) <= {0.0, 1.0}
    mean = draws.mean(dim=0)
    # per-voxel standard error <= 0.5/sqrt(400) = 0.025; 512 voxels -> max within ~4 sigma
    assert float((mean - expected).abs().max()) < 0.1
    assert float((mean - expected).abs().mean()) < 0.025
    # the proportion of ones is preserved in expectation (s.e. of the pooled mean ~0.001)
    assert abs(float(draws.mean()) - float(binary.mean())) < 0.005
    # voxels whose block is all 0 / all 1 are always 0 / 1
    certain = (expected == 0) | (expected == 1)
    assert certain.any() and torch.all(draws[:, certain] == expected[certain])


def test_probabilistic_pooling_extremes_seeds_and_shapes():
    block = torch.zeros(8, 8, 8)
    block[:4, :4, :4] = 1  # one full 4^3 block -> one certain 1 at factor 4
    out = pooling.probabilistic_average_pool(block, 4, generator(1))
    assert out.shape == (2, 2, 2) and float(out.sum()) == 1.0 and float(out[0, 0, 0]) == 1.0
    binary = (torch.rand(2, 2, 8, 8, 8, generator=generator(2)) < 0.5)
    a = pooling.probabilistic_average_pool(binary, 2, generator(7))
    b = pooling.probabilistic_average_pool(binary, 2, generator(7))
    c = pooling.probabilistic_average_pool(binary, 2, generator(8))
    assert a.dtype == torch.float32 and a.shape == (2, 2, 4, 4, 4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    with pytest.raises(ValueError):
        pooling.probabilistic_average_pool(torch.zeros(6, 6, 7), 2)


def test_average_pool_is_block_mean():
    volume = torch.rand(1, 1, 8, 8, 8, generator=generator(3))
    pooled = pooling.average_pool(volume, 2)
    manual = volume.reshape(1, 1, 4, 2, 4, 2, 4, 2).mean(dim=(3, 5, 7))
    assert torch.allclose(pooled, manual, atol=1e-6)
    assert pooling.average_pool(volume[0, 0], 4).shape == (2, 2, 2)


def test_privacy_pyramid_scales_and_channels():
    head, brain = synthetic_head(0.35)
    pad = [(0, 32 - n) for n in head.shape]
    head, brain = np.pad(head, pad), np.pad(brain, pad)
    gamma = torch.zeros(3, 32, 32, 32)
    gamma[pooling.CONVEX_HULL_CHANNEL] = torch.from_numpy(head).float()
    gamma[pooling.BRAIN_MASK_CHANNEL] = torch.from_numpy(brain).float()
    gamma[pooling.BRAIN_INTENSITY_CHANNEL] = torch.from_numpy(brain).float() * 0.7
    levels = pooling.privacy_pyramid(gamma, generator=generator(0))
    assert [level.shape[-1] for level in levels] == [4, 8, 16, 32]
    assert all(level.shape[0] == 3 for level in levels)
    assert torch.equal(levels[-1], gamma)
    for level in levels[:-1]:
        factor = 32 // level.shape[-1]
        binary = level[list(pooling.BINARY_CHANNELS)]
        assert set(torch.unique(binary).tolist()) <= {0.0, 1.0}
        assert torch.allclose(level[pooling.BRAIN_INTENSITY_CHANNEL],
                              pooling.average_pool(gamma[pooling.BRAIN_INTENSITY_CHANNEL], factor))
    batched = pooling.privacy_pyramid(gamma[None].repeat(2, 1, 1, 1, 1), sizes=[8, 32], generator=generator(0))
    assert [tuple(level.shape) for level in batched] == [(2, 3, 8, 8, 8), (2, 3, 32, 32, 32)]
    with pytest.raises(ValueError):
        pooling.privacy_pyramid(gamma[:2])


# --- head threshold ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["otsu", "percentile"])
def test_head_mask_is_independent_of_intensity_scale_and_offset(sample, method):
    head, brain = sample
    image = head.array.astype(np.float64)
    reference = head_mask_array(image, method)
    for scale, offset in ((1000.0, 0.0), (0.001, 0.0), (0.001, 250.0), (3.7, -40.0)):
        mask = head_mask_array(image * scale + offset, method)
        assert np.count_nonzero(mask != reference) <= 1e-5 * mask.size, (scale, offset)
    delta = head_threshold(image, method)
    assert abs(head_threshold(image * 0.001 + 250.0, method) - (delta * 0.001 + 250.0)) < 1e-6 * 250
    # a sensible head: contains the brain, a sizeable part of the field of view, not all of it
    # (dark brain voxels connected to the air through the airways are not in it; gamma adds the brain)
    assert reference[brain.array > 0].mean() > 0.99
    assert 0.1 < reference.mean() < 0.6


def test_head_threshold_refuses_constant_images():
    with pytest.raises(InputError):
        head_threshold(np.zeros((8, 8, 8)))


# --- surface representation Z -----------------------------------------------------------------

def test_random_rotations_are_uniform_rotations():
    rotations = random_rotations(2000, generator(0))
    identity = torch.eye(3, dtype=torch.float64)
    assert torch.allclose(rotations @ rotations.transpose(1, 2), identity.expand(2000, 3, 3), atol=1e-12)
    assert torch.allclose(torch.det(rotations), torch.ones(2000, dtype=torch.float64), atol=1e-12)
    # Haar measure: E[R] = 0 and E[R_ij^2] = 1/3
    assert float(rotations.mean(dim=0).abs().max()) < 0.05
    assert float(((rotations ** 2).mean(dim=0) - 1 / 3).abs().max()) < 0.03
    assert torch.equal(random_rotations(4, generator(5)), random_rotations(4, generator(5)))


def test_surface_identity_rotation_is_the_six_first_hit_maps():
    head, _ = synthetic_head(0.55)
    expected = first_hit_maps(torch.from_numpy(head)[None, None])[0, 0] / 6
    identity = torch.eye(3, dtype=torch.float64)[None]
    assert torch.equal(surface_representation(head, rotation_matrices=identity), expected)
    volumetric = surface_representation_volumetric(head, rotation_matrices=identity)
    assert float((volumetric - expected).abs().max()) < 1e-4


def test_first_hit_maps_count_rays():
    binary = torch.zeros(1, 1, 5, 5, 5, dtype=torch.bool)
    binary[0, 0, 1:4, 1:4, 1:4] = True
    hits = first_hit_maps(binary)[0, 0]
    assert float(hits[2, 2, 2]) == 0          # the centre is hidden from every ray
    assert float(hits[1, 2, 2]) == 1          # a face centre: one ray
    assert float(hits[1, 1, 1]) == 3          # a corner: three rays
    assert float(hits.sum()) == 6 * 9         # 9 rays per direction, each stops once


def test_surface_is_a_probability_on_the_boundary_and_matches_the_volumetric_reference():
    head, _ = synthetic_head(0.55, nose=False)
    fast = surface_representation(head, 6, generator(4))
    reference = surface_representation_volumetric(head, 6, generator(4))
    assert float(fast.min()) >= 0 and float(fast.max()) <= 1
    shell = np.zeros(head.shape, bool)
    shell[tuple(boundary_voxels(torch.from_numpy(head)).T.numpy())] = True
    assert torch.all(fast[torch.from_numpy(~shell)] == 0)
    # both implementations spread the same amount of surface evidence over the same places
    assert abs(float(fast.sum()) / float(reference.sum()) - 1) < 0.1
    from scipy import ndimage

    a = ndimage.gaussian_filter(fast.numpy(), 1.5).ravel()
    b = ndimage.gaussian_filter(reference.numpy(), 1.5).ravel()
    assert np.corrcoef(a, b)[0, 1] > 0.95
    assert torch.equal(surface_representation(head, 6, generator(4)), fast)


# --- convex hull c(x) -------------------------------------------------------------------------

def test_half_space_voxelisation_matches_the_brute_force_test():
    rng = np.random.default_rng(0)
    normals = rng.normal(size=(30, 3))
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    center = np.array([12.0, 15.0, 10.0])
    offsets = -(normals @ center) - rng.uniform(4, 9, size=30)
    normals[0] = [1.0, 0.0, 0.0]  # an axis-aligned plane: no k term
    offsets[0] = -14.0
    spaces = HalfSpaces(normals, offsets)
    shape = (24, 30, 21)
    brute = spaces.contains(np.argwhere(np.ones(shape, bool))).reshape(shape)
    assert brute.any() and np.array_equal(spaces.voxelize(shape), brute)
    # re-expressed in a frame with twice the resolution and a shift: same set of points
    transform = np.diag([0.5, 0.5, 0.5, 1.0])
    transform[:3, 3] = [-1.0, 2.0, 0.5]
    fine = spaces.in_frame(transform)
    points = np.argwhere(np.ones((48, 60, 42), bool)).astype(float)
    mapped = points @ transform[:3, :3].T + transform[:3, 3]
    assert np.array_equal(fine.contains(points), spaces.contains(mapped))


def test_convex_hull_contains_head_and_brain_and_is_convex():
    head, brain = synthetic_head()
    hull = convex_hull(head, ConvexHullConfig(rotations=16), generator(0))
    assert hull.mask[brain].all()
    assert hull.mask[head].mean() > 0.999
    assert hull.mask.sum() < 1.3 * head.sum()  # a hull, not the whole field of view
    assert hull.half_spaces.count == 100
    # convex: c is exactly the set of voxel centres inside the convex hull of its own voxels
    own = hull_half_spaces(boundary_voxels(torch.from_numpy(hull.mask)).numpy(), facets=None, margin=1e-6)
    assert np.array_equal(own.voxelize(head.shape), hull.mask)
    # random pairs of inside voxels: their midpoints are inside
    inside = np.argwhere(hull.mask)
    rng = np.random.default_rng(1)
    pairs = inside[rng.integers(0, len(inside), size=(2000, 2))]
    assert hull.half_spaces.contains(pairs.mean(axis=1)).all()
    # all facets: tighter than 100 facets, still containing the head
    tight = convex_hull(head, ConvexHullConfig(rotations=16, facets=None), generator(0))
    assert tight.mask.sum() <= hull.mask.sum() and tight.mask[head].mean() > 0.999


def test_convex_hull_does_not_reproduce_the_face():
    from scipy import ndimage

    head, _ = synthetic_head()
    c = np.array(head.shape) / 2
    # another face with the same hull: eye sockets carved, nose and mouth region filled in
    # (strictly inside the head's exact hull, so the hull of the other head is the same)
    exact = convex_hull(head, ConvexHullConfig(rotations=32, facets=None), generator(0)).mask
    other = head.copy()
    for side in (-1, 1):
        other &= ~ellipsoid(head.shape, c + np.array([side * 10, 29, 6]), (7, 6, 5))
    i, j, k = np.meshgrid(*[np.arange(n) for n in head.shape], indexing="ij")
    lower_face = (j > c[1] + 22) & (k > c[2] - 20) & (k < c[2]) & (np.abs(i - c[0]) < 12)
    other |= ndimage.binary_erosion(exact) & lower_face
    changed = np.count_nonzero(head != other)
    assert changed > 1000

    def hull(volume, seed, facets):
        return convex_hull(volume, ConvexHullConfig(rotations=16, facets=facets), generator(seed)).mask

    # all facets: c(x) is nearly the same for both faces (an order of magnitude below the face change)
    assert np.count_nonzero(hull(head, 9, None) != hull(other, 9, None)) < 0.1 * changed
    # 100 random facets (the default): the two faces differ no more than two seeds on one face
    a, b, a_other_seed = hull(head, 9, 100), hull(other, 9, 100), hull(head, 10, 100)
    assert dice(a, b) > 0.95
    assert np.count_nonzero(a != b) < 1.5 * np.count_nonzero(a != a_other_seed)


def test_convex_hull_is_deterministic_per_seed():
    head, _ = synthetic_head()
    a = convex_hull(head, ConvexHullConfig(rotations=8), generator(11))
    b = convex_hull(head, ConvexHullConfig(rotations=8), generator(11))
    c = convex_hull(head, ConvexHullConfig(rotations=8), generator(12))
    assert np.array_equal(a.mask, b.mask) and np.array_equal(a.points, b.points)
    assert not np.array_equal(a.points, c.points)


# --- model grid -------------------------------------------------------------------------------

def test_model_grid_round_trip(sample):
    head, _ = sample
    mask = Volume(head_mask_array(head.array), head.affine)
    grid = build_model_grid(mask.with_array(mask.array.astype(np.uint8)), size=128, margin_mm=10)
    assert grid.shape == (128, 128, 128) and np.allclose(np.abs(np.diag(grid.affine)[:3]), grid.spacing_mm)
    model = grid.to_model(head)
    assert model.shape == grid.shape and model.dtype == np.float32
    model_mask = grid.to_model(mask, "nearest") > 0
    # the head fits with its margin: nothing on the model grid's faces
    for axis in range(3):
        assert not model_mask.take([0, 127], axis=axis).any()
    back = grid.from_model(model)
    assert back.same_grid(head) and back.dtype == np.float32
    inside = mask.array
    scale = float(np.percentile(head.array[inside], 99))
    error = np.abs(back.array[inside] - head.array[inside]) / scale
    assert error.mean() < 0.06
    assert np.corrcoef(back.array[inside], head.array[inside])[0, 1] > 0.93
    mask_back = grid.from_model(model_mask.astype(np.float32), interpolation="nearest").array > 0
    assert dice(mask_back, inside) > 0.97


def test_model_grid_is_ras_whatever_the_input_orientation(sample):
    head, _ = sample
    flip = np.diag([-1.0, 1.0, 1.0, 1.0])
    flip[0, 3] = head.shape[0] - 1
    flipped = Volume(head.array[::-1].copy(), head.affine @ flip)  # same world, LAS voxel order
    mask = head.with_array(head_mask_array(head.array).astype(np.uint8))
    mask_flipped = flipped.with_array(mask.array[::-1].copy())
    grid = build_model_grid(mask, size=64)
    grid_flipped = build_model_grid(mask_flipped, size=64)
    assert np.allclose(grid.affine, grid_flipped.affine)
    model, model_flipped = grid.to_model(head), grid_flipped.to_model(flipped)
    # equal up to where anti-aliasing blocks start (block averaging runs along voxel order)
    assert np.abs(model - model_flipped).mean() < 0.01 * np.percentile(model, 99)
    assert np.corrcoef(model.ravel(), model_flipped.ravel())[0, 1] > 0.99
    # a bright point lands where its world coordinates say
    point = np.zeros(head.shape, np.float32)
    point[70, 100, 90] = 1.0
    model = grid.to_model(head.with_array(point))
    peak = np.array(np.unravel_index(np.argmax(model), model.shape), float)
    world_peak = grid.affine[:3, :3] @ peak + grid.affine[:3, 3]
    assert np.linalg.norm(world_peak - head.world_coordinates(np.array([[70, 100, 90]]))[0]) <= grid.spacing_mm


def test_model_grid_refuses_bad_sizes(sample):
    head, _ = sample
    mask = head.with_array(head_mask_array(head.array).astype(np.uint8))
    with pytest.raises(InputError):
        build_model_grid(mask, size=100)
    with pytest.raises(InputError):
        build_model_grid(mask.with_array(np.zeros(mask.shape, np.uint8)))


# --- brain preservation -----------------------------------------------------------------------

def test_compose_preserving_keeps_brain_voxels_bit_for_bit(sample):
    head, brain = sample
    generated = head.with_array(np.random.default_rng(0).normal(300, 200, head.shape).astype(np.float32))
    out = compose_preserving(head, generated, brain)
    inside = brain.array > 0
    assert out.dtype == head.dtype and out.same_grid(head)
    assert np.array_equal(out.array[inside], head.array[inside])
    assert np.array_equal(out.array[~inside], np.clip(np.rint(generated.array[~inside]), -32768, 32767))
    tampered = out.array.copy()
    tampered[tuple(np.argwhere(inside)[0])] += 1
    with pytest.raises(InvariantError):
        check_brain_preserved(head, out.with_array(tampered), brain)
    with pytest.raises(InputError):
        compose_preserving(head, generated.with_array(np.full(head.shape, np.nan, np.float32)), brain)


# --- gamma(x) ---------------------------------------------------------------------------------

def test_privacy_transform_gamma_content(sample, sample_transform):
    head, brain = sample
    result = sample_transform
    gamma = result.gamma
    assert tuple(gamma.shape) == (3, 64, 64, 64) and gamma.dtype == torch.float32
    hull = gamma[pooling.CONVEX_HULL_CHANNEL]
    mask = gamma[pooling.BRAIN_MASK_CHANNEL]
    brain_values = gamma[pooling.BRAIN_INTENSITY_CHANNEL]
    assert set(torch.unique(hull).tolist()) == {0.0, 1.0} and set(torch.unique(mask).tolist()) == {0.0, 1.0}
    assert torch.all(hull >= mask)                      # c contains b
    assert torch.all(brain_values[mask == 0] == 0)      # b * x
    assert 0.2 < float(brain_values[mask == 1].mean()) < 1.0
    assert float(brain_values.max()) < 1.5
    # the normalisation is invertible and maps the model image to gamma's units
    norm = result.normalization
    assert np.allclose(norm.invert(norm.apply(np.array([0.0, 123.0, 900.0]))), [0.0, 123.0, 900.0])
    model = result.grid.to_model(Volume(head.array.astype(np.float32), head.affine))
    assert torch.allclose(brain_values[mask == 1], torch.from_numpy(norm.apply(model))[mask == 1], atol=1e-5)
    # the hull on the input grid: contains the brain and nearly all of the head, agrees with the model grid
    hull_input = result.convex_hull.array > 0
    assert result.convex_hull.same_grid(head)
    assert hull_input[brain.array > 0].all()
    assert hull_input[head_mask_array(head.array)].mean() > 0.995
    head_input = result.head_mask.array > 0
    assert result.head_mask.same_grid(head) and not np.any(head_input & ~hull_input)
    assert head_input[brain.array > 0].all() and 0.1 < head_input.mean() < 0.6
    hull_back = result.grid.from_model(hull.numpy(), interpolation="nearest").array > 0
    assert dice(hull_back, hull_input) > 0.97


def test_privacy_transform_is_deterministic_per_seed(sample, sample_transform):
    head, brain = sample
    config = PrivacyTransformConfig(size=64, rotations=16)
    again = privacy_transform(head, brain, config, seed=3)
    assert torch.equal(again.gamma, sample_transform.gamma)
    other = privacy_transform(head, brain, config, seed=4)
    assert not torch.equal(other.gamma, sample_transform.gamma)
    assert torch.equal(other.gamma[1:], sample_transform.gamma[1:])  # only the hull is random


def test_privacy_transform_restore_keeps_the_brain(sample, sample_transform):
    head, brain = sample
    generated = torch.rand(64, 64, 64, generator=generator(0))
    out = sample_transform.restore(generated, head)
    inside = brain.array > 0
    assert out.dtype == head.dtype and np.array_equal(out.array[inside], head.array[inside])
    outside_hull = sample_transform.convex_hull.array == 0
    assert np.all(out.array[outside_hull] == np.rint(sample_transform.normalization.offset))


def test_privacy_transform_of_an_oblique_scan(sample, sample_transform):
    head, brain = sample
    angle = np.deg2rad(20)
    tilt = np.eye(4)
    tilt[1:3, 1:3] = [[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]
    oblique = privacy_transform(Volume(head.array, tilt @ head.affine), Volume(brain.array, tilt @ brain.affine),
                                PrivacyTransformConfig(size=64, rotations=16), seed=3)
    # same voxels, tilted world: the hull in voxel space is nearly the same; the brain is in it
    hull, reference = oblique.convex_hull.array > 0, sample_transform.convex_hull.array > 0
    assert hull[brain.array > 0].all()
    assert dice(hull, reference) > 0.95


def test_privacy_transform_refuses_a_mask_on_another_grid(sample):
    head, brain = sample
    with pytest.raises(InputError):
        privacy_transform(head, Volume(brain.array[1:], brain.affine))


# --- command line -----------------------------------------------------------------------------

def test_privacy_transform_command(tmp_path, capsys):
    from AnonMRILib.cli.main import main

    status = main(["privacy-transform", str(sample_head_path()), str(tmp_path), "--brain-mask",
                   str(sample_brain_mask_path()), "--size", "32", "--rotations", "8", "--quiet"])
    assert status == 0
    head, brain = load_sample_head(), load_sample_brain_mask()
    hull = load_volume(tmp_path / "convex_hull.nii.gz")
    mask = load_volume(tmp_path / "brain_mask.nii.gz")
    brain_only = load_volume(tmp_path / "brain.nii.gz")
    for volume in (hull, mask, brain_only):
        assert volume.same_grid(head)
    assert np.array_equal(mask.array, brain.array)
    assert brain_only.dtype == head.dtype
    assert np.array_equal(brain_only.array, np.where(brain.array > 0, head.array, 0))
    assert hull.array[brain.array > 0].all()
    png = (tmp_path / "privacy_transform.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    not_a_folder = tmp_path / "privacy_transform.png"  # an existing file where the folder should be
    assert main(["privacy-transform", str(sample_head_path()), str(not_a_folder), "--quiet"]) == 2
    assert "expected an output folder" in capsys.readouterr().err and not_a_folder.read_bytes() == png
