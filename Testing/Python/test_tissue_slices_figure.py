"""Training/make_tissue_slices.py: slices through the same RAS point whatever the voxel order."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "Training"))

from make_tissue_slices import CUTS, ras_slices, tissue_slices_figure  # noqa: E402


def test_slices_are_the_same_for_ras_and_lps_voxel_orders():
    rng = np.random.default_rng(0)
    ras = rng.random((30, 40, 50)).astype(np.float32)
    affine = np.diag([1.0, 1.0, 2.0, 1.0])
    affine[:3, 3] = (-15.0, -20.0, -50.0)
    lps = ras[::-1, ::-1, :]  # the same head stored left-posterior-superior
    flip = np.diag([-1.0, -1.0, 1.0, 1.0])
    lps_affine = affine @ np.array([[1, 0, 0, 29], [0, 1, 0, 39], [0, 0, 1, 0], [0, 0, 0, 1]], float) @ flip
    centre = np.array([2.0, -3.0, 10.0])
    cuts = ((0, 0.0), (1, 5.0), (2, -20.0))
    for a, b in zip(ras_slices(ras, affine, centre, cuts), ras_slices(lps, lps_affine, centre, cuts)):
        assert np.array_equal(a, b)
    sagittal, coronal, axial = ras_slices(ras, affine, centre, cuts)
    assert sagittal.shape == (100, 40)  # 2 mm slices shown at 1 mm: 50 slices x 2 high, 40 wide
    assert np.allclose(axial, np.rot90(ras[:, :, 20]))  # z = -50 + 2 * 20 = -10 mm
    from scipy import ndimage

    assert np.allclose(sagittal, np.rot90(ndimage.zoom(ras[17], (1, 2), order=1)))  # x = -15 + 17 = 2 mm
    # a cut outside the grid is blank, not an error
    assert not ras_slices(ras, affine, centre, ((2, -500.0),))[0].any()


def test_figure_has_a_row_per_volume_and_a_column_per_cut():
    volume = np.zeros((40, 40, 40), np.float32)
    volume[10:30, 10:30, 10:30] = 100.0
    brain = volume > 0
    figure = tissue_slices_figure([("original", volume), ("other", volume * 0.5)], np.eye(4), brain)
    assert figure.dtype == np.float32 and 0.0 <= figure.min() and figure.max() <= 1.0
    assert figure.shape[1] >= len(CUTS) * 40 and figure.shape[0] >= 2 * 40


def test_vault_zoom_shows_the_top_of_each_head_enlarged_side_by_side():
    from make_tissue_slices import VAULT_ZOOM, vault_zoom_figure

    volume = np.zeros((60, 60, 60), np.float32)
    volume[15:45, 2:58, 10:40] = 100.0  # the brain: its top at z = 39, the cut 20 mm behind its centre at y = 9.5
    volume[12:48, 0:60, 40:44] = 200.0  # a skull above it
    brain = volume == 100.0
    figure = vault_zoom_figure([("original", volume), ("other", volume * 0.5)], np.eye(4), brain)
    assert figure.dtype == np.float32 and 0.0 <= figure.min() and figure.max() <= 1.0
    # from the grid's top (z = 59) down to 60 mm below the brain's top, the head's left half: each of
    # the two panels at least VAULT_ZOOM x 20 rows (z 59..40) and VAULT_ZOOM x 29 columns
    assert figure.shape[0] >= VAULT_ZOOM * 20 and figure.shape[1] >= 2 * VAULT_ZOOM * 29
