"""Every command: bad input gives one clear line on stderr, exit status 2, no traceback, no output."""
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest

from AnonMRILib.cli.main import main
from AnonMRILib.io import save_volume

from synthetic_volumes import synthetic_head

#: command -> (argument list builder (input, output), output suffix)
IMAGE_COMMANDS = {
    "brainmask": (lambda src, out: ["brainmask", str(src), str(out)], ".nii.gz"),
    "deface": (lambda src, out: ["deface", str(src), str(out), "--method", "black"], ".nii.gz"),
    "render": (lambda src, out: ["render", str(src), str(out)], ".png"),
    "remodel": (lambda src, out: ["remodel", str(src), str(out), "--device", "cpu"], ".nii.gz"),
    "privacy-transform": (lambda src, out: ["privacy-transform", str(src), str(out)], "_dir"),
    "score": (lambda src, out: ["score", str(src), str(src), "--json"], ".none"),
}
#: commands that accept --brain-mask
MASK_COMMANDS = {name: IMAGE_COMMANDS[name] for name in ("deface", "remodel", "privacy-transform", "score")}


def command_line(table, command, source, out_dir):
    build, suffix = table[command]
    out = out_dir / f"out_{command}{suffix}"
    if suffix == "_dir":  # commands writing into an existing folder
        out.mkdir(exist_ok=True)
    return build(source, out), out


def nothing_written(out):
    return not out.exists() or (out.is_dir() and not any(out.iterdir()))


def bad_inputs(tmp_path):
    head = synthetic_head()
    cases = {}
    (tmp_path / "notes.txt").write_text("not an image")
    cases["not an image"] = (tmp_path / "notes.txt", "not a supported image")
    (tmp_path / "broken.nii.gz").write_bytes(b"\x1f\x8b garbage")
    cases["corrupt file"] = (tmp_path / "broken.nii.gz", "cannot be read")
    nib.save(nib.Nifti1Image(np.ones((20, 20), np.int16), np.eye(4)), tmp_path / "flat.nii.gz")
    cases["2-D"] = (tmp_path / "flat.nii.gz", "2-D")
    nib.save(nib.Nifti1Image(np.stack([head.array] * 2, -1), head.affine), tmp_path / "series.nii.gz")
    cases["4-D"] = (tmp_path / "series.nii.gz", "2 volumes")
    values = head.array.astype(np.float32)
    values[3, 4, 5] = np.nan
    save_volume(head.with_array(values), tmp_path / "nan.nii.gz")
    cases["NaN"] = (tmp_path / "nan.nii.gz", "NaN")
    values[3, 4, 5] = np.inf
    save_volume(head.with_array(values), tmp_path / "inf.nii.gz")
    cases["Inf"] = (tmp_path / "inf.nii.gz", "infinite")
    save_volume(head.with_array(np.zeros(head.shape, np.int16)), tmp_path / "zero.nii.gz")
    cases["all zero"] = (tmp_path / "zero.nii.gz", "constant")
    cases["missing"] = (tmp_path / "absent.nii.gz", "no such file")
    return cases


@pytest.mark.parametrize("command", sorted(IMAGE_COMMANDS))
def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys, command):
    for label, (source, message) in bad_inputs(tmp_path).items():
        argv, out = command_line(IMAGE_COMMANDS, command, source, tmp_path)
        status = main(argv)
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert status == 2, label
        assert len(lines) == 1 and "error" in lines[0] and message in lines[0], (label, captured.err)
        assert "Traceback" not in captured.err
        assert nothing_written(out), label


@pytest.mark.parametrize("command", sorted(c for c in IMAGE_COMMANDS if IMAGE_COMMANDS[c][1] == ".nii.gz"))
def test_output_equal_to_input_is_refused_and_input_untouched(tmp_path, capsys, command):
    source = save_volume(synthetic_head(), tmp_path / "head.nii.gz")
    before = source.read_bytes()
    argv, _ = command_line(IMAGE_COMMANDS, command, source, tmp_path)
    argv[argv.index(str(tmp_path / f"out_{command}{IMAGE_COMMANDS[command][1]}"))] = str(source)
    assert main(argv) == 2
    assert "overwrite the input" in capsys.readouterr().err
    assert source.read_bytes() == before


@pytest.mark.parametrize("command", sorted(MASK_COMMANDS))
def test_mask_on_another_grid_is_refused(tmp_path, capsys, command):
    head = synthetic_head(spacing=(3.0, 2.4, 2.8))  # a head of plausible size (545 mL) for the plausibility checks
    source = save_volume(head, tmp_path / "head.nii.gz")
    other = synthetic_head(shape=(30, 30, 30), spacing=(3.0, 2.4, 2.8))
    mask = save_volume(other.with_array((other.array > 450).astype(np.uint8)), tmp_path / "mask.nii.gz")
    argv, out = command_line(MASK_COMMANDS, command, source, tmp_path)
    assert main(argv + ["--brain-mask", str(mask)]) == 2
    error = capsys.readouterr().err
    assert "grid" in error or "shape" in error
    assert nothing_written(out)


def test_real_entry_point_prints_no_traceback(tmp_path):
    (tmp_path / "notes.txt").write_text("not an image")
    result = subprocess.run([sys.executable, "-m", "AnonMRILib", "info", str(tmp_path / "notes.txt")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_lesion_command_refuses_bad_image_and_mask_on_another_grid(tmp_path, capsys):
    head = synthetic_head(spacing=(3.0, 2.4, 2.8))  # a head of plausible size (545 mL) for the plausibility checks
    source = save_volume(head, tmp_path / "head.nii.gz")
    lesion = head.with_array((head.array > 800).astype(np.uint8))
    lesion_path = save_volume(lesion, tmp_path / "lesion.nii.gz")
    other = synthetic_head(shape=(30, 30, 30), spacing=(3.0, 2.4, 2.8))
    wrong = save_volume(other.with_array((other.array > 450).astype(np.uint8)), tmp_path / "wrong.nii.gz")
    out = tmp_path / "out.nii.gz"
    for label, (bad_source, message) in bad_inputs(tmp_path).items():
        assert main(["lesion", str(bad_source), str(lesion_path), str(out)]) == 2, label
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and message in error, (label, error)
    assert main(["lesion", str(source), str(wrong), str(out)]) == 2
    error = capsys.readouterr().err
    assert "grid" in error or "shape" in error
    assert main(["lesion", str(source), str(lesion_path), str(source)]) == 2
    assert "overwrite the input" in capsys.readouterr().err
    assert not out.exists()
