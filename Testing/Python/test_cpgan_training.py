"""Training/train_cpgan.py: cache, 2-process DistributedDataParallel on gloo (CPU), checkpoints and resume."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import ndimage

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "Training"))

import train_cpgan  # noqa: E402

from AnonMRILib.models.cpgan_weights import load_generator  # noqa: E402
from AnonMRILib.transforms.anatomical_prior import prior_rendering  # noqa: E402
from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path  # noqa: E402

TINY_MODEL = {"size": 32, "finest_channels": 4, "coarsest_channels": 8}


def tiny_config(**overrides) -> train_cpgan.TrainConfig:
    values = dict(
        model=TINY_MODEL,
        population={"subjects_per_head": 2, "scans_per_subject": 1, "seed": 0},
        privacy={"rotations": 8},
        heads=[{"name": "sample", "image": str(sample_head_path()), "brain_mask": str(sample_brain_mask_path())}],
        working_spacing_mm=4.0, steps=3, batch_size=1, reconstruction_weight=1.0, log_every=1,
        checkpoint_every=2, sample_every=0, threads=1, seed=0)
    values.update(overrides)
    return train_cpgan.TrainConfig(**values)


def test_a_cache_drawn_with_another_prior_rendering_is_not_resumed(tmp_path):
    """The cache records its priors' rendering before the first scan; resuming it with another (a
    recalibrated fat level, a cache from before the record) stops with a clear message instead of
    mixing two renderings under one model card."""
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    current = train_cpgan.claim_cache_rendering(fresh)
    assert current == prior_rendering()
    assert json.loads((fresh / train_cpgan.RENDERING_FILE).read_text(encoding="utf-8")) == current
    assert train_cpgan.claim_cache_rendering(fresh) == current  # the same rendering resumes
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "scan.safetensors").write_bytes(b"")
    other = tmp_path / "other"
    other.mkdir()
    (other / "index.json").write_text(json.dumps({**current, "prior_fat_level": 3.0}), encoding="utf-8")
    for folder in (legacy, other):
        with pytest.raises(SystemExit, match="rendered with"):
            train_cpgan.claim_cache_rendering(folder)
        assert not (folder / train_cpgan.RENDERING_FILE).exists()
    assert prior_rendering({}) == {"prior_fat_level": None, "prior_bright_stretch": 2.0,
                                   "prior_thick_slice_bright_stretch": 2.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cache")
    index = train_cpgan.build_cache(tiny_config(), directory, log=lambda message: None)
    assert len(index["scans"]) == 2 and (directory / "index.json").is_file()
    return directory


def test_cache_holds_gamma_and_image_at_model_size(cache):
    pairs = train_cpgan.CachedPairs(cache)
    gamma, image, prior = pairs[0]
    assert gamma.shape == (3, 32, 32, 32) and image.shape == (1, 32, 32, 32) and prior.numel() == 0
    assert set(torch.unique(gamma[:2]).tolist()) <= {0.0, 1.0}
    assert float(image.max()) > 0.5


def test_two_process_gloo_ddp_then_resume(cache, tmp_path):
    out = tmp_path / "run"
    config_path = tmp_path / "config.json"
    config = tiny_config(heads=[])  # the cache is already built; workers only read it
    config_path.write_text(json.dumps(train_cpgan.asdict(config)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               str(REPO / "Training" / "train_cpgan.py"), "--config", str(config_path), "--out", str(out),
               "--cache", str(cache), "--device", "cpu"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "world 2" in result.stdout

    # both replicas ended with identical networks (gradients were all-reduced)
    ranks = [json.loads((out / f"parameters_rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"] == 3
    assert ranks[0]["generator"] == ranks[1]["generator"]
    assert ranks[0]["discriminator"] == ranks[1]["discriminator"]

    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert set(lines[-1]["l1_per_scale"]) == {"4", "8", "16", "32"}
    generator, card = load_generator(out / "generator.safetensors")
    assert generator.config.size == 32 and card["training"]["steps"] == 3 and card["training"]["processes"] == 2
    assert card["data"]["scans"] == 2

    # resume in one process: continues from the checkpoint's step with the optimizer state restored
    checkpoint = json.loads((out / "checkpoint.json").read_text())
    assert checkpoint["step"] == 3 and checkpoint["optimizer_g"]["state"]
    summary = train_cpgan.train(tiny_config(heads=[], steps=5), out, cache, device_name="cpu")
    assert summary["steps"] == 5
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines][-2:] == [4, 5]


def test_checkpoint_round_trip_restores_optimizer_state(tmp_path):
    from AnonMRILib.models.cpgan import CPGANConfig, CPGANDiscriminator, CPGANGenerator

    config = tiny_config()
    model = CPGANConfig(**TINY_MODEL)
    nets = [CPGANGenerator(model), CPGANDiscriminator(model), CPGANGenerator(model)]
    optimizers = [train_cpgan.make_optimizer(nets[0].parameters(), config),
                  train_cpgan.make_optimizer(nets[1].parameters(), config)]
    for net, optimizer in zip(nets[:2], optimizers):
        loss = sum((p ** 2).sum() for p in net.parameters())
        loss.backward()
        optimizer.step()
    rng = torch.Generator().manual_seed(3)
    path = tmp_path / "checkpoint.safetensors"
    train_cpgan.save_checkpoint(path, 7, 12.5, *nets, *optimizers, rng, config)
    fresh = [CPGANGenerator(model), CPGANDiscriminator(model), CPGANGenerator(model)]
    fresh_optimizers = [train_cpgan.make_optimizer(fresh[0].parameters(), config),
                        train_cpgan.make_optimizer(fresh[1].parameters(), config)]
    fresh_rng = torch.Generator()
    step, elapsed = train_cpgan.load_checkpoint(path, *fresh, *fresh_optimizers, fresh_rng)
    assert (step, elapsed) == (7, 12.5)
    for a, b in zip(nets, fresh):
        for x, y in zip(a.state_dict().values(), b.state_dict().values()):
            assert torch.equal(x, y)
    for a, b in zip(optimizers, fresh_optimizers):
        sa, sb = a.state_dict()["state"], b.state_dict()["state"]
        assert sa.keys() == sb.keys()
        for key in sa:
            assert torch.equal(sa[key]["exp_avg"], sb[key]["exp_avg"])
            assert sa[key]["step"] == sb[key]["step"]
    assert torch.equal(rng.get_state(), fresh_rng.get_state())


def test_reconstruction_warmup_trains_only_the_generator(cache, tmp_path):
    from safetensors.torch import load_file

    from AnonMRILib.models.cpgan import CPGANConfig, CPGANDiscriminator

    out = tmp_path / "warmup"
    config = tiny_config(heads=[], steps=3, reconstruction_warmup_steps=2, checkpoint_every=2,
                         adversarial_learning_rate=1e-4)
    train_cpgan.train(config, out, cache, device_name="cpu")
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [line["phase"] for line in lines] == ["warmup", "warmup", "adversarial"]
    assert [line["learning_rate"] for line in lines] == [config.learning_rate, config.learning_rate, 1e-4]
    assert "loss_d" not in lines[1] and "loss_d" in lines[2]
    assert lines[0]["loss_g_total"] == pytest.approx(sum(lines[0]["l1_per_scale"].values()) / 4, rel=1e-5)

    # the discriminator of the step-3 checkpoint moved; a warm-up-only run leaves it at its initial weights
    only_warmup = tmp_path / "only_warmup"
    train_cpgan.train(tiny_config(heads=[], steps=2, reconstruction_warmup_steps=2), only_warmup, cache,
                      device_name="cpu")
    torch.manual_seed(config.seed)
    model = CPGANConfig(**TINY_MODEL)
    from AnonMRILib.models.cpgan import CPGANGenerator

    CPGANGenerator(model)  # the training script draws G's initial weights first, then D's
    initial = CPGANDiscriminator(model).state_dict()
    for run, moved in ((only_warmup, False), (out, True)):
        saved = {k[len("discriminator/"):]: v for k, v in load_file(str(run / "checkpoint.safetensors")).items()
                 if k.startswith("discriminator/")}
        assert saved.keys() == initial.keys()
        same = all(torch.equal(saved[k], v) for k, v in initial.items())
        assert same != moved


@pytest.mark.parametrize("variation", ["intensity", "displacement"])
def test_prior_conditioned_training_caches_the_prior_and_trains(tmp_path, variation):
    """model.prior = average_head: the cache holds T(x) on the model grid (placed from the scan's
    brain mask and hull), training steps run, and the trained residual (or velocity) is no longer
    zero."""
    config = tiny_config(model=dict(TINY_MODEL, prior="average_head", prior_variation=variation),
                         population={"subjects_per_head": 1, "scans_per_subject": 2, "seed": 0}, steps=2)
    cache_dir = tmp_path / "cache"
    train_cpgan.build_cache(config, cache_dir, log=lambda message: None)
    gamma, image, prior = train_cpgan.CachedPairs(cache_dir)[0]
    assert prior.shape == (1, 32, 32, 32)
    hull = gamma[0] > 0
    # beyond one model voxel (8 mm here) outside the hull the prior is air (it fades out by 8 mm);
    # the voxels on the hull's edge hold part of the skin
    beyond = ~torch.from_numpy(ndimage.binary_dilation(hull.numpy()))
    assert float(prior[0][hull].mean()) > 0.1 and float(prior[0][beyond].abs().max()) < 0.2
    train_cpgan.train(config, tmp_path / "run", cache_dir, device_name="cpu")
    generator, card = load_generator(tmp_path / "run" / "generator.safetensors")
    assert generator.config.prior == "average_head" and generator.config.prior_variation == variation
    rendering = prior_rendering()  # what remodel's generator_view reads back
    assert {key: card[key] for key in rendering} == rendering
    last = generator.blocks[-1].to_image.conv.weight.detach()
    assert float(last.abs().sum()) > 0
