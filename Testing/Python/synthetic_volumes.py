"""Small synthetic heads on non-trivial grids, for tests."""
import numpy as np

from AnonMRILib.io import Volume


def synthetic_head(shape=(40, 48, 44), spacing=(1.5, 1.2, 1.4), dtype=np.int16, seed=0) -> Volume:
    """An ellipsoid 'head' with a brighter inner 'brain', an oblique affine, and mild noise."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij"))
    radius = np.sqrt((grid ** 2).sum(0))
    array = np.where(radius < 0.85, 400.0, 0.0) + np.where(radius < 0.55, 500.0, 0.0)
    array += rng.normal(0, 5, shape)
    angle = np.deg2rad(10)
    rotation = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = rotation @ np.diag(spacing)
    affine[:3, 3] = [-30.0, -25.5, -20.25]
    return Volume(np.clip(array, 0, None).astype(dtype), affine)
