"""Scores in the Slicer module (slicer-core): one verdict per scan (the open face recognizer's), first in
the table and in the status line, word for word as ``scan_scores`` says it, the outline residual next;
a wrong brain mask flagged; DICOM export through the library's writer."""
import functools
import os
import sys

import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRIModuleLib import core, jobs, mrml
from slicer_helpers import require_slicer_core, rotated_affine, synthetic_head

slicer = require_slicer_core()  # skips this module without slicer-core

VERDICT_STARTS = ("recognisable", "not recognisable", "not anonymized", "not assessed", "re-identifiable")


@pytest.fixture
def head_nodes(scene):
    head, brain = synthetic_head(affine=rotated_affine(spacing=(3.0, 3.0, 3.0)))
    head_node = mrml.add_volume_node(scene, head, "sub-07 T1w")
    brain_node = mrml.add_volume_node(scene, brain, "sub-07 brain", labelmap=True)
    out = mrml.add_volume_node(scene, head.with_array(np.where(brain.array > 0, head.array, 0).astype(head.dtype)),
                               "anonymized")
    return head_node, brain_node, out


def _evidence(anonymized_by_psnr: bool, siamese_rank: int, recognizer_identified: bool):
    """Evidence shaped like scan_scores' (every section, the real keys), before the verdict."""
    return {
        "notes": ["reference heads are generated from a few real heads, not a population of real people: "
                  "anonymity and rank are indicative"],
        "brain": {"voxels": 412345, "mask": "given", "preserved_fraction": 1.0, "max_abs_change": 0.0,
                  "mask_check": {"plausible": True, "volume_ml": 1391.2, "fraction_of_head": 0.31}},
        "face_region": {"voxels": 98765, "data_range": 812.0, "definition": "head, > 3 mm from the brain, ...",
                        "psnr_db": 17.3, "ssim": 0.41, "changed_fraction": 0.93},
        "anonymity": {"score_db": -0.4 if anonymized_by_psnr else 2.1, "median_score_db": 0.7, "threshold_db": 0.0,
                      "anonymized": anonymized_by_psnr, "nearest_reference": 4, "n_references": 20,
                      "reference_set": "reference_faces.npz"},
        "attacker": {"rank": siamese_rank, "n_candidates": 21, "relative_rank": siamese_rank / 20,
                     "identified": siamese_rank == 0, "distance_to_original": 0.8, "nearest_reference_distance": 1.1},
        "open_recognizer": {"face_found_in_original": True, "face_found_in_anonymized": True,
                            "detector_score_anonymized": 0.9, "same_person_threshold": 0.3,
                            "identified": recognizer_identified, "distance_to_original": 0.36, "n_references": 20,
                            "references_left_out_as_same_person": 1, "nearest_reference_distance": 0.41,
                            "rank": 0 if recognizer_identified else 6},
        "hull_control": {"rank": siamese_rank, "n_candidates": 21, "relative_rank": siamese_rank / 20,
                         "identified": siamese_rank == 0, "distance_to_original": 0.9,
                         "nearest_reference_distance": 1.1, "method": "REFACE of the original"},
    }


def _fake_scan_scores(evidence):
    """A stand-in for scan_scores with its signature whose result leads with the library's own verdict
    and residual."""
    from AnonMRILib.evaluation.scores import residual, verdict

    def scan_scores(original, anonymized, brain_mask=None, reference_renderings=None, attacker_weights=None,
                    config=None, progress=None):
        text, explanations = verdict(evidence)
        return {"verdict": text, "residual": residual(evidence), "explanations": explanations, **evidence}

    return scan_scores


def _scores_through_the_worker(logic, head_node, out, brain_node, tmp_path):
    """What the panel does: prepareScores, the worker entry, its JSON result file, back in the GUI process."""
    from AnonMRILib.worker import read_outputs, write_outputs

    request = logic.prepareScores(head_node, out, brain_node, device="cpu")
    result = jobs.scores(*jobs.scores_job(request)[1:])
    folder = tmp_path / "job"
    folder.mkdir(parents=True)
    return read_outputs(folder, write_outputs(folder, result))["scores"]


def _rows(table_node):
    table = table_node.GetTable()
    texts = table.GetColumnByName("Text")
    return [(table.GetValue(row, 0).ToString(), texts.GetValue(row) if texts is not None else "")
            for row in range(table.GetNumberOfRows())]


def test_the_scores_table_leads_with_the_verdict_and_its_explanations_word_for_word(scene, head_nodes, tmp_path,
                                                                                     monkeypatch):
    head_node, brain_node, out = head_nodes
    evidence = _evidence(anonymized_by_psnr=False, siamese_rank=5, recognizer_identified=False)
    fake = _fake_scan_scores(evidence)
    expected = fake(None, None)
    monkeypatch.setattr(core, "library_function", lambda operation: fake)
    logic = core.AnonMRILogicCore(scene)
    flat = _scores_through_the_worker(logic, head_node, out, brain_node, tmp_path)
    table = logic.scoresTable(flat)
    rows = _rows(table)
    assert rows[0] == ("Verdict", expected["verdict"])
    assert expected["verdict"].startswith("not recognisable: the open face recognizer (dlib) puts 6 of 20")
    assert rows[1] == ("Residual", expected["residual"]) and "Siamese" in rows[1][1]
    explanations = expected["explanations"]
    assert explanations and rows[2:2 + len(explanations)] == [
        (f"Explanation {n}", text) for n, text in enumerate(explanations, start=1)]
    # then the evidence rows, in scan_scores' order, under their flattened names
    evidence_rows = [name for name, _ in rows[2 + len(explanations):]]
    assert evidence_rows == [name for name, _ in mrml.flatten_scores(evidence)]
    assert evidence_rows[0] == "notes.1" and "anonymity.anonymized" in evidence_rows
    shown = mrml.scores_from_table_node(table)
    assert shown["face_region.psnr_db"] == 17.3 and shown["attacker.rank"] == 5.0
    # the status line: the verdict, from the dict or from the table
    assert logic.scoresSummary(flat) == "Verdict: " + expected["verdict"]
    assert logic.scoresSummary(table) == logic.scoresSummary(flat)
    # the console path (nested dict) gives the same table; a table read back and shown again too
    nested = logic.scoresTable(logic.scores(head_node, out, brain_node))
    assert _rows(nested) == rows
    again = logic.scoresTable(shown)
    assert _rows(again) == rows


def test_a_siamese_match_is_the_residual_row_not_the_verdict(scene, head_nodes, tmp_path, monkeypatch):
    """The open recognizer does not find the original, the Siamese attacker does (for the scan and for a
    template face on its hull alike): one verdict row says not recognisable, the residual row says
    what the Siamese attacker matched, and nothing in the table says re-identifiable."""
    head_node, brain_node, out = head_nodes
    fake = _fake_scan_scores(_evidence(anonymized_by_psnr=True, siamese_rank=0, recognizer_identified=False))
    monkeypatch.setattr(core, "library_function", lambda operation: fake)
    logic = core.AnonMRILogicCore(scene)
    flat = _scores_through_the_worker(logic, head_node, out, brain_node, tmp_path)
    assert flat["attacker.identified"] == 1.0 and flat["hull_control.identified"] == 1.0  # the Siamese evidence
    rows = _rows(logic.scoresTable(flat))
    name, verdict = rows[0]
    assert name == "Verdict" and verdict == fake(None, None)["verdict"]
    assert verdict.startswith("not recognisable: the open face recognizer (dlib) puts 6 of 20 reference heads")
    verdict_lines = [(row, text) for row, text in rows if text.startswith(VERDICT_STARTS)]
    assert verdict_lines == [("Verdict", verdict)]  # one verdict, no second line saying "re-identifiable"
    assert rows[1][0] == "Residual" and rows[1][1].startswith("outline residual")
    assert rows[1][1].endswith("so it cannot tell this head from the same scan's hull")
    assert not [row for row, _ in rows if row.startswith("Explanation ")]  # PSNR and recognizer agree
    summary = logic.scoresSummary(flat)
    assert summary == "Verdict: " + verdict and "re-identifiable" not in summary


def test_a_whole_head_given_as_the_brain_is_flagged_in_the_verdict_row_and_the_status(scene, tmp_path, monkeypatch):
    """The library's plausibility check of the given mask (a record in scan_scores, not an error) reaches
    the table's first row and the status line; the anonymization path refuses the same mask."""
    from AnonMRILib.evaluation.scores import scan_scores
    from AnonMRILib.sample_data import load_sample_head
    from AnonMRILib.transforms.head_mask import head_mask_array

    if core.plausibility_checker() is None:
        pytest.skip("this AnonMRILib has no transforms.plausibility.check_brain_mask")
    head = load_sample_head()
    head_node = mrml.add_volume_node(scene, head, "sample")
    whole_head = mrml.add_volume_node(scene, head.with_array(head_mask_array(head.array).astype(np.uint8)),
                                      "head", labelmap=True)
    logic = core.AnonMRILogicCore(scene)
    with pytest.raises(InputError, match="Check brain mask"):  # what Apply says with this mask
        logic.deface(head_node, "black", whole_head)
    blurred = logic.deface(head_node, "black", whole_head, checkBrainMask=False)  # the user insisted
    fast = functools.partial(scan_scores, reference_renderings=False)  # no renderings: seconds
    monkeypatch.setattr(core, "library_function", lambda operation: fast)
    flat = _scores_through_the_worker(logic, head_node, blurred, whole_head, tmp_path)
    table = logic.scoresTable(flat)
    name, verdict = _rows(table)[0]
    assert name == "Verdict" and "WARNING: the brain mask is implausible" in verdict
    shown = mrml.scores_from_table_node(table)
    assert shown["brain.mask_check.plausible"] == 0.0 and shown["brain.mask_check.reason"] in verdict
    assert "mL" in shown["brain.mask_check.reason"]
    summary = logic.scoresSummary(table)
    assert summary == "Verdict: " + verdict and "brain mask is implausible" in summary
    # with the right mask there is no warning
    good = mrml.add_volume_node(scene, _sample_brain(), "brain", labelmap=True)
    fine = logic.scoresTable(_scores_through_the_worker(logic, head_node, blurred, good, tmp_path / "good"))
    assert "implausible" not in _rows(fine)[0][1] and mrml.scores_from_table_node(fine)["brain.mask_check.plausible"]


def _sample_brain():
    from AnonMRILib.sample_data import load_sample_brain_mask

    return load_sample_brain_mask()


def test_scores_without_a_verdict_still_fill_a_table_and_say_so(scene):
    logic = core.AnonMRILogicCore(scene)
    table = logic.scoresTable({"face.changed_fraction": 0.5, "notes": ["a", "b"]})
    assert [name for name, _ in _rows(table)] == ["face.changed_fraction", "notes.1", "notes.2"]
    assert "no verdict" in logic.scoresSummary(table)


# --- DICOM export through the library's writer ------------------------------------------------------
def test_dicom_writers_name_the_library_writer():
    """Every (module, function, config) of DICOM_WRITERS exists in AnonMRILib.io.dicom_writer, with the
    signature export_dicom calls."""
    import importlib
    import inspect

    from AnonMRILib.io import dicom_writer

    assert core.DICOM_WRITERS[0][0] == "AnonMRILib.io.dicom_writer"
    for module_name, function_name, config_name in core.DICOM_WRITERS:
        module = importlib.import_module(module_name)
        function = getattr(module, function_name)
        assert callable(function) and callable(getattr(module, config_name))
        assert list(inspect.signature(function).parameters)[:4] == ["volume", "source_folder", "out_folder", "config"]
    assert core.dicom_writer(require_packages=False) is dicom_writer.write_dicom_series
    assert "method" in inspect.signature(dicom_writer.DicomDeidentificationConfig).parameters
    available = not core.missing_dicom_requirements()
    assert (core.DICOM_FORMAT in core.export_formats()) == available


@pytest.fixture
def dicom_original(scene, tmp_path):
    """A small MR series of the sample head (7.5 mm voxels, patient values planted), loaded the way
    Slicer's DICOM module leaves it: a volume node with DICOM.instanceUIDs, under a parent transform."""
    import vtk

    pydicom = pytest.importorskip("pydicom")
    pytest.importorskip("dicomanonymizer")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "Python"))
    try:
        from dicom_fixtures import small_sample, write_planted_series
    finally:
        sys.path.pop(0)
    from AnonMRILib.io import load_volume

    head, brain = small_sample(step=5)
    folder = tmp_path / "database"
    tokens = write_planted_series(head, folder, plant_profile=False)
    files = {str(pydicom.dcmread(str(path), stop_before_pixels=True).SOPInstanceUID): str(path)
             for path in sorted(folder.iterdir())}
    loaded = load_volume(folder)
    head_node = mrml.add_volume_node(scene, loaded, "MUSTERMANN^ERIKA T1")
    head_node.SetAttribute(core.DICOM_INSTANCE_UIDS_ATTRIBUTE, " ".join(files))
    transform = scene.AddNewNodeByClass("vtkMRMLLinearTransformNode")
    matrix = vtk.vtkMatrix4x4()
    matrix.SetElement(0, 3, 12.0)
    transform.SetMatrixTransformToParent(matrix)
    head_node.SetAndObserveTransformNodeID(transform.GetID())
    brain_node = mrml.add_volume_node(scene, brain.with_array(brain.array), "brain", labelmap=True)
    brain_node.SetAndObserveTransformNodeID(transform.GetID())
    return head_node, brain_node, files, tokens, loaded


def test_dicom_export_writes_the_anonymized_voxels_into_a_deidentified_copy_of_the_series(scene, dicom_original,
                                                                                          tmp_path):
    import pydicom

    from AnonMRILib.io import load_volume

    head_node, brain_node, files, tokens, loaded = dicom_original
    logic = core.AnonMRILogicCore(scene)
    output = logic.deface(head_node, "black", brain_node, checkBrainMask=False)
    assert output.GetAttribute(core.METHOD_ATTRIBUTE) == "black"
    assert output.GetAttribute(core.MADE_FROM_ATTRIBUTE) == head_node.GetID()
    out = tmp_path / "export"
    written = logic.exportAnonymized(output, str(out), fileForInstance=files.get)
    assert written == str(out) and len(os.listdir(out)) == len(files)
    back = load_volume(out)
    np.testing.assert_allclose(back.affine, loaded.affine, atol=1e-3)  # the series' frame, not the transform's
    np.testing.assert_array_equal(back.array, mrml.volume_from_node(output, world=False).array)
    assert not np.array_equal(back.array, loaded.array)
    for path in out.iterdir():
        data = path.read_bytes()
        assert not [token for token in tokens if token.encode() in data], path.name
        dataset = pydicom.dcmread(str(path), stop_before_pixels=True)
        assert dataset.PatientIdentityRemoved == "YES" and str(dataset.PatientName).startswith("ANON-")
        assert "black" in dataset.DeidentificationMethod[0]
    # into a folder that is not empty: a new subfolder named like the node
    again = logic.exportAnonymized(output, str(out), fileForInstance=files.get)
    assert again == os.path.join(str(out), "Anonymized_1_black") and len(os.listdir(again)) == len(files)
    # image files are unchanged: voxels and world geometry only
    nifti = logic.exportAnonymized(output, str(tmp_path / "export.nii.gz"))
    np.testing.assert_array_equal(load_volume(nifti).array, mrml.volume_from_node(output).array)


def test_dicom_export_needs_an_original_loaded_from_dicom(scene, dicom_original, tmp_path):
    head_node, brain_node, files, _tokens, _loaded = dicom_original
    logic = core.AnonMRILogicCore(scene)
    output = logic.deface(head_node, "black", brain_node, checkBrainMask=False)
    head_node.RemoveAttribute(core.DICOM_INSTANCE_UIDS_ATTRIBUTE)
    with pytest.raises(InputError, match="not loaded from DICOM"):
        logic.exportAnonymized(output, str(tmp_path / "a"), fileForInstance=files.get)
    head_node.SetAttribute(core.DICOM_INSTANCE_UIDS_ATTRIBUTE, " ".join(files))
    with pytest.raises(InputError, match="no longer in Slicer's DICOM database"):
        logic.exportAnonymized(output, str(tmp_path / "b"), fileForInstance=lambda uid: "")
    with pytest.raises(InputError, match="DICOM database"):  # slicer-core has no slicer.dicomDatabase
        logic.exportAnonymized(output, str(tmp_path / "c"))
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c"))
