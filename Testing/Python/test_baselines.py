"""Removal baselines: brain kept bit for bit, face removed/obscured, QUICKSHEAR vs PyPI, CLI."""
import numpy as np
import pytest

from AnonMRILib.errors import InputError, InvariantError
from AnonMRILib.io import Volume, load_volume
from AnonMRILib.pipelines import baselines
from AnonMRILib.pipelines.baselines import REMOVAL_METHODS, deface
from AnonMRILib.pipelines.removal.face_blur import FaceMaskConfig, face_region
from AnonMRILib.pipelines.removal.quickshear import QuickshearConfig, quickshear_face_mask
from AnonMRILib.rendering import render_face

ZEROING_METHODS = ("quickshear", "deface", "skullstrip", "black")
#: the eyes-nose-mouth window of a 64 x 64 anterior rendering of the sample
FACE_ROWS, FACE_COLUMNS = slice(28, 51), slice(22, 42)


@pytest.fixture(scope="module")
def sample():
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    return load_sample_head(), load_sample_brain_mask()


@pytest.fixture(scope="module")
def outputs(sample):
    """Every method's output on the sample (computed once; DEFACE registers a template)."""
    head, mask = sample
    return {method: deface(head, method, brain_mask=mask) for method in REMOVAL_METHODS}


def face_voxels(head: Volume) -> np.ndarray:
    """Tissue voxels of the face: 3 mm beneath the surface the anterior rendering shows in its
    central lower-middle part (eyes, nose, mouth), as a boolean array on the head's grid."""
    from AnonMRILib.rendering import make_camera, ray_cast

    camera = make_camera("anterior")
    result = ray_cast(head, camera, size=64)
    centre = np.zeros_like(result.hit)
    centre[FACE_ROWS, FACE_COLUMNS] = True
    points = result.surface_mm[centre & result.hit] + 3.0 * camera.direction
    indices = np.rint(points @ np.linalg.inv(head.affine)[:3, :3].T + np.linalg.inv(head.affine)[:3, 3]).astype(int)
    mask = np.zeros(head.shape, bool)
    mask[tuple(indices.T)] = True
    return mask


@pytest.mark.parametrize("method", REMOVAL_METHODS)
def test_brain_is_kept_bit_for_bit_and_face_is_changed(sample, outputs, method):
    head, mask = sample
    brain = mask.array != 0
    output = outputs[method]
    assert output.same_grid(head) and output.dtype == head.dtype
    assert np.array_equal(output.array[brain], head.array[brain])
    face = face_voxels(head)
    assert face.sum() > 200 and not (face & brain).any()
    changed = output.array[face] != head.array[face]
    assert changed.mean() > 0.8, f"{method} changed only {changed.mean():.2f} of the face"
    if method in ZEROING_METHODS:
        assert (output.array[face] == 0).mean() > 0.8
    # the rendered face is different
    difference = np.abs(render_face(output, size=64) - render_face(head, size=64))[FACE_ROWS, FACE_COLUMNS]
    assert difference.mean() > 0.05, f"{method}: rendered face changed by only {difference.mean():.3f}"


def test_methods_differ_as_documented(sample, outputs):
    head, mask = sample
    brain = mask.array != 0
    # black keeps exactly the brain; skull stripping adds the sulcal CSF around it
    assert np.array_equal(outputs["black"].array != 0, brain & (head.array != 0))
    kept = outputs["skullstrip"].array != 0
    assert kept.sum() > outputs["black"].array.astype(bool).sum()
    # face mask and blur keep tissue where the face was (no hole), removal methods do not
    face = face_voxels(head)
    for method in ("facemask", "blur"):
        assert (outputs[method].array[face] > 0).mean() > 0.5
    # face mask leaves the back of the head alone; blur does not
    back = ~face_region(brain, head, FaceMaskConfig(sigma_mm=8.0)) & ~brain
    back &= np.arange(head.shape[1])[None, :, None] < head.shape[1] // 3     # posterior third (RAS)
    assert np.array_equal(outputs["facemask"].array[back], head.array[back])
    assert not np.array_equal(outputs["blur"].array[back], head.array[back])


def test_brain_voxels_changed_by_a_method_are_restored_or_refused(sample, monkeypatch):
    head, mask = sample
    brain_voxel = tuple(np.argwhere(mask.array != 0)[0])

    def corrupting(volume, method, brain, seed=0, config=None, progress=None):
        data = np.asarray(volume.array).copy()
        data[brain_voxel] += 1
        return data

    monkeypatch.setattr(baselines, "removed_region", corrupting)
    output = deface(head, "black", brain_mask=mask)           # composition copies the brain back
    assert output.array[brain_voxel] == head.array[brain_voxel]
    # and were the composition faulty, the final check refuses the output
    from AnonMRILib.transforms import brain_preservation

    monkeypatch.setattr(brain_preservation, "compose_preserving",
                        lambda volume, generated, brain_mask: generated.with_array(
                            generated.array.astype(volume.dtype)))
    with pytest.raises(InvariantError):
        deface(head, "black", brain_mask=mask)


def test_unknown_method_and_bad_mask(sample):
    head, mask = sample
    with pytest.raises(InputError):
        deface(head, "scramble", brain_mask=mask)
    with pytest.raises(InputError):
        deface(head, "black", brain_mask=Volume(mask.array[1:], mask.affine))
    with pytest.raises(InputError):
        deface(head, "black", brain_mask=mask.with_array(np.zeros(mask.shape, np.uint8)))


def test_quickshear_agrees_with_the_pypi_package(sample):
    nib = pytest.importorskip("nibabel")
    quickshear = pytest.importorskip("quickshear")
    head, mask = sample
    brain = mask.array != 0
    # the package's buffer is 10 voxels of the S axis
    ours, _ = quickshear_face_mask(brain, head, QuickshearConfig(buffer_mm=10 * head.spacing[2]))
    reference = np.asarray(quickshear.quickshear(nib.Nifti1Image(head.array, head.affine),
                                                 nib.Nifti1Image(brain.astype(np.uint8), head.affine), 10).dataobj)
    theirs = (reference == 0) & (head.array != 0)
    ours = ours & (head.array != 0)
    agreement = (theirs == ours).mean()
    dice = 2 * (theirs & ours).sum() / (theirs.sum() + ours.sum())
    assert agreement > 0.98 and dice > 0.95, (agreement, dice)


def box_brain_volume(shape):
    """A head-sized grid (2 mm, RAS) with a box-shaped 'brain' in its upper middle and tissue everywhere."""
    head = np.full(shape, 100, np.int16)
    brain = np.zeros(shape, np.uint8)
    ni, nj, nk = shape
    brain[ni // 4: 3 * ni // 4, nj // 4: 3 * nj // 4, nk // 2: nk - 2] = 1
    return Volume(head, np.diag([2.0, 2.0, 2.0, 1.0])), brain.astype(bool)


def test_quickshear_fixes_the_short_vertical_axis_fault():
    """The package shears only the first n_S A-P columns (and fails when n_S > n_A); ours all."""
    nib = pytest.importorskip("nibabel")
    quickshear = pytest.importorskip("quickshear")
    head, brain = box_brain_volume((20, 60, 24))            # S axis (24) shorter than A-P (60)
    ours, line = quickshear_face_mask(brain, head, QuickshearConfig(buffer_mm=4.0))
    assert line.slope == pytest.approx(0.0)                 # the box's flat underside
    # everything 4 mm (2 voxels) below the brain's underside is cut, at every A-P position
    underside = np.argmax(brain.any(axis=(0, 1)))
    assert ours[:, :, : underside - 2].all() and not ours[:, :, underside - 2:].any()
    reference = np.asarray(quickshear.quickshear(nib.Nifti1Image(head.array, head.affine),
                                                 nib.Nifti1Image(brain.astype(np.uint8), head.affine), 2).dataobj)
    theirs = reference == 0
    # RAS storage: RPS column p = 59 - j; the package never reaches p >= n_S = 24
    posterior_columns = np.arange(60) < 60 - 24
    assert not theirs[:, posterior_columns, :].any()
    assert ours[:, posterior_columns, :].any()
    # with n_S > n_A the package indexes past the array; ours just works
    tall_head, tall_brain = box_brain_volume((20, 24, 60))
    with pytest.raises(IndexError):
        quickshear.quickshear(nib.Nifti1Image(tall_head.array, tall_head.affine),
                              nib.Nifti1Image(tall_brain.astype(np.uint8), tall_head.affine), 2)
    tall_ours, _ = quickshear_face_mask(tall_brain, tall_head, QuickshearConfig(buffer_mm=4.0))
    assert tall_ours.any() and not (tall_ours & tall_brain).any()


def test_quickshear_does_not_depend_on_voxel_order(sample):
    head, mask = sample
    flipped = Volume(np.flip(head.array, 0).copy(), head.affine @ np.array(
        [[-1, 0, 0, head.shape[0] - 1], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], float))
    flipped_mask = flipped.with_array(np.flip(mask.array, 0).copy())
    direct = deface(head, "quickshear", brain_mask=mask)
    via_las = deface(flipped, "quickshear", brain_mask=flipped_mask)
    assert np.array_equal(np.flip(via_las.array, 0), direct.array)


def test_cli_deface_writes_volume_and_before_after(tmp_path, sample):
    from PIL import Image

    from AnonMRILib.cli.main import main
    from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path

    head, mask = sample
    out = tmp_path / "defaced.nii.gz"
    code = main(["deface", str(sample_head_path()), str(out), "--method", "quickshear",
                 "--brain-mask", str(sample_brain_mask_path()), "--quiet"])
    assert code == 0
    written = load_volume(out)
    assert written.same_grid(head) and written.dtype == head.dtype
    brain = mask.array != 0
    assert np.array_equal(written.array[brain], head.array[brain])
    with Image.open(tmp_path / "defaced_before_after.png") as figure:
        assert figure.size[0] > 2 * 256


@pytest.mark.parametrize("arguments, why", [
    (["--method", "black", "--brain-mask", "{mask}", "--before-after", "{tmp}/figure.jpg"], "not png"),
    (["--method", "black", "--brain-mask", "{tmp}/missing.nii.gz"], "missing mask"),
    (["--method", "black", "--brain-mask", "{small_mask}"], "mask on another grid"),
], ids=["figure-not-png", "missing-mask", "mask-grid"])
def test_cli_deface_bad_inputs_exit_2_and_write_nothing(tmp_path, sample, arguments, why):
    from AnonMRILib.cli.main import main
    from AnonMRILib.io import save_volume
    from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path

    _, mask = sample
    small_mask = tmp_path / "small_mask.nii.gz"
    save_volume(Volume(mask.array[:-1], mask.affine), small_mask)
    out = tmp_path / "out.nii.gz"
    filled = [a.format(mask=sample_brain_mask_path(), tmp=tmp_path, small_mask=small_mask) for a in arguments]
    assert main(["deface", str(sample_head_path()), str(out), "--quiet"] + filled) == 2, why
    assert not out.exists() and not (tmp_path / "out_before_after.png").exists()


def test_cli_deface_refuses_to_overwrite_its_input_and_unknown_methods(tmp_path):
    import shutil

    from AnonMRILib.cli.main import main
    from AnonMRILib.sample_data import sample_head_path

    copy = tmp_path / "head.nii.gz"
    shutil.copy(sample_head_path(), copy)
    before = copy.read_bytes()
    assert main(["deface", str(copy), str(copy), "--method", "black", "--quiet"]) == 2
    assert copy.read_bytes() == before
    with pytest.raises(SystemExit) as exit_info:
        main(["deface", str(copy), str(tmp_path / "o.nii.gz"), "--method", "scramble"])
    assert exit_info.value.code == 2


def test_deface_registration_is_reproducible_for_a_seed(sample):
    from AnonMRILib.pipelines.removal.template_deface import DefaceConfig, template_face_mask

    head, _ = sample
    quick = DefaceConfig(iterations=15, shrink_factors=(4,), smoothing_sigmas=(2.0,), sampling_fraction=0.02)
    first = template_face_mask(head, quick, seed=0)
    again = template_face_mask(head, quick, seed=0)
    assert first.any() and np.array_equal(first, again)
