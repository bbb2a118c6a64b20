"""Training/evaluate_faces.py: a calibration-only run (no method) reports the reference heads'
distances to the training heads (template kinship)."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "Training"))


def test_reference_heads_are_measured_against_the_training_heads(tmp_path):
    pytest.importorskip("dlib")
    import evaluate_faces
    from AnonMRILib.sample_data import sample_head_path

    from AnonMRILib.io import save_volume
    from AnonMRILib.transforms.anatomical_prior import render_template_head

    template = str(tmp_path / "template_T1w.nii.gz")
    save_volume(render_template_head(), template)
    sample = str(sample_head_path())
    code = evaluate_faces.main(["--out", str(tmp_path), "--size", "192", "--head", "sample",
                                "--reference-head", f"same={sample}", "--reference-head", f"template={template}",
                                "--training-head", f"trained={sample}"])
    assert code == 0
    summary = json.loads((tmp_path / "faces.json").read_text())
    assert summary["outputs"] == []
    assert summary["distance_between_originals"]["sample"]["sample"] == 0.0
    distances = summary["reference_to_training_heads"]
    assert distances["same"]["trained"] == pytest.approx(0.0, abs=1e-6)  # the same head, the same renderings
    assert distances["template"]["trained"] > 0.45  # the template is not the sample's person
    table = (tmp_path / "faces.md").read_text()
    assert "Distances of the reference heads to the training heads:" in table and "| template | " in table
