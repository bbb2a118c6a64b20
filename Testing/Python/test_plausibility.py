"""Plausibility checks: real heads pass; noise, inverted contrast, absurd voxels and masks are refused."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.io import Volume, load_volume
from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path
from AnonMRILib.transforms.plausibility import (OVERRIDE_HINT, PlausibilityConfig, check_brain_mask,
                                                 check_head_present, check_lesion_mask, check_voxel_spacing)


@pytest.fixture(scope="module")
def sample():
    return load_volume(sample_head_path()), load_volume(sample_brain_mask_path())


def gaussian_noise(shape=(96, 96, 96), seed=0) -> Volume:
    return Volume(np.random.default_rng(seed).normal(100.0, 20.0, shape).astype(np.float32), np.eye(4))


def one_line_with_hint(error) -> bool:
    message = str(error.value)
    return "\n" not in message and message.endswith(OVERRIDE_HINT)


def test_the_sample_head_and_its_brain_pass(sample):
    head, brain = sample
    summary = check_head_present(head)
    assert 3000 < summary.volume_ml < 6000 and summary.solidity > 0.6 and summary.border_fraction < 0.1
    brain_summary = check_brain_mask(head, brain)
    assert 1300 < brain_summary.volume_ml < 1700 and brain_summary.inside_fraction > 0.98
    assert 0.2 < brain_summary.fraction_of_reference < 0.5
    assert all(120 < e < 200 for e in brain_summary.extent_mm)


@pytest.mark.parametrize("spacing", [1e-3, 0.05, 11.0])
def test_absurd_voxel_sizes_are_refused(sample, spacing):
    head, _ = sample
    affine = head.affine.copy()
    affine[:3, :3] = head.direction * spacing
    with pytest.raises(InputError, match="voxel size") as error:
        check_voxel_spacing(Volume(head.array, affine))
    assert one_line_with_hint(error)
    with pytest.raises(InputError, match="voxel size"):
        check_head_present(Volume(head.array, affine))
    # a caller who knows better widens the range
    check_voxel_spacing(Volume(head.array, affine), PlausibilityConfig(spacing_mm=(1e-4, 20.0)))


@pytest.mark.parametrize("shape", [(96, 96, 96), (64, 80, 72)])
def test_gaussian_noise_is_not_a_head(shape):
    with pytest.raises(InputError, match="no solid head") as error:
        check_head_present(gaussian_noise(shape))
    assert one_line_with_hint(error)


def test_a_contrast_inverted_head_is_refused(sample):
    head, _ = sample
    inverted = head.with_array(head.array.max() - head.array)
    with pytest.raises(InputError, match="contrast-inverted") as error:
        check_head_present(inverted)
    assert one_line_with_hint(error)


def test_head_of_implausible_volume_is_refused_unless_configured(sample):
    head, _ = sample
    small = Volume(head.array, head.affine @ np.diag([0.2, 0.2, 0.2, 1.0]))  # 0.3 mm voxels: a 37 mL "head"
    with pytest.raises(InputError, match="mL"):
        check_head_present(small)
    assert check_head_present(small, PlausibilityConfig(head_ml=(10.0, 20000.0))).volume_ml < 100


def test_brain_masks_that_are_not_a_brain_are_refused(sample):
    head, brain = sample
    whole_head = head.with_array((head.array > np.percentile(head.array, 60)).astype(np.uint8))
    with pytest.raises(InputError, match="mL") as error:
        check_brain_mask(head, whole_head)
    assert one_line_with_hint(error)
    speck = np.zeros(head.shape, np.uint8)
    speck[60:70, 80:90, 80:90] = 1
    with pytest.raises(InputError, match="mL"):
        check_brain_mask(head, head.with_array(speck))
    # a brain-sized mask placed outside the head (shifted into the air)
    shifted = np.zeros_like(brain.array)
    shifted[:, :, 60:] = brain.array[:, :, :-60]
    with pytest.raises(InputError, match="inside the head|spans"):
        check_brain_mask(head, head.with_array(shifted))
    # a flat slab of brain volume: wrong extent
    slab = np.zeros(head.shape, np.uint8)
    slab[5:134, 5:166, 80:98] = 1
    with pytest.raises(InputError, match="spans"):
        check_brain_mask(head, head.with_array(slab))
    with pytest.raises(InputError, match="shape"):
        check_brain_mask(head, Volume(brain.array[:-1], brain.affine))


def test_lesion_masks(sample):
    head, brain = sample
    lesion = np.zeros(head.shape, np.uint8)
    lesion[60:70, 90:100, 100:110] = 2
    summary = check_lesion_mask(head, head.with_array(lesion), brain)
    assert summary.inside_fraction == 1.0 and summary.fraction_of_reference < 0.01
    assert check_lesion_mask(head, head.with_array(lesion)).inside_fraction == 1.0
    with pytest.raises(InputError, match="empty"):
        check_lesion_mask(head, head.with_array(np.zeros_like(lesion)))
    assert check_lesion_mask(head, head.with_array(np.zeros_like(lesion)), allow_empty=True).volume_ml == 0.0
    whole = head.with_array(np.ones(head.shape, np.uint8))
    for brain_mask in (None, brain):
        with pytest.raises(InputError, match="covers|inside") as error:
            check_lesion_mask(head, whole, brain_mask)
        assert one_line_with_hint(error)
    outside = np.zeros(head.shape, np.uint8)
    outside[:5, :5, :5] = 1  # a corner of air
    with pytest.raises(InputError, match="inside the head"):
        check_lesion_mask(head, head.with_array(outside))
    assert check_lesion_mask(head, whole, config=PlausibilityConfig(lesion_head_fraction=10.0,
                                                                     lesion_inside=0.0)).fraction_of_reference > 1


def test_a_head_cut_by_the_field_of_view_holds_its_own_brain_mask(sample):
    """Thick clinical slices that end inside the brain (pyradiomics brain1) leave its dark cavities
    open onto the grid's edge, where 3-D hole filling cannot close them: the brain mask's containment
    is measured within the head's outline, slice by slice. A mask of another image stays refused."""
    from scipy import ndimage

    head, brain = sample
    inside = np.asarray(brain.array) != 0
    levels = np.flatnonzero(inside.any(axis=(0, 1)))
    top = int(levels[0] + 0.8 * (levels[-1] - levels[0]))  # the field of view ends inside the brain
    array = np.asarray(head.array)[:, :, :top].copy()
    # dark, CSF-like channels through the brain that reach the cut (ventricles and sulci opening upwards)
    core = ndimage.binary_erosion(inside[:, :, :top], iterations=3)
    channels = core & ((np.indices(core.shape)[0] % 4) < 2)
    array[channels] = 0
    cut = Volume(array, head.affine)
    cut_brain = Volume(inside[:, :, :top].astype(np.uint8), brain.affine)
    from AnonMRILib.transforms.plausibility import _coarse, _head_and_strides, DEFAULT_CONFIG

    head3d, strides = _head_and_strides(cut, DEFAULT_CONFIG)
    coarse = _coarse(inside[:, :, :top], strides)
    assert (coarse & head3d).sum() / coarse.sum() < DEFAULT_CONFIG.brain_inside_head  # the 3-D head alone refuses it
    summary = check_brain_mask(cut, cut_brain)
    assert summary.inside_fraction > 0.98
    shifted = np.zeros_like(cut_brain.array)
    shifted[:, 70:, :] = cut_brain.array[:, :-70, :]
    with pytest.raises(InputError, match="inside the head|spans|mL"):
        check_brain_mask(cut, cut.with_array(shifted))
