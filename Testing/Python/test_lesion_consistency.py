"""Consistent volumes: neighbour-conditioned generation raises adjacent-slice correlation."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.evaluation.volume_consistency import adjacent_slice_correlation, consistency_summary
from AnonMRILib.pipelines.lesion import SourceRepulsionConfig, VolumeConsistencyConfig, anonymize_lesion_slices
from lesion_fixtures import TINY_SIZE, tiny_models


def test_adjacent_slice_correlation_of_smooth_and_shuffled_stacks():
    rng = np.random.default_rng(0)
    base = rng.random((TINY_SIZE, TINY_SIZE))
    smooth = np.stack([base + 0.05 * k * rng.random(base.shape) for k in range(6)])
    independent = rng.random((6, TINY_SIZE, TINY_SIZE))
    assert np.all(adjacent_slice_correlation(smooth) > 0.9)
    assert np.all(np.abs(adjacent_slice_correlation(independent)) < 0.2)
    summary = consistency_summary([independent], [smooth])
    assert summary["ratio"] < 0.2 and summary["real"] > 0.9
    empty = np.zeros((3, 8, 8))
    assert np.isnan(adjacent_slice_correlation(empty)).all()
    with pytest.raises(InputError):
        adjacent_slice_correlation(base)


def test_neighbour_conditioning_increases_consistency_and_keeps_lesion_latent():
    models = tiny_models()
    rng = np.random.default_rng(1)
    count = 8
    images = np.clip(rng.random((1, TINY_SIZE, TINY_SIZE)) + 0.02 * rng.random((count, TINY_SIZE, TINY_SIZE)), 0, 1)
    images = images.astype(np.float32)
    masks = np.zeros_like(images, np.uint8)
    masks[:, 10:16, 12:18] = 1
    grades, depths = np.ones(count, int), np.linspace(0.4, 0.6, count)
    positions = np.arange(count, dtype=float)[::-1].copy()  # given in reverse order: sorted internally
    repulsion = SourceRepulsionConfig(candidates=3)
    independent = anonymize_lesion_slices(models, images, masks, grades, depths, steps=3, seed=0, repulsion=repulsion)
    consistent, latents = anonymize_lesion_slices(models, images, masks, grades, depths, steps=3, seed=0,
                                                  repulsion=repulsion, positions_mm=positions, return_latents=True,
                                                  consistency=VolumeConsistencyConfig())
    order = np.argsort(positions)
    foreground = -1.0  # every pixel: the tiny random decoder's output is not a brain
    ours = np.nanmean(adjacent_slice_correlation(consistent[order], foreground))
    theirs = np.nanmean(adjacent_slice_correlation(independent[order], foreground))
    assert ours > theirs + 0.1, (ours, theirs)
    import torch

    with torch.no_grad():
        expected, _ = models.autoencoder.lesion_encoder(torch.from_numpy(images * masks)[:, None])
    assert np.allclose(latents, expected.numpy(), atol=1e-6)
    again = anonymize_lesion_slices(models, images, masks, grades, depths, steps=3, seed=0, repulsion=repulsion,
                                    positions_mm=positions, consistency=VolumeConsistencyConfig())
    assert np.array_equal(again, consistent)
    with pytest.raises(InputError):
        VolumeConsistencyConfig(neighbour_weight=1.5)
