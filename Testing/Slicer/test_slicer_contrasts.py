"""Several co-registered contrasts of one patient through the lesion method of the module (real MRML
nodes): one output node per input, one anatomy, the lesion kept bit for bit in each, neutral names,
the inputs' grids, clear errors for bad input; through the console logic and the worker process.

The donor prior's learned variation is off (``variationStrength=0``): its prior-conditioned weights are
not shipped yet, and with exact lesion voxels and no variation no network runs, which keeps these fast.
"""
import json
import os

import numpy as np
import pytest

from AnonMRILib.errors import InputError
from AnonMRILib.io.volume import Volume
from AnonMRIModuleLib import core, jobs, mrml
from AnonMRIModuleLib.tasks import DONE, ProcessTask
from slicer_helpers import brain_contrasts, require_slicer_core

slicer = require_slicer_core()  # skips this module without slicer-core

#: input node names carrying patient data (and the contrast, as BraTS file names do)
PATIENT = "MUSTERMANN^ERIKA 19640812"
SECRETS = ("MUSTERMANN", "ERIKA", "19640812")


@pytest.fixture(scope="module")
def case():
    return brain_contrasts()


@pytest.fixture
def contrast_nodes(scene, case):
    """T1, T2 and a third contrast without a contrast in its name (a T1-like copy) under one transform,
    the lesion and the brain mask as labelmaps."""
    t1, t2, lesion, brain, _ = case
    transform = scene.AddNewNodeByClass("vtkMRMLLinearTransformNode", "registration")
    shift = np.eye(4)
    shift[:3, 3] = [4.0, -2.0, 1.5]
    transform.SetMatrixTransformToParent(mrml.array_to_matrix(shift))
    third = t1.with_array(np.where(brain, np.asarray(t1.array) // 2 + 40, 0).astype(np.int16))
    nodes = [mrml.add_volume_node(scene, volume, name, parent_transform_node=transform)
             for volume, name in ((t1, f"{PATIENT}_t1"), (t2, f"{PATIENT}_t2"), (third, f"{PATIENT} series 7"))]
    lesion_node = mrml.add_volume_node(scene, lesion, f"{PATIENT} seg", labelmap=True, parent_transform_node=transform)
    brain_node = mrml.add_volume_node(scene, t1.with_array(brain.astype(np.uint8)), f"{PATIENT} brain", labelmap=True,
                                      parent_transform_node=transform)
    return nodes, lesion_node, brain_node, transform


def _output_brain(outputs, brain, lesion):
    """Non-lesion voxels of the input's brain where every output has brain (the donor's outline can differ)."""
    region = brain & ~lesion
    for output in outputs:
        region &= np.asarray(output.array) > 0
    return region


def test_several_contrasts_through_the_console_logic_share_one_anatomy_with_one_neutral_node_each(
        scene, case, contrast_nodes):
    t1, t2, lesion_volume, brain, lesion = case
    nodes, lesion_node, brain_node, transform = contrast_nodes
    logic = core.AnonMRILogicCore(scene)
    # a skull-stripped input: its brain mask is the whole image, which the plausibility check refuses
    outputs = logic.anonymizeLesions(nodes[0], lesion_node, brain_node, device="cpu", seed=1, exactLesion=True,
                                     variationStrength=0.0, otherVolumeNodes=nodes[1:], checkBrainMask=False)
    # contrasts from the node names (as the CLI does from file names); the third has none: auto
    assert [node.GetName() for node in outputs] == [
        "Anonymized 1 (lesion-preserving, T1w)", "Anonymized 2 (lesion-preserving, T2w)",
        "Anonymized 3 (lesion-preserving, contrast 3)"]
    sh = slicer.vtkMRMLSubjectHierarchyNode.GetSubjectHierarchyNode(scene)
    results = []
    for output, source in zip(outputs, nodes):
        texts = [output.GetName(), output.GetStorageNode().GetFileName()] + [
            output.GetAttribute(name) or "" for name in output.GetAttributeNames()]
        assert not any(secret in text for secret in SECRETS for text in texts), texts
        assert sh.GetItemName(sh.GetItemParent(sh.GetItemByDataNode(output))) == core.RESULTS_FOLDER
        assert output.GetAttribute(core.ROLE_ATTRIBUTE) == core.ANONYMIZED_ROLE
        assert logic.inputOf(output) is source  # each output's own contrast (compare, scores, DICOM export)
        assert output.GetParentTransformNode() is transform
        result, original = mrml.volume_from_node(output), mrml.volume_from_node(source)
        assert result.same_grid(original) and result.dtype == original.dtype  # the input's grid
        np.testing.assert_allclose(result.affine, t1.affine, atol=1e-6)
        np.testing.assert_allclose(mrml.volume_from_node(output, world=False).affine,
                                   mrml.volume_from_node(source, world=False).affine, atol=1e-9)
        np.testing.assert_array_equal(result.array[lesion], original.array[lesion])  # exact lesion
        assert (result.array != original.array)[brain & ~lesion].mean() > 0.5  # the anatomy was regenerated
        results.append(result)
    # one anatomy: CSF dark in the T1 output is bright in the T2 output; the T1-like third follows the T1
    region = _output_brain(results, brain, lesion)
    assert region.sum() > 0.8 * (brain & ~lesion).sum()
    assert np.corrcoef(results[0].array[region], results[1].array[region])[0, 1] < -0.4
    assert np.corrcoef(results[0].array[region], results[2].array[region])[0, 1] > 0.8
    # the inputs are the originals the scene warns about
    assert all(node.GetAttribute(core.ROLE_ATTRIBUTE) == core.ORIGINAL_ROLE for node in nodes)


def test_several_contrasts_in_the_worker_process_come_back_as_one_node_each(scene, case, contrast_nodes, tmp_path):
    """The panel's path: request with named contrasts -> job folder (neutral file names) -> worker -> nodes."""
    _, _, _, brain, lesion = case
    nodes, lesion_node, brain_node, _ = contrast_nodes
    logic = core.AnonMRILogicCore(scene)
    request = logic.prepare(core.LESION_LABEL, nodes[0], brain_node, lesion_node, device="cpu", seed=2,
                            exactLesion=True, variationStrength=0.0, otherVolumeNodes=[nodes[1]],
                            contrasts=["T1w", "T2w"], checkBrainMask=False)
    task = ProcessTask(*jobs.request_job(request), temporary_parent=str(tmp_path)).start()
    assert sorted(os.listdir(task.folder)) == [
        "brain_mask.volume.json", "brain_mask.volume.npy", "image.volume.json", "image.volume.npy", "job.json",
        "lesion_mask.volume.json", "lesion_mask.volume.npy", "other_image_1.volume.json", "other_image_1.volume.npy"]
    assert task.wait(300)
    assert task.status().state == DONE, task.error_traceback
    assert os.listdir(tmp_path) == []  # nothing of the patient is left
    outputs = logic.addOutputs(request, jobs.outputs_from_result(task.result), nodes[0])
    assert [node.GetName() for node in outputs] == ["Anonymized 1 (lesion-preserving, T1w)",
                                                    "Anonymized 2 (lesion-preserving, T2w)"]
    results = [mrml.volume_from_node(node) for node in outputs]
    for result, source in zip(results, nodes):
        original = mrml.volume_from_node(source)
        assert result.same_grid(original)
        np.testing.assert_array_equal(result.array[lesion], original.array[lesion])
    region = _output_brain(results, brain, lesion)
    assert np.corrcoef(results[0].array[region], results[1].array[region])[0, 1] < -0.4


# --- wiring and errors (a stand-in pipeline; no computation) -------------------------------------
def test_one_volume_calls_anonymize_lesions_several_call_anonymize_lesion_contrasts(scene, case, contrast_nodes,
                                                                                   monkeypatch):
    nodes, lesion_node, _, _ = contrast_nodes
    calls = []

    def one(volume, lesion_mask, config=None, weights=None, device="auto", seed=0, progress=None, brain_mask=None):
        calls.append(("one", config.contrast, config.variation.strength, config.exact_lesion))
        return volume

    def several(volumes, lesion_mask, contrasts=None, config=None, weights=None, device="auto", seed=0,
                progress=None, brain_mask=None):
        calls.append(("several", list(contrasts), config.contrast, config.variation.strength, len(volumes)))
        return [volume.with_array(np.asarray(volume.array) + 1) for volume in volumes], {}

    functions = {core.LESION: one, core.LESION_CONTRASTS: several}
    monkeypatch.setattr(core, "library_function", lambda operation: functions[operation])
    logic = core.AnonMRILogicCore(scene)
    single = logic.anonymizeLesions(nodes[0], lesion_node, exactLesion=True, variationStrength=0.25)
    assert single.GetName() == "Anonymized 1 (lesion-preserving)"  # one volume: a node, named as before
    assert calls.pop() == ("one", "T1w", 0.25, True)
    # the panel's path through the worker entry (JSON options), contrasts as chosen
    request = logic.prepare(core.LESION_LABEL, nodes[0], None, lesion_node, otherVolumeNodes=nodes[2:0:-1],
                            contrasts=["T1c", "auto", "FLAIR"], variationStrength=0.0)
    entry, volumes, options = jobs.request_job(request)
    assert sorted(volumes) == ["image", "lesion_mask", "other_image_1", "other_image_2"]
    result = jobs.anonymize(volumes, json.loads(json.dumps(options)))
    assert calls.pop() == ("several", ["T1c", "auto", "FLAIR"], "T1c", 0.0, 3)
    outputs = logic.addOutputs(request, jobs.outputs_from_result(result))
    assert [node.GetName() for node in outputs] == [
        "Anonymized 2 (lesion-preserving, T1c)", "Anonymized 3 (lesion-preserving, contrast 2)",
        "Anonymized 4 (lesion-preserving, FLAIR)"]
    for output, source in zip(outputs, [nodes[0], nodes[2], nodes[1]]):
        assert logic.inputOf(output) is source
        np.testing.assert_array_equal(mrml.volume_from_node(output).array, mrml.volume_from_node(source).array + 1)


def test_bad_other_contrasts_are_refused_with_a_clear_error_before_any_work(scene, case, contrast_nodes,
                                                                           monkeypatch):
    t1, _, _, brain, _ = case
    nodes, lesion_node, brain_node, _ = contrast_nodes
    logic = core.AnonMRILogicCore(scene)
    elsewhere = t1.affine.copy()
    elsewhere[:3, 3] += 1.5  # one voxel off: not co-registered
    moved = mrml.add_volume_node(scene, Volume(t1.array, elsewhere), "moved")
    smaller = mrml.add_volume_node(scene, Volume(np.asarray(t1.array)[1:], t1.affine), "cropped")
    labels = mrml.add_volume_node(scene, t1.with_array(brain.astype(np.uint8)), "labels", labelmap=True)
    for others, message in (([moved], "other contrast 1 does not lie on the input volume's grid"),
                            ([nodes[1], smaller], "other contrast 2 does not lie on the input volume's grid"),
                            ([nodes[0]], "the input volume or another contrast again"),
                            ([nodes[1], nodes[1]], "the input volume or another contrast again"),
                            ([labels], "labelmap")):
        with pytest.raises(InputError, match=message):
            logic.anonymizeLesions(nodes[0], lesion_node, otherVolumeNodes=others, variationStrength=0.0)
    with pytest.raises(InputError, match="3 volumes but 2 contrast names"):
        logic.anonymizeLesions(nodes[0], lesion_node, otherVolumeNodes=nodes[1:], contrasts=["T1w", "T2w"])
    with pytest.raises(InputError, match="unknown contrast 'T3'"):
        logic.anonymizeLesions(nodes[0], lesion_node, otherVolumeNodes=nodes[1:2], contrasts=["T1w", "T3"])
    with pytest.raises(InputError, match=r"variation strength must lie in \[0, 1\]"):
        logic.anonymizeLesions(nodes[0], lesion_node, variationStrength=1.5)
    with pytest.raises(InputError, match="lesion-preserving method"):
        logic.prepare(core.REMODEL_LABEL, nodes[0], brain_node, otherVolumeNodes=nodes[1:2])
    assert scene.GetFirstNodeByName("Anonymized 1 (lesion-preserving, T1w)") is None  # nothing was added
    # the library's own refusal (several contrasts without the donor prior) comes back from the worker
    # entry as the same InputError class: the panel shows its message, no traceback
    import dataclasses

    request = logic.prepare(core.LESION_LABEL, nodes[0], None, lesion_node, otherVolumeNodes=nodes[1:2],
                            exactLesion=True)
    panel_config = core.lesion_config
    monkeypatch.setattr(core, "lesion_config", lambda options, contrast: dataclasses.replace(
        panel_config(options, contrast), prior="none"))
    with pytest.raises(InputError, match="donor-brain prior"):
        jobs.anonymize(*jobs.request_job(request)[1:])


def test_contrasts_are_guessed_from_node_names():
    assert [core.guess_contrast(name) for name in (
        "BraTS20_Training_001_t1ce", "BraTS20_Training_001_t1", "BraTS20_Training_001_t2",
        "BraTS20_Training_001_flair", "3: T2 FLAIR AX", "sub-01_ce-gd_T1w", "4: AX T2 FSE", "Doe Jane 7", "")] == [
        "T1c", "T1w", "T2w", "FLAIR", "FLAIR", "T1c", "T2w", "auto", "auto"]
    assert core.contrast_choices()[0] == "auto" and "FLAIR" in core.contrast_choices()
    assert 0.0 <= core.default_variation_strength() <= 1.0


def test_the_slice_thickness_reaches_the_donor_prior_from_the_panel_or_the_dicom_database(scene, case, contrast_nodes,
                                                                                         monkeypatch):
    """The lesion method's slice thickness (the donor's slab): given in the panel, or read from the DICOM
    database for a node loaded from DICOM; through the worker entry's JSON options into the config."""
    nodes, lesion_node, brain_node, _ = contrast_nodes
    seen = []

    def one(volume, lesion_mask, config=None, weights=None, device="auto", seed=0, progress=None, brain_mask=None):
        seen.append(None if config is None else config.brain_prior.slice_thickness_mm)
        return volume

    monkeypatch.setattr(core, "library_function", lambda operation: one)
    logic = core.AnonMRILogicCore(scene)
    request = logic.prepare(core.LESION_LABEL, nodes[0], None, lesion_node, sliceThickness=5.0)
    entry, volumes, options = jobs.request_job(request)
    jobs.anonymize(volumes, json.loads(json.dumps(options)))
    assert seen.pop() == 5.0
    logic.anonymizeLesions(nodes[0], lesion_node, exactLesion=True)
    assert seen.pop() is None  # not given: the spacing
    with pytest.raises(InputError, match="slice thickness"):
        logic.prepare(core.LESION_LABEL, nodes[0], None, lesion_node, sliceThickness=-2.0)
    with pytest.raises(InputError, match="lesion-preserving method"):
        logic.prepare(core.REMODEL_LABEL, nodes[0], brain_node, sliceThickness=5.0)

    class Database:  # Slicer's DICOM database, as the panel asks it
        def instanceValue(self, uid, tag):
            return {("1.2.3", "0018,0050"): "5.0"}.get((uid, tag), "")

    assert mrml.dicom_slice_thickness(nodes[0], Database()) is None  # not loaded from DICOM
    nodes[0].SetAttribute("DICOM.instanceUIDs", "1.2.3 1.2.4")
    assert mrml.dicom_slice_thickness(nodes[0], Database()) == 5.0
    nodes[0].SetAttribute("DICOM.instanceUIDs", "9.9")
    assert mrml.dicom_slice_thickness(nodes[0], Database()) is None  # no such value: the spacing
    assert mrml.dicom_slice_thickness(None, Database()) is None
