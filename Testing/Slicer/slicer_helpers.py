"""Synthetic volumes for the Slicer module tests (imported by the test files)."""
import numpy as np
import pytest

from AnonMRILib.io.volume import Volume


def require_slicer_core():
    """The ``slicer`` package of slicer-core, or skip the calling test module with the reason."""
    slicer = pytest.importorskip("slicer", reason="the Slicer tests need Kitware's slicer-core wheel "
                                 "(pip install slicer-core; Python >= 3.10)")
    if not hasattr(slicer, "vtkMRMLScene"):
        pytest.skip("the installed 'slicer' package is not slicer-core (no vtkMRMLScene)", allow_module_level=True)
    return slicer


def rotated_affine(spacing=(1.2, 0.9, 2.5), origin=(-31.5, 12.25, 40.0), angles_deg=(20.0, -35.0, 10.0)):
    """A voxel -> RAS affine with a non-identity direction matrix and non-unit spacing."""
    ax, ay, az = np.deg2rad(angles_deg)
    rx = np.array([[1, 0, 0], [0, np.cos(ax), -np.sin(ax)], [0, np.sin(ax), np.cos(ax)]])
    ry = np.array([[np.cos(ay), 0, np.sin(ay)], [0, 1, 0], [-np.sin(ay), 0, np.cos(ay)]])
    rz = np.array([[np.cos(az), -np.sin(az), 0], [np.sin(az), np.cos(az), 0], [0, 0, 1]])
    affine = np.eye(4)
    affine[:3, :3] = rz @ ry @ rx @ np.diag(spacing)
    affine[:3, 3] = origin
    return affine


def synthetic_head(shape=(40, 44, 36), affine=None, seed=0):
    """A small synthetic 'head': an ellipsoid of tissue, a brighter inner 'brain', noise; int16.

    Returns (head Volume, brain mask Volume) on the same grid.
    """
    rng = np.random.default_rng(seed)
    affine = np.diag([2.0, 2.0, 2.0, 1.0]) if affine is None else affine
    i, j, k = np.meshgrid(*(np.arange(n, dtype=np.float64) for n in shape), indexing="ij")
    center = [(n - 1) / 2 for n in shape]
    r = np.sqrt(((i - center[0]) / (0.42 * shape[0])) ** 2 + ((j - center[1]) / (0.45 * shape[1])) ** 2
                + ((k - center[2]) / (0.42 * shape[2])) ** 2)
    head = (r < 1.0).astype(np.float64) * 300.0
    brain = r < 0.65
    head[brain] = 600.0
    head += rng.normal(0.0, 5.0, size=shape) * (r < 1.0)
    return (Volume(np.round(head).astype(np.int16), affine),
            Volume(brain.astype(np.uint8), affine))


def spawn_child_and_wait(volumes, options, progress):
    """A worker entry (run in the worker process) that starts a child process, reports its PID as
    the progress message, then waits: for the test that Cancel kills the whole process tree."""
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    progress(0.5, str(child.pid))
    time.sleep(120)
    return {}


def brain_contrasts(margin_voxels: int = 3):
    """Two co-registered contrasts of one skull-stripped brain with a lesion, as
    ``Testing/Python/test_brain_prior.py``'s ``brain_case`` builds them: the embedded sample head's
    brain (1.5 mm, real anatomy; cropped to the brain's box plus ``margin_voxels`` to keep the tests
    fast) with a bright 12 mm spherical lesion as the T1, and a T2-like image synthesised from its
    tissue classes (CSF bright, white matter dark). Returns (t1, t2, lesion) Volumes on one grid and
    the brain and lesion bool arrays."""
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head
    from AnonMRILib.transforms.brain_prior import classify_patient_tissues

    head, mask = load_sample_head(), load_sample_brain_mask()
    inside = np.asarray(mask.array) != 0
    box = np.argwhere(inside)
    low = np.maximum(box.min(axis=0) - margin_voxels, 0)
    high = np.minimum(box.max(axis=0) + 1 + margin_voxels, inside.shape)
    crop = tuple(slice(int(a), int(b)) for a, b in zip(low, high))
    affine = np.array(head.affine, dtype=np.float64)
    affine[:3, 3] += affine[:3, :3] @ low
    brain = inside[crop]
    image = np.where(brain, np.asarray(head.array)[crop], 0).astype(np.int16)
    centre = np.argwhere(brain).mean(axis=0) + np.array([12.0, 5.0, 8.0])
    grid = np.stack(np.meshgrid(*[np.arange(n) for n in image.shape], indexing="ij"), axis=-1)
    lesion = (np.linalg.norm((grid - centre) * np.asarray(head.spacing), axis=-1) < 12.0) & brain
    image[lesion] = int(np.percentile(image[brain], 99.5) * 1.3)
    t1 = Volume(image, affine)
    tissues = classify_patient_tissues(t1, brain, lesion, "T1w")
    csf, grey, white = tissues.memberships
    t1_values = image[tissues.classified].astype(np.float64)
    t2 = np.zeros(image.shape)
    t2[tissues.classified] = 1400 * csf + 700 * grey + 450 * white + 0.5 * (t1_values - t1_values.mean())
    t2[lesion] = 1500
    t2_volume = Volume(np.where(brain, t2, 0).astype(np.int16), affine)
    return t1, t2_volume, Volume(lesion.astype(np.uint8), affine), brain, lesion
