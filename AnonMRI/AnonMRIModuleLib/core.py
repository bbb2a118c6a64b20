"""The AnonMRI module's logic without Qt: MRML nodes in, library call, MRML nodes out.

Every operation is split in three so the panel can run the slow middle part off the GUI thread:

1. :meth:`AnonMRILogicCore.prepare` (main thread) reads the nodes into :class:`Volume` s and
   returns an :class:`AnonymizationRequest` that holds no MRML object;
2. :func:`run_request` (any thread) calls the library (``AnonMRILib.pipelines...``) with a
   ``progress(fraction, message)`` callback, which may raise :class:`~AnonMRILib.progress.Cancelled`;
3. :meth:`AnonMRILogicCore.addOutput` (main thread) puts the result into a new volume node with a
   neutral name ("Anonymized 1 (CP-GAN)": never derived from the input's name), under the input's
   parent transform, in AnonMRI's own subject-hierarchy folder (never the original patient's).

The lesion method takes other co-registered contrasts of the same patient too (BraTS T1, T1c, T2,
FLAIR on the input's grid): one request carries them all to
``AnonMRILib.pipelines.lesion.anonymize_lesion_contrasts`` (one placed anatomy for every contrast),
and step 3 adds one neutrally named node per input.

The panel runs step 2 in a separate process (:mod:`.jobs`, :mod:`.tasks`); the console methods
(``remodelFace``, ``anonymizeLesions``, ``deface``, ``renderFace``, ``scores``) chain the three
synchronously in the calling thread. Library functions are imported when first used; a pipeline
that this AnonMRILib does not have raises :class:`MissingFeatureError` with a clear message.
"""
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from AnonMRILib.errors import AnonMRIError, DependencyError, InputError
from AnonMRILib.io.volume import Volume
from AnonMRILib.progress import ProgressCallback, report, sub_progress

from . import mrml

#: operation keys
REMODEL = "remodel"
LESION = "lesion"
DEFACE = "deface"

#: labels of the panel's Method combo box (the parameter node stores the label)
#: CP-GAN with the shipped default generator: on the anatomical prior (a template head placed from
#: the brain mask and hull, warped by the generator's learned variation)
REMODEL_LABEL = "CP-GAN face remodeling"
#: the paper's generator (the face from gamma alone on the 64^3 model grid; ``prior="none"``)
REMODEL_PAPER_LABEL = "CP-GAN face remodeling, paper generator (no template)"
#: the label earlier versions listed for the prior generator (now the default); still read from
#: saved scenes and parameter nodes
REMODEL_PRIOR_LABEL = "CP-GAN face remodeling on the template head (prior)"
#: the ``prior`` option each CP-GAN label asks for (absent: the shipped default)
REMODEL_PRIORS = {REMODEL_PAPER_LABEL: "none", REMODEL_PRIOR_LABEL: "average_head"}
LESION_LABEL = "Lesion-preserving anonymization"
#: REFACE replaces the face with a placed template head (not a removal): its own label, second
REFACE_LABEL = "REFACE: template face"
REFACE = "reface"
REMOVAL_LABEL_PREFIX = "Removal baseline: "

#: removal baselines listed when ``AnonMRILib.pipelines.baselines`` cannot be imported to ask it
FALLBACK_REMOVAL_METHODS = ("quickshear", "facemask", "deface", "skullstrip", "blur", "black", "reface")

#: the lesion method given several co-registered contrasts of one patient (a library entry point)
LESION_CONTRASTS = "lesion_contrasts"

#: library entry points: operation -> (module, function, what a user would call it)
LIBRARY_FUNCTIONS = {
    REMODEL: ("AnonMRILib.pipelines.remodel", "remodel_face", "CP-GAN face remodeling"),
    LESION: ("AnonMRILib.pipelines.lesion", "anonymize_lesions", "Lesion-preserving anonymization"),
    LESION_CONTRASTS: ("AnonMRILib.pipelines.lesion", "anonymize_lesion_contrasts",
                       "Lesion-preserving anonymization of several contrasts"),
    DEFACE: ("AnonMRILib.pipelines.baselines", "deface", "The removal-baseline pipeline"),
    "render": ("AnonMRILib.rendering", "render_face", "Face rendering"),
    "scores": ("AnonMRILib.evaluation.scores", "scan_scores", "Per-scan scoring"),
}


#: how many other contrasts of the patient the panel offers next to the input
MAX_OTHER_CONTRASTS = 3
#: contrast names when ``AnonMRILib.transforms.brain_prior.CONTRASTS`` cannot be imported to ask it
FALLBACK_CONTRASTS = ("auto", "T1w", "T1c", "T2w", "PDw", "FLAIR")
AUTO_CONTRAST = "auto"


class MissingFeatureError(AnonMRIError, NotImplementedError):
    """The installed AnonMRILib does not provide the requested pipeline or function."""


def library_function(operation: str) -> Callable:
    """The library function behind ``operation`` (imported now), or a clear error."""
    module_name, function_name, feature = LIBRARY_FUNCTIONS[operation]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if missing == "AnonMRILib" or missing.startswith("AnonMRILib."):
            raise MissingFeatureError(f"{feature} is not available: this AnonMRILib has no module "
                                      f"{module_name} (update the AnonMRI extension)") from error
        raise DependencyError(f"{feature} needs the Python package '{missing}', which is not installed "
                              "(the AnonMRI panel offers to install it)") from error
    function = getattr(module, function_name, None)
    if function is None:
        raise MissingFeatureError(f"{feature} is not available: {module_name} has no {function_name}() "
                                  "(update the AnonMRI extension)")
    return function


def _library_names(module_name: str, attribute: str, fallback: Sequence[str]) -> List[str]:
    """``module_name.attribute`` of the installed AnonMRILib as a list of str; ``fallback`` when this
    AnonMRILib lacks it (an older library under a newer extension)."""
    try:
        names = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError):
        return list(fallback)
    return [str(name) for name in names]


def contrast_choices() -> List[str]:
    """The contrast names the lesion method knows (``AnonMRILib.transforms.brain_prior.CONTRASTS``),
    ``"auto"`` first."""
    return _library_names("AnonMRILib.transforms.brain_prior", "CONTRASTS", FALLBACK_CONTRASTS)


def guess_contrast(node_name: str) -> str:
    """The contrast a node name states (``"BraTS20_001_t1ce"`` -> ``"T1c"``, ``"3: T2 FLAIR AX"`` ->
    ``"FLAIR"``), as the command line guesses it from a file name; else ``"auto"``."""
    import re

    try:
        from AnonMRILib.cli.lesion import contrast_from_file_name
    except ImportError:
        return AUTO_CONTRAST
    # node names separate words with spaces and colons, file names with '_', '-' and '.'
    guessed = contrast_from_file_name(re.sub(r"[^A-Za-z0-9.\-]+", "_", str(node_name or "")))
    return guessed if guessed in contrast_choices() else AUTO_CONTRAST


def default_variation_strength() -> float:
    """The library's default strength of the donor prior's learned variation
    (``AnonMRILib.pipelines.prior_variation.PriorVariationConfig().strength``, in [0, 1]); 0 when
    this AnonMRILib has no learned variation."""
    try:
        from AnonMRILib.pipelines.prior_variation import PriorVariationConfig
    except ImportError:
        return 0.0
    return float(PriorVariationConfig().strength)


def removal_methods() -> List[str]:
    """Names of the removal baselines, as ``AnonMRILib.pipelines.baselines.REMOVAL_METHODS`` lists them."""
    return _library_names("AnonMRILib.pipelines.baselines", "REMOVAL_METHODS", FALLBACK_REMOVAL_METHODS)


def method_labels() -> List[str]:
    """Every entry of the panel's Method combo box: CP-GAN (the shipped default generator, on the
    anatomical prior), REFACE (when the library has it), the lesion method, the removal baselines,
    then the paper's CP-GAN generator."""
    methods = removal_methods()
    reface = [REFACE_LABEL] if REFACE in methods else []
    return [REMODEL_LABEL] + reface + [LESION_LABEL] + [REMOVAL_LABEL_PREFIX + name for name in methods
                                                        if name != REFACE] + [REMODEL_PAPER_LABEL]


def parse_method_label(label: str):
    """``(operation, removal method or None)`` for a Method combo-box label (or a bare method key)."""
    if label in (REMODEL_LABEL, REMODEL, "cpgan", "CP-GAN") or label in REMODEL_PRIORS:
        return REMODEL, None
    if label in (LESION_LABEL, LESION):
        return LESION, None
    if label == REFACE_LABEL:
        return DEFACE, REFACE
    if label.startswith(REMOVAL_LABEL_PREFIX):
        return DEFACE, label[len(REMOVAL_LABEL_PREFIX):]
    if label in removal_methods():
        return DEFACE, label
    raise InputError(f"unknown method {label!r}; choose one of: {', '.join(method_labels())}")


def short_method_name(operation: str, method: Optional[str]) -> str:
    """The name used in output node names: ``CP-GAN``, ``lesion-preserving`` or the baseline's name."""
    if operation == REMODEL:
        return "CP-GAN"
    if operation == LESION:
        return "lesion-preserving"
    return str(method)


def call_with_supported_options(function: Callable, *args, droppable: Sequence[str] = ("device", "progress"),
                                **options) -> Any:
    """Call ``function`` with the keyword options its signature accepts.

    An option it does not accept is dropped when its value is ``None`` or its name is in
    ``droppable`` (e.g. ``device`` for a CPU-only baseline); any other unsupported option is an
    error, so a user's setting is never silently ignored.
    """
    parameters = inspect.signature(function).parameters
    accepts_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    passed = {}
    for name, value in options.items():
        if accepts_any or name in parameters:
            if value is not None or name in parameters:
                passed[name] = value
        elif value is not None and name not in droppable:
            raise InputError(f"{function.__module__}.{function.__name__}() has no option '{name}'; "
                             "leave it at its default (0 = model default) for this method")
    return function(*args, **passed)


def as_result_volume(result: Any) -> Volume:
    """The output :class:`Volume` of a pipeline that returns a Volume, a tuple or a result object."""
    if isinstance(result, Volume):
        return result
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], Volume):
        return result[0]
    for attribute in ("volume", "image", "output", "anonymized"):
        value = getattr(result, attribute, None)
        if isinstance(value, Volume):
            return value
    raise AnonMRIError(f"the pipeline returned a {type(result).__name__}, not a Volume")


@dataclass
class AnonymizationRequest:
    """Everything one run needs, as plain data (no MRML object): safe to hand to a worker thread.

    ``image`` / masks are in world RAS; ``options`` holds method options passed by keyword
    (``rotations``, ``sampling_steps``: None = the model's default; lesion: ``exact_lesion``,
    ``variation_strength``). Lesion method: ``other_images`` are other co-registered contrasts of
    the patient on ``image``'s grid, ``contrasts`` a name per image (``image``'s first; empty: all
    ``"auto"``), ``other_input_node_ids`` the nodes they were read from.
    """

    operation: str
    image: Volume
    method: Optional[str] = None
    brain_mask: Optional[Volume] = None
    lesion_mask: Optional[Volume] = None
    weights: Optional[str] = None
    device: str = "auto"
    seed: int = 0
    options: Dict[str, Any] = field(default_factory=dict)
    input_node_id: str = ""
    output_name: str = ""
    check_brain_mask: bool = True
    other_images: List[Volume] = field(default_factory=list)
    contrasts: List[str] = field(default_factory=list)
    other_input_node_ids: List[str] = field(default_factory=list)

    @property
    def images(self) -> List[Volume]:
        """Every image of the run: ``image``, then ``other_images``."""
        return [self.image] + list(self.other_images)

    def contrast_names(self) -> List[str]:
        """A contrast name per image (``"auto"`` where none was given)."""
        names = list(self.contrasts) or [AUTO_CONTRAST] * len(self.images)
        if len(names) != len(self.images):
            raise InputError(f"{len(self.images)} images but {len(names)} contrast names; give one per image, "
                             "the input's first")
        return names


def accepts_option(operation: str, name: str) -> bool:
    """True when the library function of ``operation`` has a keyword option ``name``."""
    try:
        parameters = inspect.signature(library_function(operation)).parameters
    except (AnonMRIError, ValueError, TypeError):
        return False
    return name in parameters or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def uses_brain_mask(operation: str) -> bool:
    """Whether ``operation``'s pipeline uses a brain mask (CP-GAN and removal methods; lesion: if it
    accepts one)."""
    return operation in (REMODEL, DEFACE) or (operation == LESION and accepts_option(LESION, "brain_mask"))


def compute_brain_mask(image: Volume, device: str = "auto", progress: Optional[ProgressCallback] = None) -> Volume:
    """The library's brain mask of ``image`` (default backend) on ``device``."""
    from AnonMRILib.transforms.brain_mask import brain_mask

    return brain_mask(image, device=str(device), progress=progress)


def plausibility_checker() -> Optional[Callable]:
    """``AnonMRILib.transforms.plausibility.check_brain_mask`` when this AnonMRILib has it, else None."""
    try:
        module = importlib.import_module("AnonMRILib.transforms.plausibility")
    except ImportError:
        return None
    return getattr(module, "check_brain_mask", None)


def check_given_brain_mask(image: Volume, mask: Volume) -> bool:
    """Refuse (InputError) a user's brain mask that is not plausibly a brain (e.g. the whole head).

    Returns False when this AnonMRILib has no plausibility check (nothing was checked).
    """
    checker = plausibility_checker()
    if checker is None:
        return False
    try:
        checker(image, mask)
    except InputError as error:  # the library's hint names the CLI option; say what to do here
        reason = str(error).split("; skip this check")[0]
        raise InputError(f"{reason}. If the mask is right, switch off 'Check brain mask' "
                         "(console: checkBrainMask=False)") from error
    return True


def release_device_memory() -> None:
    """Give cached GPU memory back to the driver after a run (no-op without torch or CUDA)."""
    import sys

    torch = sys.modules.get("torch")  # never import torch just for this
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def lesion_config(options: Dict[str, Any], contrast: str = AUTO_CONTRAST):
    """The ``LesionAnonymizationConfig`` for the panel's lesion options, taken out of ``options``
    (``sampling_steps``: DDIM steps, 0/None = default; ``exact_lesion``; ``variation_strength``: the
    donor prior's learned variation in [0, 1], None = default; ``slice_thickness_mm``: the donor's
    slab, None = the spacing), with the reference image's
    ``contrast``; None when every setting is the library's default."""
    steps = options.pop("sampling_steps", None)
    exact = bool(options.pop("exact_lesion", False))
    strength = options.pop("variation_strength", None)
    thickness = options.pop("slice_thickness_mm", None)
    if not (steps or exact or strength is not None or thickness or contrast != AUTO_CONTRAST):
        return None
    from AnonMRILib.pipelines.lesion import LesionAnonymizationConfig

    settings: Dict[str, Any] = {"exact_lesion": exact}
    if steps:  # the panel's "sampling steps" are the lesion pipeline's DDIM steps
        settings["steps"] = int(steps)
    if contrast != AUTO_CONTRAST:
        settings["contrast"] = str(contrast)
    if strength is not None:
        import dataclasses

        try:
            from AnonMRILib.pipelines.prior_variation import PriorVariationConfig
        except ImportError as error:
            raise MissingFeatureError("the learned variation strength is not available: this AnonMRILib has no "
                                      "pipelines.prior_variation (update the AnonMRI extension)") from error
        settings["variation"] = dataclasses.replace(PriorVariationConfig(), strength=float(strength))
    if thickness:
        from AnonMRILib.transforms.brain_prior import BrainPriorConfig

        settings["brain_prior"] = BrainPriorConfig(slice_thickness_mm=float(thickness))
    return LesionAnonymizationConfig(**settings)


def _run_lesion(request: AnonymizationRequest, brain: Optional[Volume],
                progress: Optional[ProgressCallback]) -> List[Volume]:
    """The lesion method on the request's image (``anonymize_lesions``) or, with other contrasts, on
    all of them with one anatomy (``anonymize_lesion_contrasts``): one output per image."""
    if request.lesion_mask is None:
        raise InputError("lesion-preserving anonymization needs a lesion segmentation")
    contrasts = request.contrast_names()
    options = dict(request.options)
    config = lesion_config(options, contrasts[0])
    if config is not None:
        options["config"] = config
    droppable = ("device", "progress", "brain_mask")
    if not request.other_images:
        result = call_with_supported_options(
            library_function(LESION), request.image, request.lesion_mask, brain_mask=brain,
            weights=request.weights, device=request.device, seed=request.seed, progress=progress,
            droppable=droppable, **options)
        return [as_result_volume(result)]
    results = call_with_supported_options(
        library_function(LESION_CONTRASTS), request.images, request.lesion_mask, contrasts, brain_mask=brain,
        weights=request.weights, device=request.device, seed=request.seed, progress=progress,
        droppable=droppable, **options)
    outputs = list(results[0]) if isinstance(results, tuple) else list(results)
    if len(outputs) != len(request.images):
        raise AnonMRIError(f"the pipeline returned {len(outputs)} volumes for {len(request.images)} images")
    return outputs


def run_request_outputs(request: AnonymizationRequest, progress: Optional[ProgressCallback] = None):
    """Run the library for ``request`` (any thread; touches no MRML): ``(output Volumes, brain mask)``,
    one output per image of the request (:attr:`AnonymizationRequest.images`), each on its image's grid.

    The brain mask is the request's (plausibility-checked unless ``check_brain_mask`` is off) or,
    for CP-GAN and the removal methods, computed here first on the request's device, so that it
    can be shown and reused (scores) instead of being computed again. The lesion pipeline gets the
    given mask when it accepts one and otherwise decides itself (a skull-stripped input needs none).
    """
    report(progress, 0.0, f"starting {short_method_name(request.operation, request.method)}")
    if request.other_images and request.operation != LESION:
        raise InputError("other contrasts of the patient are anonymized by the lesion-preserving method only")
    brain = request.brain_mask
    rest = progress
    if brain is not None and request.check_brain_mask:
        check_given_brain_mask(request.image, brain)
    if brain is None and request.operation in (REMODEL, DEFACE):  # the lesion pipeline decides itself
        brain = compute_brain_mask(request.image, request.device, sub_progress(progress, 0.0, 0.4))
        rest = sub_progress(progress, 0.4, 1.0)
    if request.operation == REMODEL:
        function = library_function(REMODEL)
        outputs = [as_result_volume(call_with_supported_options(
            function, request.image, brain_mask=brain, weights=request.weights,
            device=request.device, seed=request.seed, progress=rest, **request.options))]
    elif request.operation == LESION:
        outputs = _run_lesion(request, brain, rest)
    elif request.operation == DEFACE:
        function = library_function(DEFACE)
        outputs = [as_result_volume(call_with_supported_options(
            function, request.image, request.method, brain_mask=brain, progress=rest,
            seed=request.seed, droppable=("device", "progress", "seed", "weights"), device=request.device))]
    else:
        raise InputError(f"unknown operation {request.operation!r}")
    for output, image in zip(outputs, request.images):
        if output.shape != image.shape:
            raise AnonMRIError(f"the pipeline returned shape {output.shape}, not the input's {image.shape}")
    report(progress, 1.0, "done")
    return outputs, brain


def run_request_with_mask(request: AnonymizationRequest, progress: Optional[ProgressCallback] = None):
    """:func:`run_request_outputs` for one image: ``(output Volume, brain mask)``."""
    outputs, brain = run_request_outputs(request, progress)
    return outputs[0], brain


def run_request(request: AnonymizationRequest, progress: Optional[ProgressCallback] = None) -> Volume:
    """Run the library for ``request`` (any thread; touches no MRML) and return the output Volume
    (of the first image)."""
    output, _brain = run_request_with_mask(request, progress)
    release_device_memory()
    return output


@dataclass
class ScoresRequest:
    """The volumes :func:`run_scores` compares (world RAS, same grid); no MRML object."""

    original: Volume
    anonymized: Volume
    brain_mask: Optional[Volume] = None
    device: str = "auto"


def run_scores(request: ScoresRequest, progress: Optional[ProgressCallback] = None) -> Dict[str, Any]:
    """``AnonMRILib.evaluation.scores.scan_scores`` for ``request`` (any thread).

    Without a brain mask, one is computed first on the request's device (the library would
    otherwise compute it on its default device)."""
    function = library_function("scores")
    brain, rest = request.brain_mask, progress
    if brain is None:
        brain = compute_brain_mask(request.original, request.device, sub_progress(progress, 0.0, 0.5))
        rest = sub_progress(progress, 0.5, 1.0)
    return dict(call_with_supported_options(function, request.original, request.anonymized, brain_mask=brain,
                                            progress=rest, device=request.device))


def scores_summary(scores) -> str:
    """What the panel's status shows after scoring: ``"Verdict: <verdict>"`` with ``scan_scores``'
    verdict word for word (it carries the brain-mask plausibility warning when the mask was wrong)."""
    verdict = mrml.scores_verdict(scores or {})
    if verdict is None:
        return "Scores computed; this AnonMRILib gives no verdict (see the table)."
    return f"Verdict: {verdict}"


#: node attribute saying what AnonMRI made a node for (its outputs) or read it as (the original)
ROLE_ATTRIBUTE = "AnonMRI.Role"
ANONYMIZED_ROLE, BRAIN_MASK_ROLE, SCORES_ROLE, ORIGINAL_ROLE = "anonymized", "brainMask", "scores", "original"
#: on a brain mask AnonMRI computed: the ID of the volume node it belongs to
COMPUTED_FOR_ATTRIBUTE = "AnonMRI.ComputedFor"
#: on an anonymized volume: the ID of the volume node it was made from (its DICOM series is
#: what a DICOM export writes into) and the method key ("remodel", "lesion", a removal method)
MADE_FROM_ATTRIBUTE = "AnonMRI.MadeFrom"
METHOD_ATTRIBUTE = "AnonMRI.Method"
#: AnonMRI's own subject-hierarchy folder (outside any patient / study of the original)
RESULTS_FOLDER = "AnonMRI results"
#: subject-hierarchy attributes that identify a patient or a study (the DICOM module sets them)
PATIENT_ATTRIBUTE_PREFIX = "DICOM."


def _nodes_with_role(scene, role: str) -> List:
    nodes = []
    for index in range(scene.GetNumberOfNodes()):
        node = scene.GetNthNode(index)
        if node.GetAttribute(ROLE_ATTRIBUTE) == role:
            nodes.append(node)
    return nodes


def neutral_name(scene, stem: str, role: str) -> str:
    """``"<stem> <n>"`` with n one more than the number of nodes of ``role`` (and unused)."""
    number = len(_nodes_with_role(scene, role)) + 1
    while scene.GetFirstNodeByName(f"{stem} {number}") is not None:
        number += 1
    return f"{stem} {number}"


def neutral_output_name(scene, method_name: str) -> str:
    """``"Anonymized <n> (<method>)"``: numbered, never derived from the input node's name."""
    number = len(_nodes_with_role(scene, ANONYMIZED_ROLE)) + 1
    while scene.GetFirstNodeByName(f"Anonymized {number} ({method_name})") is not None:
        number += 1
    return f"Anonymized {number} ({method_name})"


def _subject_hierarchy(scene):
    import slicer

    return slicer.vtkMRMLSubjectHierarchyNode.GetSubjectHierarchyNode(scene)


def results_folder_item(scene) -> int:
    """The subject-hierarchy folder "AnonMRI results" directly under the scene (created once)."""
    sh = _subject_hierarchy(scene)
    scene_item = sh.GetSceneItemID()
    children = []
    import vtk

    ids = vtk.vtkIdList()
    sh.GetItemChildren(scene_item, ids, False)
    children = [ids.GetId(i) for i in range(ids.GetNumberOfIds())]
    for item in children:
        if sh.GetItemName(item) == RESULTS_FOLDER and sh.GetItemAttribute(item, ROLE_ATTRIBUTE) == "results":
            return item
    item = sh.CreateFolderItem(scene_item, RESULTS_FOLDER)
    sh.SetItemAttribute(item, ROLE_ATTRIBUTE, "results")
    return item


def mark_result(node, role: str) -> None:
    """Tag ``node`` as an AnonMRI result and move it into the results folder (subject hierarchy)."""
    node.SetAttribute(ROLE_ATTRIBUTE, role)
    scene = node.GetScene()
    sh = _subject_hierarchy(scene)
    folder = results_folder_item(scene)
    item = sh.GetItemByDataNode(node)
    if item:
        sh.SetItemParent(item, folder)
    else:
        sh.CreateItem(folder, node)


def neutral_file_name(name: str, suffix: str = ".nrrd") -> str:
    """A file name from a neutral node name: "Anonymized 1 (CP-GAN)" -> "Anonymized_1_CP-GAN.nrrd"."""
    import re

    return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_") + suffix


def set_default_file_name(node, name: str) -> None:
    """Give ``node`` a storage node whose file name (what Save offers) is the neutral ``name``."""
    storage = node.GetStorageNode()
    if storage is None:
        storage = node.CreateDefaultStorageNode()
        if storage is None:
            return
        node.GetScene().AddNode(storage)
        node.SetAndObserveStorageNodeID(storage.GetID())
    storage.SetFileName(neutral_file_name(name, "." + (storage.GetDefaultWriteFileExtension() or "nrrd")))


def mask_belongs_to_other_volume(mask_node, volume_node) -> bool:
    """True for a brain mask AnonMRI computed for another volume than ``volume_node``."""
    if mask_node is None or volume_node is None:
        return False
    owner = mask_node.GetAttribute(COMPUTED_FOR_ATTRIBUTE)
    return bool(owner) and owner != volume_node.GetID()


def mark_original(node) -> None:
    """Tag an input volume as the original (see :func:`original_data_in_scene`)."""
    if not node.GetAttribute(ROLE_ATTRIBUTE):
        node.SetAttribute(ROLE_ATTRIBUTE, ORIGINAL_ROLE)


def original_data_in_scene(scene) -> List[str]:
    """Descriptions of what in ``scene`` belongs to the original study (no patient values)."""
    originals = len(_nodes_with_role(scene, ORIGINAL_ROLE))
    found = [f"{originals} input volume(s) that AnonMRI anonymized"] if originals else []
    sh = _subject_hierarchy(scene)
    if sh is not None:
        import vtk

        ids = vtk.vtkIdList()
        sh.GetItemChildren(sh.GetSceneItemID(), ids, True)
        for index in range(ids.GetNumberOfIds()):
            item = ids.GetId(index)
            names = [name for name in sh.GetItemAttributeNames(item) if name.startswith(PATIENT_ATTRIBUTE_PREFIX)]
            if names:
                level = sh.GetItemLevel(item) or "item"
                found.append(f"a {level} item with DICOM attributes ({', '.join(sorted(names))})")
    return found


def export_formats() -> List[str]:
    """File suffixes :meth:`AnonMRILogicCore.exportAnonymized` can write, as the library offers them
    (``AnonMRILib.io.formats.WRITE_SUFFIXES``, plus ``"DICOM"`` when DICOM output works here:
    :func:`dicom_writer`)."""
    from AnonMRILib.io.formats import WRITE_SUFFIXES

    formats = [suffix for suffix in WRITE_SUFFIXES if suffix in (".nii.gz", ".nii", ".nrrd")]
    formats += [suffix for suffix in WRITE_SUFFIXES if suffix not in formats]
    if dicom_writer() is not None:
        formats.append(DICOM_FORMAT)
    return formats


DICOM_FORMAT = "DICOM"
#: the library's DICOM writer: (module, function(volume, source_folder, out_folder, config), config
#: class). It writes the volume back into a copy of the original series, de-identified under DICOM
#: PS3.15 (new UIDs, a pseudonymous patient), so it needs the original's DICOM files.
DICOM_WRITERS = (("AnonMRILib.io.dicom_writer", "write_dicom_series", "DicomDeidentificationConfig"),)
#: what the library's DICOM writer needs (distribution, lowest version); checked from metadata only
DICOM_REQUIREMENTS = (("pydicom", "3.0"), ("dicom-anonymizer", "2.1"))
#: the volume-node attribute where Slicer's DICOM module lists the SOP instance UIDs a volume was read from
DICOM_INSTANCE_UIDS_ATTRIBUTE = "DICOM.instanceUIDs"


def missing_dicom_requirements() -> List[str]:
    """The packages DICOM output needs that are missing or too old (``pydicom>=3.0 (not installed)``)."""
    from . import dependencies

    missing = []
    for distribution, minimum in DICOM_REQUIREMENTS:
        requirement = dependencies.Requirement(distribution, minimum)
        if not requirement.satisfied:
            missing.extend(dependencies.describe([requirement]))
    return missing


def _dicom_writer_parts() -> Optional[tuple]:
    """``(write function, config class)`` of the first :data:`DICOM_WRITERS` entry this AnonMRILib has."""
    for module_name, function_name, config_name in DICOM_WRITERS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        function, config = getattr(module, function_name, None), getattr(module, config_name, None)
        if callable(function) and callable(config):
            return function, config
    return None


def dicom_writer(require_packages: bool = True) -> Optional[Callable]:
    """The library's DICOM series writer (``write_dicom_series``) when this AnonMRILib has one and,
    with ``require_packages``, the packages it needs are installed; else None."""
    if require_packages and missing_dicom_requirements():
        return None
    parts = _dicom_writer_parts()
    return parts[0] if parts else None


def dicom_source_files(node, file_for_instance: Optional[Callable[[str], str]] = None) -> List[str]:
    """The DICOM files ``node`` (the original volume) was loaded from, found through its
    ``DICOM.instanceUIDs`` attribute and ``file_for_instance(uid)`` (default: Slicer's DICOM
    database, ``slicer.dicomDatabase.fileForInstance``)."""
    import os

    uids = (node.GetAttribute(DICOM_INSTANCE_UIDS_ATTRIBUTE) or "").split() if node is not None else []
    if not uids:
        raise InputError("DICOM export writes the anonymized voxels back into the original's DICOM series, but "
                         "the original volume was not loaded from DICOM; choose an image format")
    if file_for_instance is None:
        import slicer

        database = getattr(slicer, "dicomDatabase", None)
        if database is None:
            raise InputError("DICOM export needs Slicer's DICOM database (open the DICOM module once)")
        file_for_instance = database.fileForInstance
    files = [file_for_instance(uid) or "" for uid in uids]
    missing = sum(1 for path in files if not os.path.isfile(path))
    if missing:
        raise InputError(f"{missing} of the original's {len(files)} DICOM files are no longer in Slicer's DICOM "
                         "database; import the original series again, or choose an image format")
    return files


def export_dicom(volume: Volume, source_files: Sequence[str], folder, method: str = "anonymized") -> str:
    """Write ``volume`` (on the grid of the series ``source_files``, its own frame: no parent
    transform) as a de-identified DICOM series into ``folder`` (created; an existing folder must
    be empty), with the library's writer. All files appear or none. Returns the folder."""
    import os
    import shutil
    import tempfile

    from AnonMRILib.io.writers import OutputTransaction

    parts = _dicom_writer_parts()
    if parts is None:
        raise MissingFeatureError("DICOM export is not available: this AnonMRILib has no "
                                  "io.dicom_writer.write_dicom_series (update the AnonMRI extension)")
    missing = missing_dicom_requirements()
    if missing:
        raise DependencyError("DICOM export needs " + "; ".join(missing))
    writer, config_class = parts
    config = config_class(method=str(method))
    source = tempfile.mkdtemp(prefix="anonmri-dicom-")  # private (0700): only the original series
    try:
        for number, path in enumerate(source_files, start=1):
            link = os.path.join(source, f"{number:05d}.dcm")
            try:
                os.symlink(os.path.abspath(path), link)
            except (OSError, NotImplementedError):  # no symlinks (Windows without the privilege)
                shutil.copyfile(path, link)
        with OutputTransaction() as outputs:
            outputs.add_folder(folder, lambda staged: writer(volume, source, staged, config))
    finally:
        shutil.rmtree(source, ignore_errors=True)
    return str(folder)


def export_volume(volume: Volume, path) -> str:
    """Write ``volume`` to the image file ``path`` (a suffix of :func:`export_formats`)."""
    import os

    from AnonMRILib.io.formats import image_suffix
    from AnonMRILib.io.writers import save_volume

    path = str(path)
    if not image_suffix(path):
        raise InputError(f"{os.path.basename(path)}: choose one of {', '.join(export_formats())}")
    return str(save_volume(volume, path))


def other_contrast_volumes(image: Volume, volumeNode, otherNodes: Sequence) -> List[Volume]:
    """The other contrasts' volumes (world RAS), refused with a clear error unless each is another
    scalar volume than the input and lies on ``image``'s grid (co-registered and resampled)."""
    volumes = []
    seen = {volumeNode.GetID()}
    for number, node in enumerate(otherNodes, start=1):
        what = f"other contrast {number}"
        if node is None or not node.IsA("vtkMRMLScalarVolumeNode"):
            raise InputError(f"{what} is not a scalar volume")
        if node.IsA("vtkMRMLLabelMapVolumeNode"):
            raise InputError(f"{what} is a labelmap, not an image")
        if node.GetID() in seen:
            raise InputError(f"{what} is the input volume or another contrast again; choose each volume once")
        seen.add(node.GetID())
        volume = mrml.volume_from_node(node)
        if not volume.same_grid(image):
            raise InputError(f"{what} does not lie on the input volume's grid (shape {volume.shape} vs "
                             f"{image.shape}, or another position, spacing or orientation): the contrasts must be "
                             "co-registered and resampled onto the input's grid first (e.g. Resample Scalar/Vector/"
                             "DWI Volume with the input as reference)")
        volumes.append(volume)
    return volumes


def check_weights_path(operation: str, weights: str) -> None:
    """A CP-GAN weights *file* or a lesion weights *folder*; a clear error for the other kind."""
    import os

    if operation == LESION and not os.path.isdir(weights):
        raise InputError("the lesion method needs a weights folder (holding lesion_vae.safetensors and "
                         "lesion_diffusion.safetensors), not a file")
    if operation == REMODEL and not os.path.isfile(weights):
        raise InputError("CP-GAN needs a weights file (.safetensors)")


class AnonMRILogicCore:
    """Scene-level AnonMRI operations on MRML nodes (no Qt); ``AnonMRILogic`` in Slicer derives from it."""

    def __init__(self, scene=None) -> None:
        self._scene = scene

    # the Slicer logic overrides this to return slicer.mrmlScene
    def mrmlScene(self):
        return self._scene

    # --- step 1: nodes -> request ---------------------------------------------------------
    def prepare(self, method: str, volumeNode, brainMaskNode=None, lesionNode=None, weights=None,
                device: str = "auto", seed: int = 0, rotations: int = 0, samplingSteps: int = 0,
                lesionSegments: Optional[Sequence[str]] = None, exactLesion: bool = False,
                checkBrainMask: bool = True, otherVolumeNodes: Optional[Sequence] = None,
                contrasts: Optional[Sequence[str]] = None,
                variationStrength: Optional[float] = None,
                sliceThickness: Optional[float] = None) -> AnonymizationRequest:
        """Read the input nodes (main thread) into a request for :func:`run_request_outputs`.

        ``method``: a Method label (see :func:`method_labels`) or ``remodel`` / ``lesion`` / a
        removal baseline name. ``weights``: None for the bundled model, else a file (CP-GAN) or a
        folder (lesion: ``lesion_vae.safetensors`` + ``lesion_diffusion.safetensors``).
        ``rotations`` (CP-GAN's K) and ``samplingSteps`` (diffusion): 0 = the model's default.
        ``exactLesion``: lesion voxels copied bit for bit. ``checkBrainMask``: refuse a given brain
        mask that is not plausibly a brain. Lesion method only: ``otherVolumeNodes``, other
        contrasts of the patient on the input's grid; ``contrasts``, a name of
        :func:`contrast_choices` per volume, the input's first (None: from each node's name, else
        ``"auto"``); ``variationStrength``, the donor prior's learned variation in [0, 1] (None:
        the library's default); ``sliceThickness``, the input's slice thickness in mm for the donor's
        slab (None or 0: the spacing).
        """
        operation, removal = parse_method_label(method)
        if volumeNode is None:
            raise InputError("select an input volume")
        if operation != LESION and (otherVolumeNodes or contrasts or variationStrength is not None or sliceThickness):
            raise InputError("other contrasts, contrast names, the variation strength and the slice thickness "
                             "belong to the lesion-preserving method")
        image = mrml.volume_from_node(volumeNode)
        otherNodes = list(otherVolumeNodes or [])
        others = other_contrast_volumes(image, volumeNode, otherNodes)
        names = self._contrastNames([volumeNode] + otherNodes, contrasts) if operation == LESION else []
        brain = None
        if brainMaskNode is not None and uses_brain_mask(operation):
            brain = mrml.mask_from_node(brainMaskNode, volumeNode, what="brain mask")
        lesion = None
        if operation == LESION:
            if lesionNode is None:
                raise InputError("lesion-preserving anonymization needs a lesion segmentation")
            lesion = mrml.mask_from_node(lesionNode, volumeNode, names=lesionSegments, what="lesion segmentation")
        options: Dict[str, Any] = {}
        if operation == REMODEL and int(rotations) > 0:
            options["rotations"] = int(rotations)
        if operation == LESION and int(samplingSteps) > 0:
            options["sampling_steps"] = int(samplingSteps)
        if operation == LESION and exactLesion:
            options["exact_lesion"] = True
        if operation == LESION and variationStrength is not None:
            strength = float(variationStrength)
            if not 0.0 <= strength <= 1.0:
                raise InputError(f"the learned variation strength must lie in [0, 1], got {strength}")
            options["variation_strength"] = strength
        if operation == LESION and sliceThickness:
            thickness = float(sliceThickness)
            if not 0.0 < thickness < 100.0:
                raise InputError(f"the slice thickness must be a positive number of mm, got {thickness}")
            options["slice_thickness_mm"] = thickness
        weights_path = str(weights) if weights not in (None, "", ".") else None
        if method in REMODEL_PRIORS and weights_path is None:
            options["prior"] = REMODEL_PRIORS[method]
        if weights_path is not None:
            check_weights_path(operation, weights_path)
        for node in [volumeNode] + otherNodes:
            mark_original(node)
        return AnonymizationRequest(operation=operation, image=image, method=removal, brain_mask=brain,
                                    lesion_mask=lesion, weights=weights_path, device=str(device),
                                    seed=int(seed), options=options, input_node_id=volumeNode.GetID(),
                                    output_name=short_method_name(operation, removal),
                                    check_brain_mask=bool(checkBrainMask), other_images=others,
                                    contrasts=names, other_input_node_ids=[node.GetID() for node in otherNodes])

    @staticmethod
    def _contrastNames(volumeNodes: Sequence, contrasts: Optional[Sequence[str]]) -> List[str]:
        """A contrast name per volume node: ``contrasts`` checked, or guessed from the node names."""
        if contrasts is None:
            return [guess_contrast(node.GetName()) for node in volumeNodes]
        names = [str(name) for name in contrasts]
        if len(names) != len(volumeNodes):
            raise InputError(f"{len(volumeNodes)} volumes but {len(names)} contrast names; give one per volume, "
                             "the input's first")
        known = contrast_choices()
        for name in names:
            if name not in known:
                raise InputError(f"unknown contrast {name!r}; choose one of: {', '.join(known)}")
        return names

    # --- step 3: result -> node ------------------------------------------------------------
    def addOutput(self, request: AnonymizationRequest, output: Volume, volumeNode=None):
        """A new volume node holding ``output`` with a neutral name ("Anonymized 1 (CP-GAN)"), under
        the input's transform, in AnonMRI's subject-hierarchy folder."""
        method_name = request.output_name or short_method_name(request.operation, request.method)
        return self._addOutputNode(request, output, volumeNode, request.input_node_id, method_name)

    def addOutputs(self, request: AnonymizationRequest, outputs: Sequence[Volume], volumeNode=None) -> List:
        """One new volume node per output of :func:`run_request_outputs`, in the request's image order,
        each made from its own input node (its transform; what a DICOM export writes into). With
        other contrasts the neutral names say the contrast ("Anonymized 2 (lesion-preserving, T2w)";
        "contrast 2" for ``"auto"``); a single output is named as by :meth:`addOutput`."""
        if len(outputs) != len(request.images):
            raise AnonMRIError(f"{len(outputs)} outputs for {len(request.images)} images")
        if not request.other_images:
            return [self.addOutput(request, outputs[0], volumeNode)]
        method_name = request.output_name or short_method_name(request.operation, request.method)
        node_ids = [request.input_node_id] + list(request.other_input_node_ids)
        nodes = []
        for index, (output, contrast) in enumerate(zip(outputs, request.contrast_names())):
            label = contrast if contrast != AUTO_CONTRAST else f"contrast {index + 1}"
            nodes.append(self._addOutputNode(request, output, volumeNode if index == 0 else None,
                                             node_ids[index] if index < len(node_ids) else "",
                                             f"{method_name}, {label}"))
        return nodes

    def _addOutputNode(self, request: AnonymizationRequest, output: Volume, volumeNode, volumeNodeID: str,
                       method_name: str):
        """The node of one output: "Anonymized <n> (<method_name>)", under ``volumeNode``'s transform
        (or the node with ``volumeNodeID``), in AnonMRI's subject-hierarchy folder."""
        scene = self.mrmlScene()
        if volumeNode is None and volumeNodeID:
            volumeNode = scene.GetNodeByID(volumeNodeID)
        transform = volumeNode.GetParentTransformNode() if volumeNode is not None else None
        name = neutral_output_name(scene, method_name)
        node = mrml.add_volume_node(scene, output, name, parent_transform_node=transform)
        mark_result(node, ANONYMIZED_ROLE)
        node.SetAttribute(METHOD_ATTRIBUTE, request.method if request.operation == DEFACE else request.operation)
        if volumeNode is not None:
            node.SetAttribute(MADE_FROM_ATTRIBUTE, volumeNode.GetID())
        set_default_file_name(node, name)
        return node

    def addBrainMask(self, mask: Volume, outputNode=None, volumeNode=None):
        """The brain mask a run used, as an editable segmentation ("Brain mask 1") next to the output."""
        scene = self.mrmlScene()
        transform = volumeNode.GetParentTransformNode() if volumeNode is not None else None
        node = mrml.add_segmentation_node(scene, mask, neutral_name(scene, "Brain mask", BRAIN_MASK_ROLE),
                                          segment_name="brain", color=(0.9, 0.7, 0.2),
                                          parent_transform_node=transform)
        mark_result(node, BRAIN_MASK_ROLE)
        if volumeNode is not None:
            node.SetAttribute(COMPUTED_FOR_ATTRIBUTE, volumeNode.GetID())
        set_default_file_name(node, node.GetName())
        return node

    def process(self, method: str, volumeNode, brainMaskNode=None, lesionNode=None,
                progress: Optional[ProgressCallback] = None, **settings):
        """prepare -> run -> addOutputs in the calling thread; returns the new volume node (with
        ``otherVolumeNodes``: a list of new nodes, one per input volume, the input's first)."""
        request = self.prepare(method, volumeNode, brainMaskNode, lesionNode, **settings)
        outputs, _brain = run_request_outputs(request, progress)
        release_device_memory()
        nodes = self.addOutputs(request, outputs, volumeNode)
        return nodes if request.other_images else nodes[0]

    def inputOf(self, outputNode):
        """The volume node AnonMRI made ``outputNode`` from (its own contrast), or None."""
        nodeID = outputNode.GetAttribute(MADE_FROM_ATTRIBUTE) if outputNode is not None else None
        return self.mrmlScene().GetNodeByID(nodeID) if nodeID else None

    # --- export and scene privacy ---------------------------------------------------------------
    def exportAnonymized(self, node, path, originalNode=None,
                         fileForInstance: Optional[Callable[[str], str]] = None) -> str:
        """Write only the anonymized ``node`` to ``path`` (a format of :func:`export_formats`).

        An image file (``path`` with an image suffix) is written from the voxels and geometry alone
        (``AnonMRILib.io.writers``): no node name, attribute or subject-hierarchy value of the scene
        goes into it. A folder ``path`` (format "DICOM") gets a DICOM series: the library writes the
        voxels back into a copy of the original's series (``originalNode``, default: the volume the
        output was made from; its files from Slicer's DICOM database, or ``fileForInstance(uid)``),
        de-identified under DICOM PS3.15 (new UIDs, a pseudonymous patient). Into an existing
        folder that is not empty, the series goes into a new subfolder named like the node.
        Only AnonMRI's outputs can be exported this way. Returns the written path.
        """
        import os

        from AnonMRILib.io.formats import image_suffix

        if node is None or node.GetAttribute(ROLE_ATTRIBUTE) != ANONYMIZED_ROLE:
            raise InputError("only an anonymized volume made by AnonMRI can be exported here")
        path = str(path)
        if image_suffix(path) or dicom_writer(require_packages=False) is None:
            return str(export_volume(mrml.volume_from_node(node), path))
        if originalNode is None:
            made_from = node.GetAttribute(MADE_FROM_ATTRIBUTE)
            originalNode = self.mrmlScene().GetNodeByID(made_from) if made_from else None
            if originalNode is None:
                raise InputError("the volume this output was made from is no longer in the scene; DICOM export "
                                 "writes into the original's DICOM series")
        files = dicom_source_files(originalNode, fileForInstance)
        if os.path.isdir(path) and os.listdir(path):
            path = os.path.join(path, neutral_file_name(node.GetName(), ""))
        # the DICOM series' own frame: the node's voxel grid without any parent transform
        volume = mrml.volume_from_node(node, world=False)
        return export_dicom(volume, files, path, method=node.GetAttribute(METHOD_ATTRIBUTE) or "anonymized")

    def originalDataInScene(self) -> List[str]:
        """What a saved scene would still hold of the original study: the input volumes AnonMRI
        read and subject-hierarchy items carrying DICOM patient/study attributes (descriptions,
        never the values)."""
        return original_data_in_scene(self.mrmlScene())

    # --- console scripting -----------------------------------------------------------------
    def loadSample(self):
        """Add the embedded sample head and its brain mask (labelmap) to the scene; returns both nodes."""
        from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

        scene = self.mrmlScene()
        head = mrml.add_volume_node(scene, load_sample_head(), "AnonMRI sample head")
        brain = mrml.add_volume_node(scene, load_sample_brain_mask(), "AnonMRI sample brain", labelmap=True)
        return head, brain

    def remodelFace(self, volumeNode, brainMaskNode=None, weights=None, device: str = "auto", seed: int = 0,
                    progress: Optional[ProgressCallback] = None, rotations: int = 0, checkBrainMask: bool = True):
        """CP-GAN face remodeling; every brain voxel is kept. Returns the new volume node.

        ``checkBrainMask``: refuse a given brain mask that is not plausibly a brain."""
        return self.process(REMODEL, volumeNode, brainMaskNode, None, progress, weights=weights,
                            device=device, seed=seed, rotations=rotations, checkBrainMask=checkBrainMask)

    def anonymizeLesions(self, volumeNode, segmentationNode, brainMaskNode=None, weights=None,
                         device: str = "auto", seed: int = 0, samplingSteps: int = 0,
                         segments: Optional[Sequence[str]] = None, progress: Optional[ProgressCallback] = None,
                         exactLesion: bool = False, checkBrainMask: bool = True,
                         otherVolumeNodes: Optional[Sequence] = None, contrasts: Optional[Sequence[str]] = None,
                         variationStrength: Optional[float] = None, sliceThickness: Optional[float] = None):
        """Lesion-preserving anonymization with the lesion from ``segmentationNode`` (segments: all
        or the names given). ``weights``: None (shipped) or a folder. ``exactLesion``: lesion voxels
        kept bit for bit. Returns the new volume node.

        ``otherVolumeNodes``: other contrasts of the same patient, co-registered on ``volumeNode``'s
        grid (BraTS: T1c input, T1, T2, FLAIR), anonymized with it: one placed anatomy in every
        contrast; then a list of new nodes is returned, one per volume, ``volumeNode``'s first.
        ``contrasts``: a name per volume, ``volumeNode``'s first ("auto", "T1w", "T1c", "T2w",
        "PDw", "FLAIR"; None: from each node's name, else "auto"). ``variationStrength``: the donor
        prior's learned variation in [0, 1] (None: the library's default; 0: the placed donor alone).
        ``sliceThickness``: the input's slice thickness in mm (None: the spacing; see
        :func:`AnonMRIModuleLib.mrml.dicom_slice_thickness` for a DICOM-loaded node).
        """
        return self.process(LESION, volumeNode, brainMaskNode, segmentationNode, progress, weights=weights,
                            device=device, seed=seed, samplingSteps=samplingSteps, lesionSegments=segments,
                            exactLesion=exactLesion, checkBrainMask=checkBrainMask,
                            otherVolumeNodes=otherVolumeNodes, contrasts=contrasts,
                            variationStrength=variationStrength, sliceThickness=sliceThickness)

    def deface(self, volumeNode, method: str, brainMaskNode=None, progress: Optional[ProgressCallback] = None,
               device: str = "auto", checkBrainMask: bool = True):
        """A removal baseline (``method`` from :func:`removal_methods`). Returns the new volume node.

        ``device``: where a brain mask is computed when none is given."""
        operation, removal = parse_method_label(method)
        if operation != DEFACE:
            raise InputError(f"{method!r} is not a removal method; use one of: {', '.join(removal_methods())}")
        return self.process(REMOVAL_LABEL_PREFIX + removal, volumeNode, brainMaskNode, None, progress,
                            device=device, checkBrainMask=checkBrainMask)

    def renderFace(self, volumeNode, view: str = "anterior", size: int = 256, device: str = "cpu") -> np.ndarray:
        """The library's ray-cast face rendering of ``volumeNode``: (size, size) float image in [0, 1]."""
        function = library_function("render")
        image = mrml.volume_from_node(volumeNode)
        return np.asarray(call_with_supported_options(function, image, view=view, size=int(size), device=device))

    def prepareScores(self, originalNode, anonymizedNode, brainMaskNode=None, device: str = "auto") -> "ScoresRequest":
        """Read the nodes for :func:`run_scores` (main thread); ``device`` for a brain mask computed there."""
        if originalNode is None or anonymizedNode is None:
            raise InputError("select the original and the anonymized volume")
        original = mrml.volume_from_node(originalNode)
        anonymized = mrml.volume_from_node(anonymizedNode)
        if not original.same_grid(anonymized):
            raise InputError("the anonymized volume does not lie on the original's grid")
        brain = mrml.mask_from_node(brainMaskNode, originalNode, what="brain mask") if brainMaskNode else None
        return ScoresRequest(original, anonymized, brain, str(device))

    def scores(self, originalNode, anonymizedNode, brainMaskNode=None,
               progress: Optional[ProgressCallback] = None) -> Dict[str, Any]:
        """Per-scan scores of ``anonymizedNode`` against ``originalNode`` (same grid), as a dict."""
        return run_scores(self.prepareScores(originalNode, anonymizedNode, brainMaskNode), progress)

    def scoresTable(self, scores: Dict[str, Any], tableNode=None, name: Optional[str] = None):
        """Show ``scores`` in a table node (new, named "Scores 1", unless ``tableNode`` is given):
        first the verdict ("Verdict", as ``scan_scores`` says it), its explanations, then the evidence."""
        scene = self.mrmlScene()
        if tableNode is None:
            name = name or neutral_name(scene, "Scores", SCORES_ROLE)
        table = mrml.scores_table_node(scene, scores, name=name or tableNode.GetName(), table_node=tableNode)
        mark_result(table, SCORES_ROLE)
        set_default_file_name(table, table.GetName())
        return table

    def scoresSummary(self, scores) -> str:
        """The status line after scoring (see :func:`scores_summary`); ``scores``: the dict, or a
        scores table node."""
        if hasattr(scores, "GetTable"):
            scores = mrml.scores_from_table_node(scores)
        return scores_summary(scores)
