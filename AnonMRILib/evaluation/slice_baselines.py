"""2-D augmentation baselines of the lesion paper's Table 7, on slices in [0, 1] (N, S, S).

The paper names them without parameters; the choices here:

* ``blur``: Gaussian blur, sigma = 1.5 pixels (5.6 mm at 64 px over 240 mm);
* ``flip``: horizontal (left-right) flip: axis 1 of an (N, R, A)-ordered slice stack;
* ``crop_resize``: a random square crop of 80-95 % of the side at a random position, resized back
  (bilinear);
* ``noise_0.1`` / ``noise_0.5``: additive Gaussian noise with standard deviation 0.1 / 0.5 of the
  data range (1.0), clipped to [0, 1].

All are deterministic in ``seed``.
"""
from typing import Callable, Dict

import numpy as np


def gaussian_blur(images: np.ndarray, seed: int = 0, sigma: float = 1.5) -> np.ndarray:
    from scipy import ndimage

    return np.stack([ndimage.gaussian_filter(image, sigma) for image in images]).astype(np.float32)


def horizontal_flip(images: np.ndarray, seed: int = 0) -> np.ndarray:
    return np.ascontiguousarray(images[:, ::-1, :])


def random_crop_resize(images: np.ndarray, seed: int = 0, smallest: float = 0.8, largest: float = 0.95) -> np.ndarray:
    from skimage.transform import resize

    rng = np.random.default_rng(seed)
    size = images.shape[-1]
    out = np.empty_like(images, dtype=np.float32)
    for index, image in enumerate(images):
        side = int(round(size * rng.uniform(smallest, largest)))
        row, col = rng.integers(0, size - side + 1, 2)
        out[index] = resize(image[row:row + side, col:col + side], (size, size), order=1, preserve_range=True)
    return out


def gaussian_noise(images: np.ndarray, seed: int = 0, ratio: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(images + ratio * rng.standard_normal(images.shape), 0.0, 1.0).astype(np.float32)


SLICE_BASELINES: Dict[str, Callable[..., np.ndarray]] = {
    "gaussian_blur": gaussian_blur,
    "horizontal_flip": horizontal_flip,
    "crop_resize": random_crop_resize,
    "noise_0.1": lambda images, seed=0: gaussian_noise(images, seed, 0.1),
    "noise_0.5": lambda images, seed=0: gaussian_noise(images, seed, 0.5),
}
