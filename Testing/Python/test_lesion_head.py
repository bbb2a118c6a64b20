"""Whole-head inputs of the lesion pipeline: input kind, face treatment outside the brain, edge cases,
and the appearance matching (intensity scale, noise, sharpness) of the generated brain."""
import warnings

import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.io import Volume, load_volume, save_volume
from AnonMRILib.pipelines.lesion import LesionAnonymizationConfig, anonymize_lesions, anonymize_lesions_with_details
from AnonMRILib.pipelines.lesion_head import FACE_KEPT_WARNING, brain_region, input_kind
from lesion_fixtures import brain_with_lesion, save_tiny_weights, tiny_models

FAST = dict(steps=1, exact_lesion=True)


@pytest.fixture(scope="module")
def models():
    return tiny_models()


def head_with_lesion(voxel_mm=(4.0, 4.0, 5.0), seed=0):
    """brain_with_lesion inside a bright scalp shell with a 'nose', in a noisy background; returns
    (head, lesion, brain mask) Volumes."""
    brain_volume, lesion = brain_with_lesion(shape=(44, 48, 14), seed=seed)
    affine = np.diag(list(voxel_mm) + [1.0])
    affine[:3, 3] = [-80.0, -90.0, -30.0]
    brain = brain_volume.array > 0
    from scipy import ndimage

    head = ndimage.binary_dilation(brain, iterations=3)
    head[:, :, 0] = head[:, :, -1] = False
    scalp = head & ~ndimage.binary_dilation(brain, iterations=1)
    rng = np.random.default_rng(seed + 1)
    array = np.abs(rng.normal(0, 10, brain.shape)) + np.where(scalp, 600, 0) + brain_volume.array
    array[20:24, 45:48, 5:9] = 500  # a 'nose' in front
    return (Volume(array.astype(np.int16), affine), Volume(lesion.array, affine),
            Volume(brain.astype(np.uint8), affine))


def test_input_kind_detects_skull_stripped_and_whole_head_inputs():
    head, _, brain = head_with_lesion(voxel_mm=(8.0, 8.0, 10.0))  # physically head-sized (> 2 L)
    stripped = head.with_array(np.where(brain.array != 0, head.array, 0).astype(np.int16))
    small_stripped = Volume(stripped.array, np.diag([4.0, 4.0, 5.0, 1.0]))
    assert input_kind(head) == "head" and input_kind(small_stripped) == "brain"
    assert input_kind(stripped) == "head"  # too large for a brain: treated as a head
    assert input_kind(small_stripped, "head") == "head"
    with pytest.raises(InputError, match="input kind"):
        input_kind(head, "skull")


@pytest.mark.parametrize("method", ["none", "black"])
def test_head_end_to_end_keeps_grid_lesion_and_treats_only_outside(models, method):
    head, lesion, brain = head_with_lesion()
    config = LesionAnonymizationConfig(**FAST, face_method=method, input_kind="head")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, details = anonymize_lesions_with_details(head, lesion, config, weights=models, seed=2, brain_mask=brain)
    assert (FACE_KEPT_WARNING in [str(w.message) for w in caught]) == (method == "none")
    assert details["input_kind"] == "head" and out.same_grid(head) and out.dtype == head.dtype
    inside, in_lesion = brain.array != 0, lesion.array != 0
    assert np.array_equal(out.array[in_lesion], head.array[in_lesion])
    assert np.mean(out.array[inside & ~in_lesion] != head.array[inside & ~in_lesion]) > 0.5
    outside = ~inside
    if method == "none":
        assert np.array_equal(out.array[outside], head.array[outside])
    else:
        assert np.all(out.array[outside] == 0)


def test_remodel_face_gets_the_brain_and_lesion_as_brain_mask(models, monkeypatch):
    import AnonMRILib.pipelines.remodel as remodel

    head, lesion, brain = head_with_lesion()
    seen = {}

    def fake_remodel(volume, brain_mask=None, **kwargs):
        seen["mask"] = brain_mask.array.copy()
        return volume.with_array(np.where(brain_mask.array != 0, volume.array, 7).astype(volume.dtype))

    monkeypatch.setattr(remodel, "remodel_face", fake_remodel)
    lesion_array = lesion.array.copy()
    lesion_array[0, 0, 5] = 1  # one lesion voxel outside the brain mask: joins the preserved region
    lesion = lesion.with_array(lesion_array)
    out, details = anonymize_lesions_with_details(head, lesion, LesionAnonymizationConfig(**FAST, input_kind="head"),
                                                  weights=models, brain_mask=brain)
    assert np.array_equal(seen["mask"] != 0, (brain.array != 0) | (lesion_array != 0))
    assert details["lesion_voxels_outside_brain"] == 1 and out.array[0, 0, 5] == head.array[0, 0, 5]
    assert np.all(out.array[(seen["mask"] == 0)] == 7)


def test_edge_cases_lesion_outside_brain_empty_mask_other_grid_unknown_method(models):
    head, lesion, brain = head_with_lesion()
    config = LesionAnonymizationConfig(**FAST, face_method="black", input_kind="head")
    corner = np.zeros_like(lesion.array)
    corner[:3, :3, 5:8] = 1  # a lesion in the air: mask from another image
    outside = lesion.with_array(corner)
    with pytest.raises(InputError, match="outside the brain mask"):
        anonymize_lesions(head, outside, config, weights=models, brain_mask=brain)
    with pytest.raises(InputError, match="empty"):
        anonymize_lesions(head, lesion.with_array(np.zeros_like(lesion.array)), config, weights=models,
                          brain_mask=brain)
    shifted = brain.affine.copy()
    shifted[0, 3] += 3.0
    moved = Volume(brain.array, shifted)
    with pytest.raises(InputError, match="grid"):
        anonymize_lesions(head, lesion, config, weights=models, brain_mask=moved)
    with pytest.raises(InputError, match="face method"):
        anonymize_lesions(head, lesion, LesionAnonymizationConfig(**FAST, face_method="paint"), weights=models,
                          brain_mask=brain)
    union, outside_count = brain_region(np.array([False, True, True]), np.array([True, True, False]))  # half out
    assert union.all() and outside_count == 1
    with pytest.raises(InputError, match="100 %"):
        brain_region(np.array([False, False, True]), np.array([True, True, False]))


def test_appearance_matching_restores_scale_noise_and_sharpness():
    from scipy import ndimage

    from AnonMRILib.transforms.appearance import estimate_noise_sigma, match_sharpness

    rng = np.random.default_rng(0)
    clean = ndimage.gaussian_filter(rng.random((6, 64, 64)), (0, 2, 2)) * 4000 + 500
    reference = clean + rng.normal(0, 20, clean.shape)
    mask = np.zeros(clean.shape, bool)
    mask[:, 8:56, 8:56] = True
    assert estimate_noise_sigma(reference, mask) == pytest.approx(20, rel=0.2)
    smooth = ndimage.gaussian_filter(clean, (0, 3, 3)) * 0.001  # blurry and on another scale
    out, details = match_sharpness(smooth, reference, mask, mask, (1.5, 1.5), seed=1)
    assert details["sharpness_ratio_reached"] == pytest.approx(1.0, abs=0.02)
    assert np.median(out[mask]) == pytest.approx(np.median(reference[mask]), rel=0.05)
    assert np.array_equal(out[~mask], smooth[~mask])


def test_cli_whole_head_face_method_none_warns(tmp_path, capsys):
    from AnonMRILib.cli.main import main

    weights = tmp_path / "weights"
    weights.mkdir()
    save_tiny_weights(weights)
    head, lesion, brain = head_with_lesion()
    for name, volume in (("in.nii.gz", head), ("lesion.nii.gz", lesion), ("brain.nii.gz", brain)):
        save_volume(volume, tmp_path / name)
    common = ["--weights", str(weights), "--steps", "1", "--candidates", "2", "--quiet", "--device", "cpu",
              "--input-kind", "head", "--brain-mask", str(tmp_path / "brain.nii.gz"), "--exact-lesion",
              "--skip-plausibility-checks"]  # a small synthetic head
    base = ["lesion", str(tmp_path / "in.nii.gz"), str(tmp_path / "lesion.nii.gz")]
    with pytest.warns(UserWarning, match="identifiable"):
        assert main([*base, str(tmp_path / "out.nii.gz"), "--face-method", "none", *common]) == 0
    out = load_volume(tmp_path / "out.nii.gz")
    assert out.same_grid(head) and out.dtype == head.dtype
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses an unknown choice with status 2
        main([*base, str(tmp_path / "x.nii.gz"), "--face-method", "paint", *common])
    assert exit_info.value.code == 2
    assert not (tmp_path / "x.nii.gz").exists()
