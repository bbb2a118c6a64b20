"""The module's logic core against real MRML nodes (slicer-core): requests, outputs, library calls."""
import importlib

import numpy as np
import pytest

from AnonMRILib.errors import InputError, WeightsError
from AnonMRILib.io.volume import Volume
from AnonMRIModuleLib import core, mrml
from slicer_helpers import require_slicer_core, rotated_affine, synthetic_head

slicer = require_slicer_core()  # skips this module without slicer-core


def _has_module(name):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and error.name.startswith("AnonMRILib"):
            return False
        raise
    return True


@pytest.fixture
def head_nodes(scene):
    head, brain = synthetic_head(affine=rotated_affine(spacing=(3.0, 3.0, 3.0)))
    head_node = mrml.add_volume_node(scene, head, "sub-07 T1w")
    brain_node = mrml.add_volume_node(scene, brain, "sub-07 brain", labelmap=True)
    return head, brain, head_node, brain_node


# --- wiring: prepare -> run -> addOutput, with a pipeline function standing in for the library -------
def _keep_brain_blank_rest(volume, brain_mask=None, weights=None, device="auto", seed=0, progress=None,
                           rotations=None):
    """A stand-in remodel function with the library's signature: keeps the brain, zeroes the rest."""
    for step in range(3):
        if progress is not None:
            progress(step / 3, f"step {step}")
    out = np.where(brain_mask.array > 0, volume.array, 0).astype(volume.dtype)
    out[0, 0, 0] = int(seed) + (rotations or 0)
    return volume.with_array(out)


def test_process_gives_the_output_a_neutral_name_and_keeps_geometry_and_transform(scene, head_nodes, monkeypatch):
    head, brain, head_node, brain_node = head_nodes
    transform = scene.AddNewNodeByClass("vtkMRMLLinearTransformNode", "registration")
    shift = np.eye(4)
    shift[:3, 3] = [1.0, 2.0, 3.0]
    transform.SetMatrixTransformToParent(mrml.array_to_matrix(shift))
    head_node.SetAndObserveTransformNodeID(transform.GetID())
    brain_node.SetAndObserveTransformNodeID(transform.GetID())
    monkeypatch.setattr(core, "library_function", lambda operation: _keep_brain_blank_rest)
    messages = []
    logic = core.AnonMRILogicCore(scene)
    out = logic.remodelFace(head_node, brain_node, seed=5, rotations=7, progress=lambda f, m: messages.append(m),
                            checkBrainMask=False)  # a small synthetic head: not a plausible human brain
    assert out.GetName() == "Anonymized 1 (CP-GAN)"
    assert out.GetParentTransformNode() is transform
    result = mrml.volume_from_node(out, world=False)
    np.testing.assert_allclose(result.affine, head.affine, atol=1e-9)
    inside = brain.array > 0
    np.testing.assert_array_equal(result.array[inside], head.array[inside])
    assert result.array[0, 0, 0] == 12            # seed and rotations reached the pipeline
    assert messages[0].startswith("starting") and messages[-1] == "done" and "step 1" in messages


def test_unsupported_option_is_an_error_not_silently_dropped():
    def pipeline(volume, progress=None):
        return volume

    volume = Volume(np.zeros((2, 2, 2), np.int16), np.eye(4))
    assert core.call_with_supported_options(pipeline, volume, progress=None, device="cuda") is volume
    assert core.call_with_supported_options(pipeline, volume, rotations=None) is volume
    with pytest.raises(InputError, match="no option 'rotations'"):
        core.call_with_supported_options(pipeline, volume, rotations=8)


def test_missing_library_module_gives_a_clear_message(monkeypatch):
    monkeypatch.setitem(core.LIBRARY_FUNCTIONS, core.REMODEL,
                        ("AnonMRILib.pipelines.not_there", "remodel_face", "CP-GAN face remodeling"))
    with pytest.raises(core.MissingFeatureError, match="CP-GAN face remodeling is not available"):
        core.library_function(core.REMODEL)
    monkeypatch.setitem(core.LIBRARY_FUNCTIONS, core.REMODEL, ("AnonMRILib.io", "no_such_function", "x"))
    with pytest.raises(core.MissingFeatureError, match="has no no_such_function"):
        core.library_function(core.REMODEL)


def test_method_labels_round_trip():
    labels = core.method_labels()
    assert labels[:3] == [core.REMODEL_LABEL, core.REFACE_LABEL, core.LESION_LABEL]
    assert core.parse_method_label(core.REMODEL_LABEL) == (core.REMODEL, None)
    assert core.parse_method_label(core.REFACE_LABEL) == (core.DEFACE, "reface")
    assert not any(label.startswith(core.REMOVAL_LABEL_PREFIX) and "reface" in label for label in labels)
    assert labels[-1] == core.REMODEL_PAPER_LABEL
    for label in (core.REMODEL_PAPER_LABEL, core.REMODEL_PRIOR_LABEL):  # the latter from saved scenes
        assert core.parse_method_label(label) == (core.REMODEL, None)
    for label in labels[3:-1]:
        operation, method = core.parse_method_label(label)
        assert operation == core.DEFACE and method in core.removal_methods()
    with pytest.raises(InputError, match="unknown method"):
        core.parse_method_label("magic")


def test_lesion_method_needs_a_segmentation(scene, head_nodes):
    _, _, head_node, _ = head_nodes
    with pytest.raises(InputError, match="lesion segmentation"):
        core.AnonMRILogicCore(scene).prepare(core.LESION_LABEL, head_node)


def test_request_holds_no_mrml_object(scene, head_nodes):
    _, brain, head_node, brain_node = head_nodes
    request = core.AnonMRILogicCore(scene).prepare(core.REMODEL_LABEL, head_node, brain_node, seed=3)
    assert isinstance(request.image, Volume) and isinstance(request.brain_mask, Volume)
    np.testing.assert_array_equal(request.brain_mask.array, brain.array)
    for value in vars(request).values():
        assert not hasattr(value, "GetScene")
    assert request.options == {} and request.weights is None and request.seed == 3


def test_cpgan_labels_ask_for_their_generator(scene, head_nodes):
    """The plain CP-GAN label runs the shipped default (the prior generator), the paper label asks
    for prior none, and the old prior label (saved scenes) for prior average_head."""
    _, _, head_node, brain_node = head_nodes
    logic = core.AnonMRILogicCore(scene)
    request = logic.prepare(core.REMODEL_PAPER_LABEL, head_node, brain_node)
    assert request.operation == core.REMODEL and request.options == {"prior": "none"}
    assert logic.prepare(core.REMODEL_PRIOR_LABEL, head_node, brain_node).options == {"prior": "average_head"}
    assert logic.prepare(core.REMODEL_LABEL, head_node, brain_node).options == {}


# --- the real library ------------------------------------------------------------------------------
def test_render_face_through_the_logic_is_an_image_in_unit_range(scene, head_nodes):
    pytest.importorskip("torch")
    _, _, head_node, _ = head_nodes
    image = core.AnonMRILogicCore(scene).renderFace(head_node, view="anterior", size=64)
    assert image.shape == (64, 64)
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.std() > 0.01


@pytest.mark.skipif(not _has_module("AnonMRILib.pipelines.baselines"),
                    reason="AnonMRILib.pipelines.baselines does not exist yet")
def test_deface_through_the_logic_keeps_brain_voxels(scene):
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    head, brain = load_sample_head(), load_sample_brain_mask()
    head_node = mrml.add_volume_node(scene, head, "sample")
    brain_node = mrml.add_volume_node(scene, brain, "sample brain", labelmap=True)
    logic = core.AnonMRILogicCore(scene)
    methods = core.removal_methods()
    method = "quickshear" if "quickshear" in methods else methods[0]
    messages = []
    out = logic.deface(head_node, method, brain_node, progress=lambda fraction, message: messages.append(fraction))
    assert out.GetName() == f"Anonymized 1 ({method})"
    result = mrml.volume_from_node(out)
    assert result.same_grid(head) and result.dtype == head.dtype
    inside = brain.array > 0
    np.testing.assert_array_equal(result.array[inside], head.array[inside])
    assert not np.array_equal(result.array, head.array)  # the face was changed
    assert messages and messages == sorted(messages) and messages[-1] == 1.0
    with pytest.raises(InputError, match="not a removal method"):
        logic.deface(head_node, core.REMODEL_LABEL, brain_node)


@pytest.mark.skipif(not _has_module("AnonMRILib.pipelines.remodel"),
                    reason="AnonMRILib.pipelines.remodel (CP-GAN) does not exist yet; the coordinator unskips it")
def test_remodel_with_a_weights_file_through_the_logic_keeps_brain_voxels(scene, head_nodes, tmp_path):
    """The panel's "weights file" option: a small randomly initialised generator saved as safetensors."""
    torch = pytest.importorskip("torch")
    from AnonMRILib.models.cpgan import CPGANConfig, CPGANGenerator
    from AnonMRILib.models.cpgan_weights import save_generator

    head, brain, head_node, brain_node = head_nodes
    torch.manual_seed(0)
    weights = tmp_path / "tiny_cpgan.safetensors"
    save_generator(weights, CPGANGenerator(CPGANConfig(size=32, finest_channels=4, coarsest_channels=8)),
                   {"training": "none: random initialisation for a test"})
    logic = core.AnonMRILogicCore(scene)
    out = logic.remodelFace(head_node, brain_node, weights=str(weights), device="cpu", seed=3, checkBrainMask=False)
    assert out.GetName() == "Anonymized 1 (CP-GAN)"
    result = mrml.volume_from_node(out)
    assert result.same_grid(head) and result.dtype == head.dtype
    inside = brain.array > 0
    np.testing.assert_array_equal(result.array[inside], head.array[inside])
    assert (result.array[~inside] != head.array[~inside]).mean() > 0.05  # the rest was regenerated
    again = mrml.volume_from_node(logic.remodelFace(head_node, brain_node, weights=str(weights), device="cpu", seed=3,
                                                    checkBrainMask=False))
    np.testing.assert_array_equal(again.array, result.array)  # same seed, same output
    # the panel's rotations K reaches the privacy transform: another K, another hull, same brain
    other_k = mrml.volume_from_node(logic.remodelFace(head_node, brain_node, weights=str(weights), device="cpu",
                                                      seed=3, rotations=4, checkBrainMask=False))
    np.testing.assert_array_equal(other_k.array[inside], head.array[inside])
    assert not np.array_equal(other_k.array, result.array)


@pytest.mark.skipif(not _has_module("AnonMRILib.pipelines.remodel"),
                    reason="AnonMRILib.pipelines.remodel (CP-GAN) does not exist yet; the coordinator unskips it")
def test_remodel_sample_with_bundled_weights_through_the_logic_keeps_brain_voxels(scene):
    from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

    head, brain = load_sample_head(), load_sample_brain_mask()
    head_node = mrml.add_volume_node(scene, head, "sample")
    brain_node = mrml.add_volume_node(scene, brain, "sample brain", labelmap=True)
    try:
        out = core.AnonMRILogicCore(scene).remodelFace(head_node, brain_node, device="cpu", seed=0)
    except WeightsError as error:
        pytest.skip(f"the bundled CP-GAN weights are not in this checkout yet: {error}")
    assert out.GetName() == "Anonymized 1 (CP-GAN)"
    result = mrml.volume_from_node(out)
    inside = brain.array > 0
    np.testing.assert_array_equal(result.array[inside], head.array[inside])
    assert not np.array_equal(result.array[~inside], head.array[~inside])


@pytest.mark.skipif(not _has_module("AnonMRILib.evaluation.scores"),
                    reason="AnonMRILib.evaluation.scores does not exist yet")
def test_scores_through_the_logic_fill_a_table(scene, head_nodes):
    head, brain, head_node, brain_node = head_nodes
    blurred = head.with_array(np.where(brain.array > 0, head.array, head.array // 2).astype(head.dtype))
    out = mrml.add_volume_node(scene, blurred, "anonymized")
    logic = core.AnonMRILogicCore(scene)
    scores = logic.scores(head_node, out, brain_node)
    assert isinstance(scores, dict) and scores
    table = logic.scoresTable(scores)
    assert table.GetNumberOfRows() == len(mrml.flatten_scores(scores))
    assert list(mrml.scores_from_table_node(table))[0] == mrml.VERDICT_ROW == "Verdict"
    assert logic.scoresSummary(table) == "Verdict: " + scores["verdict"]


def test_load_sample_adds_the_embedded_head_and_its_brain_mask(scene):
    from AnonMRILib.sample_data import load_sample_head

    head_node, brain_node = core.AnonMRILogicCore(scene).loadSample()
    assert head_node.GetName() == "AnonMRI sample head" and brain_node.IsA("vtkMRMLLabelMapVolumeNode")
    head = mrml.volume_from_node(head_node)
    expected = load_sample_head()
    np.testing.assert_array_equal(head.array, expected.array)
    np.testing.assert_allclose(head.affine, expected.affine, atol=1e-9)
    brain = mrml.mask_from_node(brain_node, head_node, what="brain mask")
    assert brain.array.any() and brain.same_grid(head)


def test_lesion_anonymization_gets_the_segmentation_as_a_mask_on_the_image_grid(scene, head_nodes, monkeypatch):
    """Wiring of anonymizeLesions: segmentation -> lesion mask Volume -> pipeline -> named output."""
    head, _, head_node, _ = head_nodes
    labels = np.zeros(head.shape, np.uint8)
    labels[12:16, 14:20, 10:14] = 1
    lesion_labelmap = mrml.add_volume_node(scene, head.with_array(labels), "lesion labels", labelmap=True)
    segmentation = scene.AddNewNodeByClass("vtkMRMLSegmentationNode", "lesions")
    segmentation.SetReferenceImageGeometryParameterFromVolumeNode(head_node)
    mrml.ensure_binary_labelmap_support()
    assert slicer.vtkSlicerSegmentationsModuleLogic.ImportLabelmapToSegmentationNode(lesion_labelmap, segmentation)
    received = {}

    def lesion_pipeline(volume, lesion_mask, config=None, weights=None, device="auto", seed=0, progress=None):
        received.update(mask=lesion_mask, seed=seed, steps=config.steps)
        return volume.with_array(np.where(lesion_mask.array > 0, volume.array, 0).astype(volume.dtype))

    monkeypatch.setattr(core, "library_function", lambda operation: lesion_pipeline)
    out = core.AnonMRILogicCore(scene).anonymizeLesions(head_node, segmentation, seed=4, samplingSteps=20)
    assert out.GetName() == "Anonymized 1 (lesion-preserving)"
    np.testing.assert_array_equal(received["mask"].array, labels)
    assert received["mask"].same_grid(head) and received["seed"] == 4 and received["steps"] == 20
    result = mrml.volume_from_node(out)
    np.testing.assert_array_equal(result.array[labels > 0], head.array[labels > 0])

    # the panel's path: the same request as job options (JSON) for the worker, with exact lesion voxels
    import json

    from AnonMRIModuleLib import jobs

    request = core.AnonMRILogicCore(scene).prepare(core.LESION_LABEL, head_node, None, segmentation, seed=4,
                                                   samplingSteps=20, exactLesion=True)
    _, volumes, options = jobs.request_job(request)
    received.clear()

    def lesion_pipeline_exact(volume, lesion_mask, config=None, weights=None, device="auto", seed=0, progress=None):
        received.update(exact=config.exact_lesion, steps=config.steps, seed=seed)
        return volume

    monkeypatch.setattr(core, "library_function", lambda operation: lesion_pipeline_exact)
    jobs.anonymize(volumes, json.loads(json.dumps(options)))
    assert received == {"exact": True, "steps": 20, "seed": 4}


def test_lesion_method_with_the_shipped_weights_folder_and_exact_lesion_voxels(scene, head_nodes):
    """The panel's lesion options: a weights *folder* (a file is refused), exact lesion voxels kept."""
    from AnonMRILib.models import lesion_weights

    head, _, head_node, _ = head_nodes
    labels = np.zeros(head.shape, np.uint8)
    labels[12:16, 14:20, 10:14] = 1
    lesion_node = mrml.add_volume_node(scene, head.with_array(labels), "lesion labels", labelmap=True)
    logic = core.AnonMRILogicCore(scene)
    vae_file, _ = lesion_weights.resolve_weights(None)
    folder = str(vae_file.parent)
    with pytest.raises(InputError, match="weights folder"):
        logic.anonymizeLesions(head_node, lesion_node, weights=str(vae_file), device="cpu", samplingSteps=2)
    # no learned variation of the donor prior: its prior-conditioned weights are not shipped yet
    out = logic.anonymizeLesions(head_node, lesion_node, weights=folder, device="cpu", seed=1, samplingSteps=2,
                                 exactLesion=True, variationStrength=0.0)
    result = mrml.volume_from_node(out)
    inside = labels > 0
    np.testing.assert_array_equal(result.array[inside], head.array[inside])
    assert (result.array[~inside] != head.array[~inside]).mean() > 0.05


def test_a_computed_brain_mask_uses_the_chosen_device_comes_back_and_becomes_a_segmentation(scene, head_nodes,
                                                                                                monkeypatch):
    """Without a brain mask the run computes one on the chosen device first, hands it to the pipeline,
    returns it (jobs.anonymize), and the Logic shows it as an editable segmentation with the same voxels."""
    from AnonMRIModuleLib import jobs

    head, brain, head_node, _ = head_nodes
    calls = {}

    def fake_mask(image, device="auto", progress=None):
        calls["device"] = device
        return brain

    def pipeline(volume, brain_mask=None, weights=None, device="auto", seed=0, progress=None):
        calls["pipeline_mask"] = brain_mask
        return volume.with_array(np.where(brain_mask.array > 0, volume.array, 0).astype(volume.dtype))

    monkeypatch.setattr(core, "compute_brain_mask", fake_mask)
    monkeypatch.setattr(core, "library_function", lambda operation: pipeline)
    logic = core.AnonMRILogicCore(scene)
    request = logic.prepare(core.REMODEL_LABEL, head_node, None, device="cuda:1")
    result = jobs.anonymize(*jobs.request_job(request)[1:])
    assert calls["device"] == "cuda:1" and calls["pipeline_mask"] is brain
    assert result["brain_mask"] is brain
    output = logic.addOutput(request, result["output"], head_node)
    segmentation = logic.addBrainMask(result["brain_mask"], output, head_node)
    assert segmentation.IsA("vtkMRMLSegmentationNode") and segmentation.GetName() == "Brain mask 1"
    assert not core.mask_belongs_to_other_volume(segmentation, head_node)
    other = mrml.add_volume_node(scene, head, "another scan")
    assert core.mask_belongs_to_other_volume(segmentation, other)  # the panel clears it then
    back = mrml.mask_from_node(segmentation, head_node)
    np.testing.assert_array_equal(back.array, brain.array)
    # the scores reuse it: the request carries these voxels, nothing is computed again
    calls.clear()
    scores_request = logic.prepareScores(head_node, output, segmentation, device="cuda:1")
    np.testing.assert_array_equal(scores_request.brain_mask.array, brain.array)

    def fake_scores(original, anonymized, brain_mask=None, progress=None):
        calls["scores_mask"] = brain_mask
        return {"n": 1.0}

    monkeypatch.setattr(core, "library_function", lambda operation: fake_scores)
    result = jobs.scores(*jobs.scores_job(scores_request)[1:])
    assert result == {"scores": {"n": 1.0}} and "device" not in calls  # no second brain mask
    np.testing.assert_array_equal(calls["scores_mask"].array, brain.array)
    # without a mask, the scores job computes one on the chosen device
    jobs.scores({"original": head, "anonymized": mrml.volume_from_node(output)}, {"device": "cuda:1"})
    assert calls["device"] == "cuda:1" and calls["scores_mask"] is brain


def test_a_given_whole_head_mask_is_refused_when_the_library_has_the_plausibility_check(scene):
    if core.plausibility_checker() is None:
        pytest.skip("this AnonMRILib has no transforms.plausibility.check_brain_mask yet")
    from AnonMRILib.sample_data import load_sample_head

    head = load_sample_head()
    head_node = mrml.add_volume_node(scene, head, "sample")
    whole_head = mrml.add_volume_node(scene, head.with_array((head.array > np.percentile(head.array, 60))
                                                             .astype(np.uint8)), "head", labelmap=True)
    logic = core.AnonMRILogicCore(scene)
    with pytest.raises(InputError, match="Check brain mask"):
        logic.deface(head_node, core.removal_methods()[0], whole_head)
    assert scene.GetFirstNodeByName(f"Anonymized 1 ({core.removal_methods()[0]})") is None  # nothing added
    out = logic.deface(head_node, core.removal_methods()[0], whole_head, checkBrainMask=False)  # the user's choice
    assert out is not None
