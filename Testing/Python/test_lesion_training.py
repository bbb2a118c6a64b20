"""Training scripts of the lesion models: config overrides, safetensors checkpoints, resume, model cards."""
import json
import sys
from pathlib import Path

import numpy as np

from AnonMRILib.datasets.slices import LesionSliceSet

TRAINING = Path(__file__).resolve().parents[2] / "Training"
sys.path.insert(0, str(TRAINING))


def tiny_data(path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 24
    masks = np.zeros((n, 32, 32), bool)
    masks[:, 10:16, 12:18] = rng.random((n, 1, 1)) > 0.3
    LesionSliceSet(rng.random((n, 32, 32)) * 0.5, masks, rng.integers(0, 2, n), rng.random(n),
                   np.repeat(np.arange(8), 3)).save(path)


def test_vae_and_diffusion_training_resume_and_cards(tmp_path):
    import torch

    import train_lesion_diffusion
    import train_lesion_vae

    from AnonMRILib.models.lesion_weights import load_lesion_diffusion, load_lesion_vae, sha256_of

    data = tmp_path / "slices.npz"
    tiny_data(data)
    vae_out = tmp_path / "vae"
    tiny = ["--set", "image_size=32", "--set", "channels=[8,8,16]", "--set", "latent_channels=4",
            "--set", "batch_size=8", "--set", "halve_every=1", "--threads", "1", "--device", "cpu"]
    assert train_lesion_vae.main(["--data", str(data), "--out", str(vae_out), "--set", "epochs=1", *tiny]) == 0
    assert (vae_out / "checkpoint.safetensors").is_file()
    assert train_lesion_vae.main(["--data", str(data), "--out", str(vae_out), "--set", "epochs=2", "--resume", *tiny]) == 0
    card = json.loads((vae_out / "lesion_vae.json").read_text())
    assert card["epochs_done"] == 2 and [h["alpha_v"] for h in card["history"]] == [16.0, 8.0]
    assert card["steps"] == 4 and card["sha256"] == sha256_of(vae_out / "lesion_vae.safetensors")
    assert not set(card["split"]["train_patients"]) & set(card["split"]["test_patients"])
    assert load_lesion_vae(vae_out / "lesion_vae.safetensors").config.image_size == 32

    diffusion_out = tmp_path / "diffusion"
    assert train_lesion_diffusion.main([
        "--data", str(data), "--vae", str(vae_out / "lesion_vae.safetensors"), "--out", str(diffusion_out),
        "--set", "channels=[8,16,16]", "--set", "embedding_dim=16", "--set", "mask_channels=8",
        "--set", "batch_size=8", "--set", "epochs=1", "--threads", "1", "--device", "cpu"]) == 0
    unet, scale, shift = load_lesion_diffusion(diffusion_out / "lesion_diffusion.safetensors")
    card = json.loads((diffusion_out / "lesion_diffusion.json").read_text())
    assert unet.config.latent_size == 4 and scale > 0 and card["latent_scale"] == scale and card["steps"] == 2

    # a later session goes on from the shipped (committed) weights: --set init_from, no checkpoint
    later = tmp_path / "diffusion_later"
    shipped = diffusion_out / "lesion_diffusion.safetensors"
    assert train_lesion_diffusion.main([
        "--data", str(data), "--vae", str(vae_out / "lesion_vae.safetensors"), "--out", str(later),
        "--set", "channels=[8,16,16]", "--set", "embedding_dim=16", "--set", "mask_channels=8",
        "--set", "batch_size=8", "--set", "epochs=1", "--set", f"init_from={shipped}", "--set", "learning_rate=0",
        "--threads", "1", "--device", "cpu"]) == 0
    again, _, _ = load_lesion_diffusion(later / "lesion_diffusion.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(unet.state_dict().values(), again.state_dict().values()))


def test_crop_training_config_sections_compact_checkpoint_and_resume_from(tmp_path):
    """Paper-resolution machinery on a tiny model: random crops of full slices, the config file's
    "vae" section, bfloat16 checkpoints half the size, --resume-from a copied checkpoint, --max-steps."""
    import shutil

    import torch

    import train_lesion_vae
    from lesion_training_common import build_config, random_crops

    data = tmp_path / "slices.npz"
    tiny_data(data)
    config_file = tmp_path / "paper.json"
    config_file.write_text(json.dumps({"_comment": "x", "vae": {"image_size": 32, "channels": [8, 8, 16],
                                                                  "latent_channels": 4, "batch_size": 8,
                                                                  "crop_size": 16, "eval_max_slices": 3},
                                       "diffusion": {"epochs": 3}}))
    common = ["--data", str(data), "--config", str(config_file), "--threads", "1", "--device", "cpu"]
    full, compact = tmp_path / "full", tmp_path / "compact"
    assert train_lesion_vae.main([*common, "--out", str(full), "--max-steps", "1"]) == 0
    assert train_lesion_vae.main([*common, "--out", str(compact), "--max-steps", "1",
                                  "--set", "checkpoint_dtype=bfloat16"]) == 0
    card = json.loads((compact / "lesion_vae.json").read_text())
    assert card["training"]["crop_size"] == 16 and card["steps"] == 1 and card["test_slices"] == 3
    assert card["config"]["image_size"] == 32  # trained on 16 px crops, evaluated on whole 32 px slices
    size_full = (full / "checkpoint.safetensors").stat().st_size
    assert (compact / "checkpoint.safetensors").stat().st_size < 0.6 * size_full
    committed = tmp_path / "committed.safetensors"
    shutil.copy(compact / "checkpoint.safetensors", committed)
    later = tmp_path / "later"
    assert train_lesion_vae.main([*common, "--out", str(later), "--max-steps", "2", "--resume-from", str(committed)]) == 0
    assert json.loads((later / "lesion_vae.json").read_text())["steps"] == 3

    generator = torch.Generator().manual_seed(0)
    x = torch.arange(2 * 32 * 32, dtype=torch.float32).reshape(2, 1, 32, 32)
    crops_x, crops_m = random_crops(generator, 8, x, x + 0.5)
    assert crops_x.shape == (2, 1, 8, 8) and torch.equal(crops_m, crops_x + 0.5)
    assert random_crops(generator, 0, x)[0] is x

    class Args:  # the "diffusion" section, with --set on top
        config, set = config_file, ["epochs=5"]
    import train_lesion_diffusion

    assert build_config(train_lesion_diffusion.DiffusionTrainingConfig, Args, section="diffusion").epochs == 5
    Args.set = []
    assert build_config(train_lesion_diffusion.DiffusionTrainingConfig, Args, section="diffusion").epochs == 3


def test_paper_config_file_is_valid_for_both_scripts():
    import train_lesion_diffusion
    import train_lesion_vae
    from lesion_training_common import build_config

    class Args:
        config, set = TRAINING / "configs" / "lesion_paper_240.json", []

    vae = build_config(train_lesion_vae.VAETrainingConfig, Args, section="vae")
    assert vae.image_size == 240 and vae.image_size // 8 == 30 and 2 * vae.latent_channels == 32
    assert vae.crop_size % 8 == 0 and vae.channels == (32, 64, 128)
    assert build_config(train_lesion_diffusion.DiffusionTrainingConfig, Args, section="diffusion").epochs > 0
