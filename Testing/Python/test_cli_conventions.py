"""Nothing silent at scale: implausible inputs exit 2 with one line and no output; every command is
all-or-nothing, creates its output folders, takes --quiet anywhere and can write BIDS sidecar keys."""
import json

import nibabel as nib
import numpy as np
import pytest

from AnonMRILib.cli.main import main
from AnonMRILib.io import Volume, load_volume, save_volume
from AnonMRILib.sample_data import sample_brain_mask_path, sample_head_path


@pytest.fixture(scope="module")
def sample():
    return load_volume(sample_head_path()), load_volume(sample_brain_mask_path())


def gaussian_noise(tmp_path):
    noise = Volume(np.random.default_rng(0).normal(100.0, 20.0, (96, 96, 96)).astype(np.float32), np.eye(4))
    return save_volume(noise, tmp_path / "noise.nii.gz")


def refused(capsys, argv, *outputs, message=""):
    """``anonmri argv`` exits 2 with one stderr line (containing ``message``) and writes none of ``outputs``."""
    capsys.readouterr()
    status = main(argv)
    error = capsys.readouterr().err
    lines = error.strip().splitlines()
    folder = outputs[0].parent if outputs else None
    left = [p.name for p in folder.iterdir() if p.name.startswith(".anonmri")] if folder and folder.exists() else []
    return (status == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in error
            and not any(p.exists() for p in outputs) and not left)


def test_noise_is_neither_remodeled_nor_defaced(tmp_path, capsys):
    noise = gaussian_noise(tmp_path)
    out = tmp_path / "out.nii.gz"
    assert refused(capsys, ["remodel", str(noise), str(out), "--device", "cpu", "--quiet"], out,
                   message="no solid head")
    assert refused(capsys, ["deface", str(noise), str(out), "--method", "quickshear", "--quiet"], out,
                   tmp_path / "out_before_after.png", message="no solid head")


def test_contrast_inverted_head_is_refused_before_any_output(tmp_path, capsys, sample):
    head, _ = sample
    inverted = save_volume(head.with_array(head.array.max() - head.array), tmp_path / "inverted.nii.gz")
    out = tmp_path / "out.nii.gz"
    assert refused(capsys, ["deface", str(inverted), str(out), "--method", "quickshear", "--quiet"], out,
                   tmp_path / "out_before_after.png", message="contrast-inverted")
    # the user who knows better: the checks are skipped and the command runs
    assert main(["deface", str(inverted), str(out), "--method", "black", "--brain-mask",
                 str(sample_brain_mask_path()), "--no-before-after", "--skip-plausibility-checks", "--quiet"]) == 0
    assert out.is_file()


def test_lesion_mask_covering_the_head_and_absurd_voxels_are_refused(tmp_path, capsys, sample):
    head, brain = sample
    whole = save_volume(head.with_array(np.ones(head.shape, np.uint8)), tmp_path / "whole.nii.gz")
    out = tmp_path / "out.nii.gz"
    assert refused(capsys, ["lesion", str(sample_head_path()), str(whole), str(out), "--quiet"], out,
                   message="lesion mask covers")
    # 1e-9 mm voxels (a broken header): refused when read; 1e-3 mm: refused by the voxel-size check
    lesion = np.zeros(head.shape, np.uint8)
    lesion[60:70, 90:100, 100:110] = 1
    for size, message in ((1e-9, "nearly) zero"), (1e-3, "voxel size")):
        image = tmp_path / f"tiny_{size:g}.nii.gz"
        mask = tmp_path / f"tiny_mask_{size:g}.nii.gz"
        affine = np.diag([size, size, size, 1.0])
        nib.save(nib.Nifti1Image(head.array, affine), str(image))
        nib.save(nib.Nifti1Image(lesion, affine), str(mask))
        assert refused(capsys, ["lesion", str(image), str(mask), str(out), "--quiet"], out, message=message), size
    assert refused(capsys, ["brainmask", str(tmp_path / "tiny_0.001.nii.gz"), str(out), "--quiet"], out,
                   message="voxel size")


def test_implausible_brain_mask_is_refused(tmp_path, capsys, sample):
    head, brain = sample
    slab = np.zeros(head.shape, np.uint8)
    slab[20:30] = 1
    mask = save_volume(head.with_array(slab), tmp_path / "slab.nii.gz")
    out = tmp_path / "out.nii.gz"
    assert refused(capsys, ["deface", str(sample_head_path()), str(out), "--method", "black", "--brain-mask",
                            str(mask), "--quiet"], out, message="brain mask")


def test_deface_writes_nothing_when_the_figure_fails(tmp_path, capsys, monkeypatch):
    import AnonMRILib.rendering as rendering

    def broken(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(rendering, "render_face", broken)
    out = tmp_path / "deeper" / "out.nii.gz"
    assert main(["deface", str(sample_head_path()), str(out), "--method", "black", "--brain-mask",
                 str(sample_brain_mask_path()), "--quiet"]) == 2
    assert not (tmp_path / "deeper").exists()  # neither the volume nor the folder made for it


def test_quiet_anywhere_output_folders_created_and_bids_sidecar(tmp_path, capsys, sample):
    head, brain = sample
    source = tmp_path / "in" / "sub-01_T1w.nii.gz"
    source.parent.mkdir()
    source.write_bytes(sample_head_path().read_bytes())
    (tmp_path / "in" / "sub-01_T1w.json").write_text(json.dumps(
        {"RepetitionTime": 2.3, "InstitutionName": "St Elsewhere", "AcquisitionDateTime": "2020-01-01T10:00:00"}))
    out = tmp_path / "new" / "folder" / "sub-01_T1w.nii.gz"
    capsys.readouterr()
    assert main(["--quiet", "deface", str(source), str(out), "--method", "black", "--brain-mask",
                 str(sample_brain_mask_path()), "--bids-sidecar"]) == 0
    assert capsys.readouterr().out == ""
    sidecar = json.loads((out.parent / "sub-01_T1w.json").read_text())
    assert sidecar["RepetitionTime"] == 2.3 and "InstitutionName" not in sidecar
    assert "AcquisitionDateTime" not in sidecar and "black" in sidecar["DeidentificationMethod"]
    codes = [item["CodeValue"] for item in sidecar["DeidentificationMethodCodeSequence"]]
    assert codes == ["113100", "113102"]
    assert (out.parent / "sub-01_T1w_before_after.png").is_file()
    written = load_volume(out)
    assert np.array_equal(written.array[brain.array != 0], head.array[brain.array != 0])
    assert main(["deface", str(source), str(tmp_path / "o2.nii.gz"), "--method", "black", "--brain-mask",
                 str(sample_brain_mask_path()), "--no-before-after", "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def test_every_command_takes_quiet_after_the_command(tmp_path, capsys):
    """``anonmri --help`` promises ``--quiet`` after the command too: every sub-command parses it, and
    ``render`` then prints nothing."""
    import argparse

    from AnonMRILib.cli.main import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = [name for name, sub in commands.items() if "--quiet" not in sub._option_string_actions]
    assert not missing, f"commands without --quiet: {missing}"
    capsys.readouterr()
    out = tmp_path / "face.png"
    assert main(["render", str(sample_head_path()), str(out), "--size", "48", "--quiet"]) == 0
    assert out.is_file() and capsys.readouterr().out == ""
    assert main(["info", str(sample_head_path()), "--quiet"]) == 0 and "shape" in capsys.readouterr().out
