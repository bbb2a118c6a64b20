"""Tiny randomly initialised lesion models and small volumes for the lesion tests (fast on CPU)."""
import numpy as np

from AnonMRILib.io import Volume

TINY_SIZE = 32


def tiny_models(seed: int = 0, prior: bool = False):
    """Randomly initialised lesion networks at 32 x 32 (``prior``: the diffusion model conditioned on
    the brain prior's latent, windowed attention in the VAEs, as the donor prior's models)."""
    import torch

    from AnonMRILib.models.latent_diffusion import ConditionalLatentUNet, LatentDiffusionConfig
    from AnonMRILib.models.lesion_vae import LesionPreservingAutoencoder, LesionVAEConfig
    from AnonMRILib.pipelines.lesion import LesionModels

    torch.manual_seed(seed)
    vae = LesionPreservingAutoencoder(LesionVAEConfig(image_size=TINY_SIZE, latent_channels=4, channels=(8, 8, 16),
                                                      attention_window=2 if prior else 0))
    unet = ConditionalLatentUNet(LatentDiffusionConfig(image_size=TINY_SIZE, latent_channels=4, channels=(8, 16, 16),
                                                       embedding_dim=16, mask_channels=8,
                                                       prior_channels=4 if prior else 0))
    return LesionModels(vae.eval(), unet.eval(), latent_scale=1.0, latent_shift=0.0, device=torch.device("cpu"))


def save_tiny_weights(folder, seed: int = 0, prior: bool = False) -> None:
    from AnonMRILib.models.lesion_weights import DIFFUSION_FILE, VAE_FILE, save_model

    models = tiny_models(seed, prior)
    save_model(folder / VAE_FILE, models.autoencoder, "lesion_vae")
    save_model(folder / DIFFUSION_FILE, models.diffusion, "lesion_diffusion", {"latent_scale": 1.0, "latent_shift": 0.0})


def brain_with_lesion(shape=(36, 40, 12), dtype=np.int16, affine=None, seed: int = 0):
    """A noisy ellipsoid 'brain' with a lesion blob (labels 1 and 4) and empty first/last slices."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    brain = (grid[0] ** 2 + grid[1] ** 2 + (grid[2] * 0.8) ** 2) < 0.8
    brain[:, :, 0] = brain[:, :, -1] = False
    array = np.where(brain, 300 + rng.normal(0, 30, shape), 0)
    lesion = ((grid[0] - 0.2) ** 2 + (grid[1] + 0.1) ** 2 + grid[2] ** 2) < 0.08
    labels = np.where(lesion, 1, 0)
    labels[lesion & (rng.random(shape) < 0.3)] = 4
    array = np.where(lesion, 800, array)
    if affine is None:
        affine = np.diag([-4.0, -4.0, 5.0, 1.0])
        affine[:3, 3] = [70.0, 80.0, -30.0]
    return Volume(np.clip(array, 0, None).astype(dtype), affine), Volume(labels.astype(np.uint8), affine)
