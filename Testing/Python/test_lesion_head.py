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

FAST = dict(steps=1, exact_lesion=True, prior="none")  # the paper generator; donor prior: test_brain_prior.py


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
    # a dark image with thin bright vessels: noise and the unsharp mask's undershoot beside them would
    # draw values below the input's darkest (0 here); the output stays a magnitude image
    dark = np.clip(rng.normal(30, 20, clean.shape), 0, None)
    dark[:, ::8, :] = 3000.0
    blurred = ndimage.gaussian_filter(dark, (0, 2, 2))
    out, _ = match_sharpness(blurred, dark, mask, mask, (1.5, 1.5), match_intensity=False, seed=1)
    assert out[mask].min() >= dark[mask].min() == 0.0
    assert (out[mask] == 0.0).sum() > 100  # where noise and undershoot went below it


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
              "--skip-plausibility-checks", "--variation", "0"]  # a small synthetic head; tiny models have no prior channels
    base = ["lesion", str(tmp_path / "in.nii.gz"), str(tmp_path / "lesion.nii.gz")]
    with pytest.warns(UserWarning, match="identifiable"):
        assert main([*base, str(tmp_path / "out.nii.gz"), "--face-method", "none", *common]) == 0
    out = load_volume(tmp_path / "out.nii.gz")
    assert out.same_grid(head) and out.dtype == head.dtype
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses an unknown choice with status 2
        main([*base, str(tmp_path / "x.nii.gz"), "--face-method", "paint", *common])
    assert exit_info.value.code == 2
    assert not (tmp_path / "x.nii.gz").exists()


def test_fill_brain_mask_extends_generated_tissue_over_the_whole_mask_and_keeps_the_rest():
    from AnonMRILib.pipelines.lesion_head import fill_brain_mask

    size = 32
    rows, cols = np.mgrid[:size, :size]
    generated = np.zeros((3, size, size), np.float32)
    disc = (rows - 16) ** 2 + (cols - 16) ** 2 < 36  # the model drew a small brain ...
    generated[0][disc] = 0.5 + 0.01 * cols[disc]
    generated[2][disc] = 0.4
    brain = np.zeros_like(generated, bool)
    brain[:, 4:28, 4:28] = True  # ... inside a much larger brain mask
    lesion = np.zeros_like(brain)
    lesion[0, 5:8, 5:8] = True  # a lesion pixel the model left dark stays as generated
    generated[1, 10:12, 10:12] = 0.9  # slice 1: no covered pixel after the 1-px edge: left as it is
    filled, fraction = fill_brain_mask(generated, brain, lesion, foreground=0.05, edge_px=1)
    inner = np.zeros_like(disc)
    inner[1:-1, 1:-1] = disc[1:-1, 1:-1] & disc[:-2, 1:-1] & disc[2:, 1:-1] & disc[1:-1, :-2] & disc[1:-1, 2:]
    for k in (0, 2):
        assert np.all(filled[k][brain[k] & ~lesion[k]] > 0.3)  # tissue everywhere in the mask
        assert np.array_equal(filled[k][inner], generated[k][inner])  # covered interior untouched
        assert np.array_equal(filled[k][~brain[k]], generated[k][~brain[k]])  # outside the mask untouched
    assert np.allclose(filled[2][brain[2]], 0.4)  # a flat brain extends flat
    assert np.array_equal(filled[0][lesion[0]], generated[0][lesion[0]])
    assert np.array_equal(filled[1], generated[1])
    covered = np.stack([inner, np.zeros_like(inner), inner])  # slice 1 has no covered pixel: not filled
    todo = brain & ~covered & ~lesion & (np.arange(3) != 1)[:, None, None]
    assert fraction == pytest.approx(todo.sum() / brain.sum())
    same, none = fill_brain_mask(generated, np.zeros_like(brain), lesion, foreground=0.05)
    assert none == 0.0 and np.array_equal(same, generated)


def test_whole_head_brain_mask_is_filled_with_tissue_not_background():
    from lesion_fixtures import tiny_models as tiny

    models = tiny(1)  # its decoder draws tissue (seed 0's output is clamped to 0 almost everywhere)
    head, lesion, brain = head_with_lesion()
    inside = (brain.array != 0) & (lesion.array == 0)
    darkest = {}
    for fill in (False, True):
        config = LesionAnonymizationConfig(**FAST, face_method="black", input_kind="head", match_appearance=False,
                                           fill_brain_mask=fill)
        out, details = anonymize_lesions_with_details(head, lesion, config, weights=models, seed=0, brain_mask=brain)
        assert ("brain_mask_filled_fraction" in details) == fill
        darkest[fill] = float(np.mean(out.array[inside] <= head.array[brain.array != 0].min()))
    assert darkest[True] < darkest[False]


def test_parallel_face_treatment_gives_the_same_output_and_passes_errors_on(models, monkeypatch):
    from AnonMRILib.pipelines.lesion import BackgroundJob

    head, lesion, brain = head_with_lesion()
    outputs = []
    for parallel in (True, False):
        config = LesionAnonymizationConfig(**FAST, face_method="quickshear", input_kind="head", parallel_face=parallel)
        out, details = anonymize_lesions_with_details(head, lesion, config, weights=models, seed=3, brain_mask=brain)
        assert details.get("face_in_parallel", False) == parallel and "face" in details["timings_s"]
        outputs.append(out.array)
    assert np.array_equal(outputs[0], outputs[1])

    def broken(*args, **kwargs):
        raise InputError("face failed")

    import AnonMRILib.pipelines.lesion_head as lesion_head

    monkeypatch.setattr(lesion_head, "face_treatment", broken)
    with pytest.raises(InputError, match="face failed"):
        anonymize_lesions(head, lesion, LesionAnonymizationConfig(**FAST, face_method="black", input_kind="head"),
                          weights=models, brain_mask=brain)
    job = BackgroundJob(lambda a, b=1: a + b, 2, b=3)
    assert job.result() == 5 and job.seconds >= 0.0


def test_sharpness_bisection_shortcut_equals_rendering_the_stack():
    from scipy import ndimage

    from AnonMRILib.transforms.appearance import _sharpness_of_amount, mean_gradient

    rng = np.random.default_rng(3)
    base = ndimage.gaussian_filter(rng.random((4, 40, 40)), (0, 2, 2))
    detail = base - ndimage.gaussian_filter(base, (0, 1.5, 1.5))
    mask = np.zeros(base.shape, bool)
    mask[:, 6:34, 8:30] = True
    structure = np.zeros((3, 3, 3), bool)
    structure[1] = True
    inner = ndimage.binary_erosion(mask, structure=structure, iterations=1)
    outside_values = rng.random(base.shape) * 5  # what lies outside the mask must not matter
    sharpness = _sharpness_of_amount(base, detail, inner)
    for amount in (0.0, 0.7, 3.9):
        rendered = np.where(mask, base + amount * detail, outside_values)
        assert sharpness(amount) == pytest.approx(mean_gradient(rendered, inner), rel=1e-12)
    assert _sharpness_of_amount(base, detail, np.zeros_like(mask))(1.0) == 0.0


@pytest.mark.parametrize("method", ["remodel", "reface"])
def test_face_prior_gets_the_inputs_slice_thickness(models, monkeypatch, method):
    """The slice thickness given to the lesion method (--slice-thickness or the sidecar) reaches the
    anatomical prior of the face treatment too: both priors average one slab."""
    import AnonMRILib.pipelines.baselines as baselines
    import AnonMRILib.pipelines.remodel as remodel
    from AnonMRILib.transforms.brain_prior import BrainPriorConfig

    head, lesion, brain = head_with_lesion()
    seen = {}

    def fake_remodel(volume, brain_mask=None, prior_config=None, **kwargs):
        seen["config"] = prior_config
        return volume

    def fake_deface(volume, method, brain_mask=None, config=None, **kwargs):
        seen["config"] = config
        return volume

    monkeypatch.setattr(remodel, "remodel_face", fake_remodel)
    monkeypatch.setattr(baselines, "deface", fake_deface)
    config = LesionAnonymizationConfig(**FAST, input_kind="head", face_method=method,
                                       brain_prior=BrainPriorConfig(slice_thickness_mm=4.0))
    anonymize_lesions(head, lesion, config, weights=models, brain_mask=brain)
    assert seen["config"].slice_thickness_mm == 4.0
    anonymize_lesions(head, lesion, LesionAnonymizationConfig(**FAST, input_kind="head", face_method=method),
                      weights=models, brain_mask=brain)
    assert seen["config"] is None


def test_donor_prior_whole_head_runs_the_face_beside_the_generation_with_the_slice_thickness(monkeypatch):
    """The donor-prior path (the default) treats a whole head's face in the background job too, says
    so in its details, and gives the face prior the slab of the brain prior."""
    import AnonMRILib.pipelines.lesion_head as lesion_head
    from AnonMRILib.pipelines.prior_variation import PriorVariationConfig
    from AnonMRILib.transforms.brain_prior import BrainPriorConfig

    head, lesion, brain = head_with_lesion()
    seen = {}
    treat = lesion_head.face_treatment

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return treat(*args, **kwargs)

    monkeypatch.setattr(lesion_head, "face_treatment", spy)
    config = LesionAnonymizationConfig(exact_lesion=True, input_kind="head", face_method="quickshear",
                                       variation=PriorVariationConfig(strength=0.0),
                                       brain_prior=BrainPriorConfig(donors=("robex_atlas",), slice_thickness_mm=4.0))
    out, details = anonymize_lesions_with_details(head, lesion, config, brain_mask=brain)
    assert details["face_in_parallel"] is True and seen["slice_thickness_mm"] == 4.0
    assert np.array_equal(out.array[lesion.array != 0], head.array[lesion.array != 0])


def test_whole_head_benchmark_runs_the_donor_prior_and_the_paper_generator(tmp_path):
    """``Testing/Benchmarks/evaluate_lesion_head.py`` gives each run the models of its prior (the
    shipped donor-prior models by default, the paper's for ``prior=none``): it had kept loading only
    the paper's, so the documented command failed once the donor prior became the default."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "Benchmarks" / "evaluate_lesion_head.py"
    spec = importlib.util.spec_from_file_location("evaluate_lesion_head", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    head, lesion, brain = head_with_lesion(voxel_mm=(4.0, 4.0, 5.0))
    for name, volume in (("head", head), ("lesion", lesion), ("brain", brain)):
        save_volume(volume, tmp_path / f"{name}.nii.gz")
    out = tmp_path / "results.json"
    assert script.main([str(tmp_path / "head.nii.gz"), str(tmp_path / "lesion.nii.gz"), "--face-methods", "none",
                        "--brain-mask", str(tmp_path / "brain.nii.gz"), "--threads", "2",
                        "--variants", "none, paper generator:face_method=none,prior=none", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert runs["none"]["prior"] == "donor" and runs["none"]["donor"]  # placed on a donor of the bank
    assert "donor" not in runs["none, paper generator"] and "brain_mask_filled_fraction" in runs["none, paper generator"]
    assert all(run["lesion_bit_exact"] for run in runs.values())
    assert json.loads(out.read_text())["brain_mask"]["source"] == "brain.nii.gz"  # a file name, not a path
