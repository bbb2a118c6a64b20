"""Consistent volumes: neighbour-conditioned generation raises adjacent-slice correlation."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.evaluation.volume_consistency import adjacent_slice_correlation, consistency_summary
from AnonMRILib.pipelines.lesion import (SourceRepulsionConfig, VolumeConsistencyConfig, anonymize_lesion_slices,
                                         consistency_rounds)
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


def test_consistency_rounds_are_two_chains_outward_from_the_middle():
    positions = np.array([5.0, 1.0, 3.0, 2.0, 4.0, 0.0])  # unsorted: sorted internally
    rounds = consistency_rounds(positions)
    order = list(np.argsort(positions))  # slice indices from the lowest position up
    rank = {index: k for k, index in enumerate(order)}
    assert rounds[0] == [(order[3], None)]  # the middle slice first, unconditioned
    seen = {order[3]: 0}
    for number, pairs in enumerate(rounds[1:], start=1):
        assert 1 <= len(pairs) <= 2
        for index, neighbour in pairs:
            assert abs(rank[index] - rank[neighbour]) == 1  # conditioned on its adjacent slice ...
            assert seen[neighbour] == number - 1  # ... generated in the round before
            seen[index] = number
    assert sorted(seen) == list(range(len(positions)))  # every slice exactly once
    assert len(rounds) == 4 and consistency_rounds(np.zeros(0)) == [] and consistency_rounds([7.0]) == [[(0, None)]]


def near_identical_stack(count: int):
    """(images, lesion masks, grades, depths) of ``count`` nearly identical slices (one random image
    plus 2 % noise each, rng seed 1) with the same square lesion."""
    rng = np.random.default_rng(1)
    images = np.clip(rng.random((1, TINY_SIZE, TINY_SIZE)) + 0.02 * rng.random((count, TINY_SIZE, TINY_SIZE)), 0, 1)
    images = images.astype(np.float32)
    masks = np.zeros_like(images, np.uint8)
    masks[:, 10:16, 12:18] = 1
    return images, masks, np.ones(count, int), np.linspace(0.4, 0.6, count)


def test_full_neighbour_conditioning_copies_the_middle_slice_along_both_chains():
    models = tiny_models(1)
    count = 7
    images, masks, grades, depths = near_identical_stack(count)
    positions = np.arange(count, dtype=float)
    repulsion = SourceRepulsionConfig(candidates=3)
    full = VolumeConsistencyConfig(noise_correlation_mm=1e9, neighbour_weight=1.0, guided_fraction=1.0)
    copied = anonymize_lesion_slices(models, images, masks, grades, depths, steps=3, seed=0, repulsion=repulsion,
                                     positions_mm=positions, consistency=full)
    independent = anonymize_lesion_slices(models, images, masks, grades, depths, steps=3, seed=0, repulsion=repulsion)
    assert (copied > 0).mean() > 0.3  # a non-trivial image
    assert np.abs(copied - copied[count // 2]).max() < 1e-3  # both chains carry the middle slice's latent
    assert np.abs(independent - independent[count // 2]).max() > 0.05


def test_neighbour_conditioning_increases_consistency_and_keeps_lesion_latent():
    models = tiny_models(1)  # its decoder's output is mostly above 0 (seed 0's is clamped to 0 almost everywhere)
    count = 8
    images, masks, grades, depths = near_identical_stack(count)
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
