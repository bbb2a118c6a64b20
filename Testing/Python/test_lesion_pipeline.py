"""anonymize_lesions: invariants (lesion latent, exact lesion voxels), geometry, determinism, CLI."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError, InvariantError
from AnonMRILib.io import Volume, load_volume, save_volume
from AnonMRILib.pipelines.lesion import (LesionAnonymizationConfig, anonymize_lesion_slices, anonymize_lesions,
                                         SourceRepulsionConfig, axial_layout, background_dissimilarity, feather_weights,
                                         from_ras_layout, repelled_choice, slices_from_model, slices_to_model,
                                         to_ras_layout, typical_draws)
from lesion_fixtures import TINY_SIZE, brain_with_lesion, save_tiny_weights, tiny_models

FAST = LesionAnonymizationConfig(steps=2, prior="none")  # the paper generator (the donor prior: test_brain_prior.py)


@pytest.fixture(scope="module")
def models():
    return tiny_models()


def test_lesion_latent_is_the_encoders_and_output_in_range(models):
    import torch

    rng = np.random.default_rng(0)
    images = rng.random((3, TINY_SIZE, TINY_SIZE)).astype(np.float32)
    masks = np.zeros((3, TINY_SIZE, TINY_SIZE), np.uint8)
    masks[:2, 10:16, 12:20] = 1
    out, latents = anonymize_lesion_slices(models, images, masks, np.array([0, 1, 2]), np.array([0.2, 0.5, 0.8]),
                                           steps=2, seed=3, return_latents=True)
    with torch.no_grad():
        expected, _ = models.autoencoder.lesion_encoder(torch.from_numpy(images * masks)[:, None])
    assert np.array_equal(latents, expected.numpy())
    assert out.shape == images.shape and out.min() >= 0 and out.max() <= 1


def test_background_dissimilarity_ignores_brightness_and_the_lesion():
    import torch

    source = torch.rand(3, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(3, 1, 6, 6)
    mask[:, :, :2] = 1.0  # top third is lesion
    candidate = 0.5 * source + 0.1  # darker, lower-contrast copy: not dissimilar
    candidate[1, :, :2] = torch.rand(1, 2, 6, generator=torch.Generator().manual_seed(1))  # differs inside the lesion only
    candidate[2] = 1.0 - source[2]  # inverted outside the lesion: maximally dissimilar
    assert background_dissimilarity(candidate, source, mask).tolist() == pytest.approx([0.0, 0.0, 2.0], abs=1e-5)


def _draws(specs):
    """(K, 1, 1, 8, 8) draws from (foreground pixels, intensity) pairs; the source is all zero."""
    import torch

    draws = torch.zeros(len(specs), 1, 1, 8, 8)
    for index, (pixels, value) in enumerate(specs):
        draws[index, 0, 0].view(-1)[:pixels] = value
    return draws


def test_typical_draws_reject_shrunken_and_darkened_draws():
    config = SourceRepulsionConfig(candidates=5, area_tolerance=0.15, brightness_tolerance=0.10)
    draws = _draws([(40, 0.5), (42, 0.52), (20, 0.5), (40, 0.2), (38, 0.48)])
    assert typical_draws(draws, config)[:, 0].tolist() == [True, True, False, False, True]


def test_repelled_choice_is_the_typical_draw_farthest_from_the_source():
    import torch

    config = SourceRepulsionConfig(candidates=5)
    source, lesion = torch.zeros(1, 1, 8, 8), torch.zeros(1, 1, 8, 8)
    source[0, 0].view(-1)[:30] = 1.0  # the source's "brain" is the first 30 pixels
    # draw 3 is the most dissimilar but atypical (larger, brighter), draw 2 is shrunken (and identical
    # to the source); of the typical draws 0, 1 and 4, draw 1 reaches farthest beyond the source's brain
    draws = _draws([(40, 0.5), (42, 0.5), (30, 0.5), (60, 0.9), (38, 0.5)])
    assert repelled_choice(draws, source, lesion, config).tolist() == [1]
    lesion[0, 0].view(-1)[38:42] = 1.0  # the pixels where draws 0 and 1 differ from draw 4 are lesion: a tie
    assert repelled_choice(draws, source, lesion, config).tolist() == [0]
    no_typical = SourceRepulsionConfig(candidates=5, area_tolerance=0.0, brightness_tolerance=0.0)
    spread = _draws([(10, 0.5), (20, 0.6), (30, 0.7), (40, 0.8), (50, 0.9)])
    assert typical_draws(spread, no_typical)[:, 0].tolist() == [False, False, True, False, False]
    mismatched = _draws([(10, 0.5), (20, 0.9), (40, 0.6), (50, 0.8)])  # median area and brightness: different draws
    assert not typical_draws(mismatched, no_typical).any()
    assert repelled_choice(mismatched, source, torch.zeros_like(lesion), no_typical).tolist() == [0]


def test_source_repulsion_end_to_end(models):
    """The first of K draws is plain sampling's: with every draw typical the kept one is at least as
    dissimilar to the source (more on some slice); with none typical it is plain sampling's."""
    import torch

    rng = np.random.default_rng(1)
    images = rng.random((6, TINY_SIZE, TINY_SIZE)).astype(np.float32)
    masks = np.zeros_like(images, np.uint8)
    masks[:, 8:14, 8:14] = 1
    grades, depths = np.zeros(6, int), np.linspace(0.2, 0.8, 6)

    def run(**repulsion):
        return anonymize_lesion_slices(models, images, masks, grades, depths, steps=2, seed=7,
                                       repulsion=SourceRepulsionConfig(**repulsion))

    def distance(out):
        as_tensor = lambda a: torch.from_numpy(np.asarray(a, np.float32))[:, None]  # noqa: E731
        return background_dissimilarity(as_tensor(out), as_tensor(images), as_tensor(masks)).numpy()

    plain = run(candidates=1)
    all_typical = dict(candidates=4, foreground=2.0)  # no foreground anywhere: every draw is typical
    repelled = run(**all_typical)
    assert np.array_equal(repelled, run(**all_typical))
    assert np.all(distance(repelled) >= distance(plain)) and np.any(distance(repelled) > distance(plain))
    assert np.array_equal(plain, run(candidates=4, foreground=-1.0, area_tolerance=-1.0))  # none typical
    with pytest.raises(InputError, match="candidates"):
        run(candidates=0)
    volume, lesion = brain_with_lesion()
    with pytest.raises(InputError, match="candidates"):
        anonymize_lesions(volume, lesion, LesionAnonymizationConfig(steps=1, repulsion=SourceRepulsionConfig(0), prior="none"),
                          weights=models)


def test_modified_lesion_latent_is_detected(models, monkeypatch):
    import torch

    def tampering_decode(z_lesion, z_background):
        z_lesion.add_(1.0)  # a bug that edits the lesion latent in place
        return models.autoencoder.joint_decoder(torch.cat([z_lesion, z_background], 1))

    monkeypatch.setattr(models.autoencoder, "decode_joint", tampering_decode)
    images = np.random.default_rng(0).random((1, TINY_SIZE, TINY_SIZE)).astype(np.float32)
    with pytest.raises(InvariantError, match="lesion latent"):
        anonymize_lesion_slices(models, images, np.ones_like(images, np.uint8), np.array([0]), np.array([0.5]), steps=1)


@pytest.mark.parametrize("dtype", [np.int16, np.float32])
def test_exact_lesion_is_bit_exact_and_grid_dtype_kept(models, dtype):
    volume, lesion = brain_with_lesion(dtype=dtype)
    config = LesionAnonymizationConfig(steps=2, exact_lesion=True, prior="none")
    out = anonymize_lesions(volume, lesion, config, weights=models, seed=1)
    inside = lesion.array != 0
    assert out.dtype == volume.dtype and out.same_grid(volume)
    assert np.array_equal(out.array[inside], volume.array[inside])
    assert np.array_equal(out.array[:, :, 0], volume.array[:, :, 0])  # empty slice copied
    brain_outside = (volume.array > 0) & ~inside
    assert np.mean(out.array[brain_outside] != volume.array[brain_outside]) > 0.5


def test_same_seed_same_output_other_seed_differs(models):
    volume, lesion = brain_with_lesion()
    a = anonymize_lesions(volume, lesion, FAST, weights=models, seed=4).array
    b = anonymize_lesions(volume, lesion, FAST, weights=models, seed=4).array
    c = anonymize_lesions(volume, lesion, FAST, weights=models, seed=5).array
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_empty_mask_refused_unless_allowed_and_grid_mismatch_refused(models):
    volume, lesion = brain_with_lesion()
    empty = lesion.with_array(np.zeros_like(lesion.array))
    with pytest.raises(InputError, match="empty"):
        anonymize_lesions(volume, empty, FAST, weights=models)
    out = anonymize_lesions(volume, empty, LesionAnonymizationConfig(steps=2, allow_empty_lesion=True, prior="none"), weights=models)
    assert out.shape == volume.shape
    shifted_affine = lesion.affine.copy()
    shifted_affine[0, 3] += 5.0
    shifted = Volume(lesion.array, shifted_affine)
    with pytest.raises(InputError, match="grid"):
        anonymize_lesions(volume, shifted, FAST, weights=models)
    with pytest.raises(InputError, match="grade"):
        anonymize_lesions(volume, lesion, LesionAnonymizationConfig(steps=2, grade="GBM", prior="none"), weights=models)


def test_axial_layout_orders_axes_to_ras_and_round_trips():
    affine = np.zeros((4, 4))
    affine[0, 2], affine[1, 0], affine[2, 1], affine[3, 3] = -2.0, 1.0, -3.0, 1.0  # k->L, i->A, j->I
    order, flips = axial_layout(affine)
    assert order == (2, 0, 1) and flips == (True, False, True)
    array = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    assert np.array_equal(from_ras_layout(to_ras_layout(array, order, flips), order, flips), array)


def test_model_grid_resampling_round_trip_on_smooth_image():
    rows, cols = np.meshgrid(np.linspace(0, 1, 48), np.linspace(0, 1, 48), indexing="ij")
    image = (np.sin(3 * rows) * np.cos(2 * cols))[None].astype(np.float32)
    center = (23.5, 23.5)
    model = slices_to_model(image, (5.0, 5.0), center, 64)  # 240 mm FOV of 5 mm pixels -> 3.75 mm
    back = slices_from_model(model, (5.0, 5.0), center, (48, 48))
    assert np.abs(back - image)[0, 4:-4, 4:-4].max() < 0.05


def test_feather_band_lies_outside_the_lesion_only():
    lesion = np.zeros((1, 11, 11), bool)
    lesion[0, 5, 5] = True
    weights = feather_weights(lesion, 2)
    assert weights[0, 5, 5] == 1.0
    assert weights[0, 5, 6] == pytest.approx(2 / 3) and weights[0, 5, 7] == pytest.approx(1 / 3)
    assert weights[0, 5, 8] == 0.0 and weights[0, 0, 0] == 0.0


def test_cli_end_to_end_and_bad_inputs_exit_2(tmp_path, capsys):
    from AnonMRILib.cli.main import main

    weights = tmp_path / "weights"
    weights.mkdir()
    save_tiny_weights(weights)
    volume, lesion = brain_with_lesion()
    save_volume(volume, tmp_path / "in.nii.gz")
    save_volume(lesion, tmp_path / "lesion.nrrd")
    args = [str(tmp_path / "in.nii.gz"), str(tmp_path / "lesion.nrrd")]
    common = ["--weights", str(weights), "--steps", "2", "--quiet", "--device", "cpu", "--threads", "1", "--prior", "none"]
    assert main(["lesion", *args, str(tmp_path / "out.nii.gz"), "--exact-lesion", "--seed", "3", *common]) == 0
    out = load_volume(tmp_path / "out.nii.gz")
    inside = lesion.array != 0
    assert out.dtype == volume.dtype and np.array_equal(out.array[inside], volume.array[inside])
    assert not np.array_equal(out.array, volume.array)
    assert main(["lesion", *args, str(tmp_path / "again.nii.gz"), "--exact-lesion", "--seed", "3", *common]) == 0
    assert np.array_equal(load_volume(tmp_path / "again.nii.gz").array, out.array)
    # --candidates 1 is plain sampling: a different kept draw than source repulsion's default draws
    assert main(["lesion", *args, str(tmp_path / "plain.nii.gz"), "--exact-lesion", "--seed", "3",
                 "--candidates", "1", *common]) == 0
    assert not np.array_equal(load_volume(tmp_path / "plain.nii.gz").array, out.array)

    save_volume(lesion.with_array(np.zeros_like(lesion.array)), tmp_path / "empty.nii.gz")
    bad_cases = [
        [str(tmp_path / "in.nii.gz"), str(tmp_path / "empty.nii.gz"), str(tmp_path / "x1.nii.gz"), *common],
        [*args, str(tmp_path / "x2.nii.gz"), "--weights", str(tmp_path / "missing"), "--quiet"],
        [*args, str(tmp_path / "x3.nii.gz"), *common[:2], "--steps", "0", "--quiet"],
        [*args, str(tmp_path / "in.nii.gz"), *common],
        [*args, str(tmp_path / "x6.nii.gz"), "--candidates", "0", *common],
        [str(tmp_path / "nothing.nii.gz"), args[1], str(tmp_path / "x4.nii.gz"), *common],
    ]
    for bad in bad_cases:
        capsys.readouterr()
        assert main(["lesion", *bad]) == 2, bad
        assert "error" in capsys.readouterr().err
    assert not any((tmp_path / f"x{i}.nii.gz").exists() for i in (1, 2, 3, 4, 6))
    assert main(["lesion", str(tmp_path / "in.nii.gz"), str(tmp_path / "empty.nii.gz"), str(tmp_path / "x5.nii.gz"),
                 "--allow-empty-lesion", *common]) == 0


def test_shipped_models_decode_in_channels_last_memory_with_the_same_numbers():
    import copy

    import torch

    from AnonMRILib.pipelines.lesion import load_lesion_models

    models = load_lesion_models(None, device="cpu")
    decoder = models.autoencoder.joint_decoder
    assert decoder.to_image.weight.is_contiguous(memory_format=torch.channels_last)
    plain = copy.deepcopy(decoder).to(memory_format=torch.contiguous_format)
    z = torch.randn(4, decoder.from_latent.conv.in_channels, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(decoder(z), plain(z), atol=1e-5)
