"""``anonmri demo``: its first steps (sample, brain mask, check) write their files and a JSON report."""
import json

import numpy as np
import pytest

from AnonMRILib.cli.main import main
from AnonMRILib.io import load_volume
from AnonMRILib.sample_data import load_sample_head


#: the demo steps this file covers (later features add steps with their own tests)
BRAIN_MASK_STEPS = ("sample", "brain_mask", "brain_mask_check")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    from AnonMRILib.cli.demo import DEMO_STEPS, run_demo

    names = [name for name, _ in DEMO_STEPS]
    assert names[:3] == list(BRAIN_MASK_STEPS)  # the demo starts with the sample and its brain mask
    out = tmp_path_factory.mktemp("demo") / "anonmri-demo"
    run_demo(out, quiet=True, steps=[step for step in DEMO_STEPS if step[0] in BRAIN_MASK_STEPS])
    return out


def test_demo_writes_every_listed_file(demo_dir):
    report = json.loads((demo_dir / "demo_report.json").read_text())
    assert report["files"][-1] == "demo_report.json"
    for name in report["files"]:
        assert (demo_dir / name).is_file(), name
    assert set(report["step_seconds"]) == set(BRAIN_MASK_STEPS)


def test_demo_head_is_the_sample_and_mask_is_on_its_grid(demo_dir):
    head = load_volume(demo_dir / "sample_head_T1w.nii.gz")
    sample = load_sample_head()
    assert head.dtype == sample.dtype and np.array_equal(head.array, sample.array)
    mask = load_volume(demo_dir / "brain_mask.nii.gz")
    assert mask.dtype == np.uint8 and mask.same_grid(sample)


def test_demo_report_has_brain_mask_figures(demo_dir):
    report = json.loads((demo_dir / "demo_report.json").read_text())
    figures = report["brain_mask"]
    assert figures["backend"] == "hdbet"
    assert figures["dice_vs_shipped_robex_mask"] >= 0.93
    assert figures["seconds"] > 0 and 1000 < figures["volume_ml"] < 1900


def test_demo_out_that_is_a_file_exits_2(tmp_path, capsys):
    target = tmp_path / "a_file"
    target.write_text("x")
    assert main(["demo", "--out", str(target), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a folder" in err[0]
