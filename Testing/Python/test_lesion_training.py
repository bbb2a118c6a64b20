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
