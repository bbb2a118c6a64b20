"""CP-GAN model: block counts, shapes per scale, loss form, brain preservation, optimisation, weights I/O."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from AnonMRILib.errors import WeightsError  # noqa: E402
from AnonMRILib.models.cpgan import (CPGANConfig, CPGANDiscriminator, CPGANGenerator,  # noqa: E402
                                     compose_preserving, compose_pyramid, discriminator_loss, generator_loss,
                                     face_region, image_pyramid, mask_to_hull, model_grid_coordinates,
                                     remodel_region_l1)
from AnonMRILib.models.cpgan_weights import load_generator, save_generator  # noqa: E402
from AnonMRILib.transforms.pooling import privacy_pyramid  # noqa: E402

TINY = dict(size=16, finest_channels=4, coarsest_channels=8)


def synthetic_gamma(batch: int, size: int, seed: int = 0) -> torch.Tensor:
    """A ball-shaped hull with a smaller brain ball inside and brain intensities on it."""
    rng = np.random.default_rng(seed)
    grid = np.indices((size,) * 3).astype(np.float32) - (size - 1) / 2.0
    radius = np.sqrt((grid ** 2).sum(0))
    gammas = []
    for _ in range(batch):
        hull = (radius < size * 0.42).astype(np.float32)
        brain = (np.sqrt(((grid - np.array([0, -size * 0.08, size * 0.1])[:, None, None, None]) ** 2).sum(0))
                 < size * 0.25).astype(np.float32)
        intensity = brain * (0.5 + 0.2 * rng.random((size,) * 3).astype(np.float32))
        gammas.append(np.stack([hull, brain, intensity]))
    return torch.from_numpy(np.stack(gammas))


@pytest.mark.parametrize("size,blocks", [(16, 3), (32, 4), (64, 5), (128, 6)])
def test_number_of_blocks_is_log2_of_size_over_4_plus_1(size, blocks):
    config = CPGANConfig(size=size)
    assert config.num_blocks == blocks
    assert config.scales == [4 * 2 ** k for k in range(blocks)]
    assert len(CPGANGenerator(config).blocks) == blocks
    assert len(CPGANDiscriminator(config).blocks) == blocks


def test_config_validation_and_round_trip():
    config = CPGANConfig(size=32, expansion=3)
    again = CPGANConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    with pytest.raises(ValueError):
        CPGANConfig(size=48)
    with pytest.raises(ValueError):
        CPGANConfig(size=32, generator_channels=(8, 8))
    with pytest.raises(ValueError):
        CPGANConfig.from_dict({"size": 32, "unknown": 1})


def test_generator_and_discriminator_shapes_per_scale():
    config = CPGANConfig(**TINY)
    generator, discriminator = CPGANGenerator(config), CPGANDiscriminator(config)
    gamma = synthetic_gamma(2, 16)
    gammas = privacy_pyramid(gamma, config.scales, generator=torch.Generator().manual_seed(0))
    fake = generator(gammas, generator=torch.Generator().manual_seed(1))
    assert [tuple(f.shape) for f in fake] == [(2, 1, s, s, s) for s in config.scales]
    scores = discriminator(compose_pyramid(fake, image_pyramid(gamma[:, 2:3], config.scales), gammas), gammas)
    assert scores.shape == (2,)
    assert torch.isfinite(scores).all()


def test_model_grid_coordinates_are_voxel_centres_in_unit_cube():
    like = torch.zeros(2, 3, 4, 8, 2)
    grid = model_grid_coordinates(like)
    assert grid.shape == (2, 3, 4, 8, 2)
    assert torch.allclose(grid[0, 0, :, 0, 0], torch.tensor([-0.75, -0.25, 0.25, 0.75]))
    assert torch.allclose(grid[1, 2, 0, 0, :], torch.tensor([-0.5, 0.5]))
    assert torch.allclose(grid[0, 1, 0, :, 0], -grid[0, 1, 0, :, 0].flip(0))  # symmetric about the centre


def test_coordinate_inputs_and_dilations_change_the_generator_blocks():
    plain = CPGANGenerator(CPGANConfig(**TINY))
    config = CPGANConfig(**TINY, generator_coordinates=True, generator_position_channels=2,
                         generator_depths=(2, 3, 1), generator_dilations=(1, 2))
    assert CPGANConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    generator = CPGANGenerator(config)
    # the stem reads [previous image, gamma, 3 coordinates, 2 learned position channels]
    assert generator.blocks[0].stem.conv.in_channels == plain.blocks[0].stem.conv.in_channels + 5 == 9
    assert [tuple(b.position.shape) for b in generator.blocks] == [(1, 2, s, s, s) for s in config.scales]
    assert all(not b.position.detach().any() for b in generator.blocks)  # starts as the plain model
    assert [layer.depthwise.conv.dilation for layer in generator.blocks[1].body] == [(1, 1, 1), (2, 2, 2), (1, 1, 1)]
    gammas = privacy_pyramid(synthetic_gamma(1, 16), config.scales, generator=torch.Generator().manual_seed(0))
    fake = generator(gammas, generator=torch.Generator().manual_seed(1))
    assert [tuple(f.shape) for f in fake] == [(1, 1, s, s, s) for s in config.scales]
    # what the finest stem reads after the previous image and gamma is the coordinate grid
    seen = []
    handle = generator.blocks[-1].stem.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    with torch.no_grad():
        generator(gammas, generator=torch.Generator().manual_seed(1))
    handle.remove()
    assert torch.equal(seen[0][:, 4:7], model_grid_coordinates(gammas[-1]))
    assert torch.equal(seen[0][:, 1:4], gammas[-1])
    assert torch.equal(seen[0][:, 7:], generator.blocks[-1].position.detach())
    # the embedding is learned: the loss reaches it
    generator(gammas, generator=torch.Generator().manual_seed(1))[-1].square().mean().backward()
    assert float(generator.blocks[-1].position.grad.abs().sum()) > 0
    with pytest.raises(ValueError):
        CPGANConfig(**TINY, generator_dilations=(0,))
    with pytest.raises(ValueError):
        CPGANConfig(**TINY, generator_position_channels=-1)


def test_noise_is_drawn_from_the_given_generator():
    config = CPGANConfig(**TINY)
    generator = CPGANGenerator(config).eval()
    gammas = privacy_pyramid(synthetic_gamma(1, 16), config.scales, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = generator(gammas, generator=torch.Generator().manual_seed(5))[-1]
        b = generator(gammas, generator=torch.Generator().manual_seed(5))[-1]
        c = generator(gammas, generator=torch.Generator().manual_seed(6))[-1]
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_relativistic_lsgan_loss_form():
    real = torch.tensor([2.0, 0.5, -1.0])
    fake = torch.tensor([0.0, 1.5, -1.0])
    assert torch.isclose(discriminator_loss(real, fake), ((real - fake - 1) ** 2).mean())
    assert torch.isclose(generator_loss(real, fake), ((fake - real - 1) ** 2).mean())
    # the critic is satisfied when every real scores exactly 1 above its paired fake, the generator
    # when every fake scores 1 above its real: the two losses are mirror images
    assert discriminator_loss(fake + 1.0, fake).item() == 0.0
    assert generator_loss(real, real + 1.0).item() == 0.0
    # non-averaging: pairs are compared one to one, not against the batch mean
    assert discriminator_loss(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 2.0])).item() == 0.0


def test_composition_keeps_brain_and_background_outside_hull():
    gamma = synthetic_gamma(1, 16)
    image = torch.rand(1, 1, 16, 16, 16)
    generated = torch.full((1, 1, 16, 16, 16), 7.0)
    out = compose_preserving(generated, image, gamma, background=0.0)
    hull, brain = gamma[:, 0:1] > 0, gamma[:, 1:2] > 0
    assert torch.equal(out[brain], image[brain])
    assert (out[~hull] == 0).all()
    assert (out[hull & ~brain] == 7.0).all()
    real = mask_to_hull([image], [gamma])[0]
    assert (real[~hull] == 0).all() and torch.equal(real[hull], image[hull])


def test_a_few_steps_reduce_the_losses():
    torch.manual_seed(0)
    config = CPGANConfig(**TINY)
    generator, discriminator = CPGANGenerator(config), CPGANDiscriminator(config)
    gamma = synthetic_gamma(2, 16)
    image = gamma[:, 0:1] * 0.8 + gamma[:, 2:3] * 0.1
    rng = torch.Generator().manual_seed(0)
    gammas = privacy_pyramid(gamma, config.scales, generator=rng)
    images = image_pyramid(image, config.scales)
    noise = generator.sample_noise(2, rng)

    # generator: the per-scale remodeled-region L1 goes down under AdamP
    from adamp import AdamP

    optimizer = AdamP(generator.parameters(), lr=2e-3, betas=(0.0, 0.99))
    losses = []
    for _ in range(15):
        l1 = torch.stack(remodel_region_l1(generator(gammas, noise=noise), images, gammas)).mean()
        optimizer.zero_grad()
        l1.backward()
        for p in generator.parameters():
            p.grad = p.grad.contiguous()
        optimizer.step()
        losses.append(l1.item())
    assert losses[-1] < 0.7 * losses[0]

    # critic: with the fake fixed, the relativistic critic loss goes down
    with torch.no_grad():
        fake = compose_pyramid(generator(gammas, noise=noise), images, gammas)
    real = mask_to_hull(images, gammas)
    optimizer_d = AdamP(discriminator.parameters(), lr=2e-3, betas=(0.0, 0.99))
    before = [p.detach().clone() for p in discriminator.parameters()]
    d_losses = []
    for _ in range(15):
        loss = discriminator_loss(discriminator(real, gammas), discriminator(fake, gammas))
        optimizer_d.zero_grad()
        loss.backward()
        for p in discriminator.parameters():
            p.grad = p.grad.contiguous()
        optimizer_d.step()
        d_losses.append(loss.item())
    assert d_losses[-1] < d_losses[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, discriminator.parameters()))


def test_weights_round_trip_and_errors(tmp_path):
    config = CPGANConfig(**TINY)
    generator = CPGANGenerator(config)
    path = tmp_path / "g.safetensors"
    card = save_generator(path, generator, {"privacy_transform": {"size": 16}})
    assert len(card["sha256"]) == 64
    loaded, loaded_card = load_generator(path)
    assert loaded.config == config and loaded_card["sha256"] == card["sha256"]
    for a, b in zip(generator.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)

    with pytest.raises(WeightsError, match="not found"):
        load_generator(tmp_path / "missing.safetensors")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    (tmp_path / "corrupt.json").write_text((tmp_path / "g.json").read_text())
    with pytest.raises(WeightsError, match="corrupt"):
        load_generator(corrupt)
    no_card = tmp_path / "nocard.safetensors"
    no_card.write_bytes(path.read_bytes())
    with pytest.raises(WeightsError, match="model card"):
        load_generator(no_card)
    wrong = tmp_path / "wrong.safetensors"
    wrong.write_bytes(path.read_bytes())
    other = dict(card, config=CPGANConfig(size=16, finest_channels=8, coarsest_channels=8).to_dict())
    (tmp_path / "wrong.json").write_text(json.dumps(other))
    with pytest.raises(WeightsError, match="do not match"):
        load_generator(wrong)


def test_face_region_is_in_front_of_the_brain_and_can_be_left_out_of_the_l1():
    """face_region: model axis j beyond the brain centroid plus half the way to its front; the L1
    with exclude_face ignores a change made there, and still sees one made behind the brain."""
    gamma = torch.zeros(1, 3, 16, 16, 16)
    gamma[:, 0, 1:15, 1:15, 1:15] = 1
    gamma[:, 1, 5:11, 4:10, 6:12] = 1  # brain: j from 4 to 9, centroid 6.5, front 9
    face = face_region(gamma)[0, 0]
    assert face.shape == (16, 16, 16)
    assert bool((face[:, 8:] == 1).all()) and bool((face[:, :8] == 0).all())  # j > 6.5 + 0.5 * 2.5
    target = torch.zeros(1, 1, 16, 16, 16)
    in_front = target.clone()
    in_front[:, :, 7, 12, 8] = 1.0
    behind = target.clone()
    behind[:, :, 7, 2, 8] = 1.0
    assert float(remodel_region_l1([in_front], [target], [gamma], exclude_face=True)[0]) == 0.0
    assert float(remodel_region_l1([in_front], [target], [gamma])[0]) > 0.0
    assert float(remodel_region_l1([behind], [target], [gamma], exclude_face=True)[0]) > 0.0
