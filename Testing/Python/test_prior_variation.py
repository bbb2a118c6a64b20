"""The donor prior's learned variation: prior-conditioned latent diffusion (low-passed prior latent as a
condition, SDEdit strength), depth-correlated noise, and what the variation may touch."""
import numpy as np
import pytest
import torch

from AnonMRILib.errors import InputError, WeightsError
from AnonMRILib.models.latent_diffusion import (ConditionalLatentUNet, LatentDiffusionConfig, NoiseSchedule,
                                                prior_condition, sample_latents, smooth_latent)
from AnonMRILib.pipelines.prior_variation import PriorVariationConfig, depth_correlated_noise, vary_prior

from lesion_fixtures import tiny_models


def test_depth_correlated_noise_is_ar1_along_the_slice_positions():
    generator = torch.Generator().manual_seed(0)
    positions = np.array([4.0, 0.0, 2.0, 6.0])  # not sorted: the order is the positions'
    noise = depth_correlated_noise(positions, (4, 40, 40), 4.0, generator)
    flat = noise.reshape(4, -1).numpy()
    correlation = np.corrcoef(flat)
    assert abs(correlation[1, 2] - np.exp(-0.5)) < 0.05  # 0 mm and 2 mm: neighbours
    assert abs(correlation[1, 3] - np.exp(-1.5)) < 0.06  # 0 mm and 6 mm: three steps of 2 mm
    assert abs(flat.std() - 1.0) < 0.05
    independent = depth_correlated_noise(positions, (4, 40, 40), 0.0, torch.Generator().manual_seed(0))
    assert abs(np.corrcoef(independent.reshape(4, -1).numpy())[1, 2]) < 0.05


def test_prior_condition_is_a_low_pass_and_the_model_needs_it():
    z = torch.randn(2, 4, 30, 30, generator=torch.Generator().manual_seed(1))
    config = LatentDiffusionConfig(image_size=240, latent_channels=4, channels=(8, 16, 16), embedding_dim=16,
                                   mask_channels=8, prior_channels=4, prior_smoothing_px=1.0)
    smooth = prior_condition(z, config)
    assert torch.allclose(smooth_latent(torch.full((1, 2, 9, 9), 3.0), 1.5), torch.full((1, 2, 9, 9), 3.0), atol=1e-5)
    assert float(smooth.std()) < 0.5 * float(z.std())  # white noise loses most of its variance
    assert torch.equal(smooth_latent(z, 0.0), z)
    model = ConditionalLatentUNet(config).eval()
    args = (torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.zeros(2, 1, 240, 240),
            torch.rand(2))
    with pytest.raises(ValueError, match="prior_latent"):
        model(z, *args)
    assert model(z, *args, prior_latent=z).shape == z.shape
    plain = ConditionalLatentUNet(LatentDiffusionConfig(image_size=240, latent_channels=4, channels=(8, 16, 16),
                                                        embedding_dim=16, mask_channels=8)).eval()
    with pytest.raises(ValueError, match="no prior"):
        plain(z, *args, prior_latent=z)


def test_strength_sets_how_far_the_draw_moves_from_the_prior():
    schedule = NoiseSchedule(LatentDiffusionConfig())
    steps = schedule.partial_timesteps(0.5, 10)
    assert steps[0] == 500 and steps[-1] == 0 and len(steps) == 10 and steps == sorted(steps, reverse=True)
    assert schedule.partial_timesteps(0.002, 10) == [2, 1, 0]
    models = tiny_models(prior=True)
    start = torch.randn(3, 4, 4, 4, generator=torch.Generator().manual_seed(2))
    args = dict(class_labels=torch.zeros(3, dtype=torch.long), lesion_mask=torch.zeros(3, 1, 32, 32),
                depths=torch.rand(3), steps=5, prior_latent=start, start_latent=start)
    noise = torch.randn(3, 4, 4, 4, generator=torch.Generator().manual_seed(3))
    moved = [float((sample_latents(models.diffusion, strength=s, initial_noise=noise, **args) - start).abs().mean())
             for s in (0.003, 0.3, 1.0)]
    assert moved[0] < 0.1 < moved[2] and moved[0] < moved[1] < moved[2]
    again = sample_latents(models.diffusion, strength=0.3, initial_noise=noise, **args)
    assert torch.equal(again, sample_latents(models.diffusion, strength=0.3, initial_noise=noise, **args))
    with pytest.raises(ValueError, match="strength"):
        sample_latents(models.diffusion, strength=0.0, initial_noise=noise, **args)


def _canonical_case():
    rng = np.random.default_rng(0)
    shape = (40, 44, 10)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    region = (grid[0] ** 2 + grid[1] ** 2 + 0.5 * grid[2] ** 2) < 0.7
    lesion = ((grid[0] - 0.3) ** 2 + grid[1] ** 2 + grid[2] ** 2) < 0.05
    canonical = np.where(region, 60.0 + 40.0 * rng.random(shape), 30.0).astype(np.float32)
    return canonical, lesion & region, region


def test_vary_prior_changes_only_the_non_lesion_region_and_follows_the_seed():
    canonical, lesion, region = _canonical_case()
    models = tiny_models(prior=True)
    spacing = np.array([6.0, 6.0, 5.0])
    config = PriorVariationConfig(strength=0.6, steps=3)
    varied = vary_prior(canonical, lesion, region, spacing, models, config, seed=1)
    assert varied.shape == canonical.shape and varied.dtype == np.float32
    assert np.array_equal(varied[~region | lesion], canonical[~region | lesion])
    assert (varied != canonical)[region & ~lesion].mean() > 0.9
    assert np.array_equal(varied, vary_prior(canonical, lesion, region, spacing, models, config, seed=1))
    assert not np.array_equal(varied, vary_prior(canonical, lesion, region, spacing, models, config, seed=2))
    assert np.array_equal(vary_prior(canonical, lesion, region, spacing, models, PriorVariationConfig(strength=0.0)),
                          canonical)
    with pytest.raises(WeightsError, match="prior"):
        vary_prior(canonical, lesion, region, spacing, tiny_models(prior=False), config)
    with pytest.raises(InputError, match="strength"):
        PriorVariationConfig(strength=1.5)


def test_only_the_learned_change_is_added_so_the_vae_round_trip_does_not_blur_the_prior(monkeypatch):
    """T_b + D_b(z_s) - D_b(z_p): a draw that stays at the prior's latent gives the prior back to float
    precision, pixel-scale texture included (decoding z_s alone would give the VAE's round trip of it)."""
    import AnonMRILib.models.latent_diffusion as latent_diffusion

    canonical, lesion, region = _canonical_case()
    models = tiny_models(prior=True)
    spacing = np.array([1.0, 1.0, 5.0])
    monkeypatch.setattr(latent_diffusion, "sample_latents", lambda *args, **kwargs: kwargs["start_latent"])
    kept = vary_prior(canonical, lesion, region, spacing, models, PriorVariationConfig(strength=0.6, steps=3), seed=1)
    assert np.abs(kept - canonical).max() < 1e-3 * np.abs(canonical).max()
    monkeypatch.setattr(latent_diffusion, "sample_latents", lambda *args, **kwargs: kwargs["start_latent"] + 1.0)
    moved = vary_prior(canonical, lesion, region, spacing, models, PriorVariationConfig(strength=0.6, steps=3), seed=1)
    change = (moved - canonical)[region & ~lesion]
    assert np.abs(change).mean() > 0.1  # a different latent does change the brain
    texture = canonical - np.mean(canonical[region])
    inside = region & ~lesion
    assert np.corrcoef(moved[inside], texture[inside])[0, 1] > 0.5  # on top of the prior's own texture
