"""Lesion VAEs, joint decoder, conditional latent diffusion: shapes, loss schedule, schedulers, weights."""
import pytest
import torch

from AnonMRILib.errors import WeightsError
from AnonMRILib.models.latent_diffusion import (ConditionalLatentUNet, LatentDiffusionConfig, NoiseSchedule,
                                                diffusion_loss, make_ddim_scheduler, make_ddpm_scheduler,
                                                sample_latents)
from AnonMRILib.models.lesion_vae import (LesionPreservingAutoencoder, LesionVAEConfig, alpha_v_schedule,
                                          kl_divergence)
from lesion_fixtures import TINY_SIZE, tiny_models


def test_paper_configuration_gives_32x30x30_latents_for_240_slices():
    model = LesionPreservingAutoencoder(LesionVAEConfig.paper()).eval()
    with torch.no_grad():
        moments = model.background_encoder.moments(torch.rand(1, 1, 240, 240))
        mean, log_variance = model.lesion_encoder(torch.rand(1, 1, 240, 240))
    assert tuple(moments.shape) == (1, 32, 30, 30)
    assert tuple(mean.shape) == tuple(log_variance.shape) == (1, 16, 30, 30)
    assert model.joint_decoder.from_latent.conv.in_channels == 32  # [z_lesion, z_background]


def test_joint_decoder_and_region_vaes_reconstruct_slice_shape():
    model = tiny_models().autoencoder
    x = torch.rand(2, 1, TINY_SIZE, TINY_SIZE)
    m = (torch.rand(2, 1, TINY_SIZE, TINY_SIZE) > 0.8).float()
    out = model(x, m, torch.Generator().manual_seed(0))
    for key in ("background_hat", "lesion_hat", "whole_hat"):
        assert out[key].shape == x.shape
    assert torch.equal(out["background"], x * (1 - m)) and torch.equal(out["lesion"], x * m)
    assert out["mean_background"].shape == (2, 4, TINY_SIZE // 8, TINY_SIZE // 8)


def test_group_normalisation_has_no_batch_statistics_and_trains():
    """``norm="group"`` (for batches too small for batch statistics): GroupNorm everywhere, no BatchNorm,
    the output of one slice independent of the batch it comes in, eval = train, and a step lowers the loss."""
    from AnonMRILib.models.lesion_vae import lesion_vae_loss

    with pytest.raises(Exception, match="norm"):
        LesionVAEConfig(image_size=TINY_SIZE, latent_channels=4, channels=(8, 8, 16), norm="layer")
    torch.manual_seed(0)
    model = LesionPreservingAutoencoder(LesionVAEConfig(image_size=TINY_SIZE, latent_channels=4, channels=(8, 8, 16),
                                                        norm="group"))
    kinds = {type(m).__name__ for m in model.modules()}
    assert "GroupNorm" in kinds and "BatchNorm2d" not in kinds
    x = torch.rand(4, 1, TINY_SIZE, TINY_SIZE)
    m = (torch.rand(4, 1, TINY_SIZE, TINY_SIZE) > 0.8).float()
    with torch.no_grad():
        alone = model.reconstruct(x[:1], m[:1])["whole_hat"]
        batched = model.train().reconstruct(x, m)["whole_hat"][:1]
    assert torch.allclose(alone, batched, atol=1e-5)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(6):
        optimiser.zero_grad()
        loss, _ = lesion_vae_loss(model(x, m, torch.Generator().manual_seed(0)), x, alpha_v=16.0, kl_weight=1e-3)
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]


def test_alpha_v_starts_at_16_halves_every_10_epochs_and_stops_at_1():
    values = [alpha_v_schedule(epoch) for epoch in range(60)]
    assert values[:10] == [16.0] * 10 and values[10:20] == [8.0] * 10
    assert values[20] == 4.0 and values[30] == 2.0 and values[40:] == [1.0] * 20
    assert alpha_v_schedule(3, halve_every=1) == 2.0
    with pytest.raises(ValueError):
        alpha_v_schedule(-1)


def test_vae_loss_is_alpha_times_reconstruction_plus_weighted_kl():
    model = tiny_models().autoencoder.train()
    x = torch.rand(3, 1, TINY_SIZE, TINY_SIZE)
    m = (torch.rand(3, 1, TINY_SIZE, TINY_SIZE) > 0.8).float()
    total, parts = model.loss(x, m, alpha_v=8.0, generator=torch.Generator().manual_seed(1))
    reconstruction = parts["mse_background"] + parts["mse_lesion"] + parts["mse_whole"]
    assert float(total.detach()) == pytest.approx(8.0 * reconstruction + model.config.kl_weight * parts["kl"], rel=1e-5)
    assert kl_divergence(torch.zeros(4), torch.zeros(4)).item() == 0.0
    assert kl_divergence(torch.ones(4), torch.zeros(4)).item() == pytest.approx(0.5)


def test_unet_handles_odd_latent_sizes_and_predicts_noise_shape():
    config = LatentDiffusionConfig(image_size=240, latent_channels=4, channels=(8, 16, 16), embedding_dim=16,
                                   mask_channels=8)
    unet = ConditionalLatentUNet(config).eval()
    with torch.no_grad():
        eps = unet(torch.randn(2, 4, 30, 30), torch.tensor([3, 999]), torch.tensor([0, 2]),
                   torch.zeros(2, 1, 240, 240), torch.tensor([0.1, 0.9]))
    assert eps.shape == (2, 4, 30, 30)


def test_diffusion_loss_and_ddim_sampling_shapes_and_seed_determinism():
    unet = tiny_models().diffusion
    scheduler = make_ddpm_scheduler(unet.config)
    z0 = torch.randn(4, 4, 4, 4)
    masks = torch.zeros(4, 1, TINY_SIZE, TINY_SIZE)
    loss = diffusion_loss(unet, scheduler, z0, torch.tensor([0, 1, 0, 1]), masks, torch.rand(4),
                          generator=torch.Generator().manual_seed(0))
    assert loss.ndim == 0 and torch.isfinite(loss)
    args = (unet, torch.tensor([0, 1]), masks[:2], torch.tensor([0.3, 0.6]))
    a = sample_latents(*args, steps=4, generator=torch.Generator().manual_seed(5))
    b = sample_latents(*args, steps=4, generator=torch.Generator().manual_seed(5))
    c = sample_latents(*args, steps=4, generator=torch.Generator().manual_seed(6))
    assert a.shape == (2, 4, 4, 4) and torch.equal(a, b) and not torch.allclose(a, c)
    with pytest.raises(ValueError):
        sample_latents(*args, steps=4, sampler="euler")


def test_noise_schedule_matches_monai_ddim_and_ddpm():
    config = LatentDiffusionConfig()
    schedule = NoiseSchedule(config)
    ddim = make_ddim_scheduler(config, 10)
    assert schedule.ddim_timesteps(10) == [int(t) for t in ddim.timesteps]
    z, eps = torch.randn(2, 16, 8, 8), torch.randn(2, 16, 8, 8)
    for t in schedule.ddim_timesteps(10):
        expected, _ = ddim.step(eps, t, z, eta=0.0)
        assert torch.allclose(schedule.ddim_step(eps, t, z, 10), expected, atol=1e-5)
    ddpm = make_ddpm_scheduler(config)
    assert torch.allclose(schedule.alphas_cumprod, ddpm.alphas_cumprod)
    for t in (999, 400, 1):
        expected, _ = ddpm.step(eps, t, z, generator=torch.Generator().manual_seed(2))
        assert torch.allclose(schedule.ddpm_step(eps, t, z, torch.Generator().manual_seed(2)), expected, atol=1e-4)


def test_weights_round_trip_and_wrong_kind_is_refused(tmp_path):
    from AnonMRILib.models.lesion_weights import load_lesion_diffusion, load_lesion_vae, resolve_weights, save_model

    models = tiny_models()
    save_model(tmp_path / "lesion_vae.safetensors", models.autoencoder, "lesion_vae")
    save_model(tmp_path / "lesion_diffusion.safetensors", models.diffusion, "lesion_diffusion",
               {"latent_scale": 2.5, "latent_shift": -0.5})
    vae = load_lesion_vae(tmp_path / "lesion_vae.safetensors")
    unet, scale, shift = load_lesion_diffusion(tmp_path / "lesion_diffusion.safetensors")
    assert (scale, shift) == (2.5, -0.5)
    for name, tensor in models.autoencoder.state_dict().items():
        assert torch.equal(vae.state_dict()[name], tensor)
    assert unet.config == models.diffusion.config
    with pytest.raises(WeightsError, match="expected 'lesion_vae'"):
        load_lesion_vae(tmp_path / "lesion_diffusion.safetensors")
    (tmp_path / "broken.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(WeightsError):
        load_lesion_vae(tmp_path / "broken.safetensors")
    with pytest.raises(WeightsError, match="does not exist"):
        resolve_weights(tmp_path / "nowhere")
