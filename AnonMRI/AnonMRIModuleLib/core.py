"""The AnonMRI module's logic without Qt: MRML nodes in, library call, MRML nodes out.

Every operation is split in three so the panel can run the slow middle part off the GUI thread:

1. :meth:`AnonMRILogicCore.prepare` (main thread) reads the nodes into :class:`Volume` s and
   returns an :class:`AnonymizationRequest` that holds no MRML object;
2. :func:`run_request` (any thread) calls the library (``AnonMRILib.pipelines...``) with a
   ``progress(fraction, message)`` callback, which may raise :class:`~AnonMRILib.progress.Cancelled`;
3. :meth:`AnonMRILogicCore.addOutput` (main thread) puts the result into a new volume node named
   after the input, under the input's parent transform.

The console methods (``remodelFace``, ``anonymizeLesions``, ``deface``, ``renderFace``, ``scores``)
chain the three in the calling thread. Library functions are imported when first used; a pipeline
that this AnonMRILib does not have raises :class:`MissingFeatureError` with a clear message.
"""
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from AnonMRILib.errors import AnonMRIError, DependencyError, InputError
from AnonMRILib.io.volume import Volume
from AnonMRILib.progress import ProgressCallback, report

from . import mrml

#: operation keys
REMODEL = "remodel"
LESION = "lesion"
DEFACE = "deface"

#: labels of the panel's Method combo box (the parameter node stores the label)
REMODEL_LABEL = "CP-GAN face remodeling"
LESION_LABEL = "Lesion-preserving anonymization"
REMOVAL_LABEL_PREFIX = "Removal baseline: "

#: removal baselines listed when ``AnonMRILib.pipelines.baselines`` cannot be imported to ask it
FALLBACK_REMOVAL_METHODS = ("quickshear", "facemask", "deface", "skullstrip", "blur", "black")

#: library entry points: operation -> (module, function, what a user would call it)
LIBRARY_FUNCTIONS = {
    REMODEL: ("AnonMRILib.pipelines.remodel", "remodel_face", "CP-GAN face remodeling"),
    LESION: ("AnonMRILib.pipelines.lesion", "anonymize_lesions", "Lesion-preserving anonymization"),
    DEFACE: ("AnonMRILib.pipelines.baselines", "deface", "The removal-baseline pipeline"),
    "render": ("AnonMRILib.rendering", "render_face", "Face rendering"),
    "scores": ("AnonMRILib.evaluation.scores", "scan_scores", "Per-scan scoring"),
}


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


def removal_methods() -> List[str]:
    """Names of the removal baselines, as ``AnonMRILib.pipelines.baselines.REMOVAL_METHODS`` lists them."""
    try:
        module = importlib.import_module("AnonMRILib.pipelines.baselines")
        methods = getattr(module, "REMOVAL_METHODS")
    except (ImportError, AttributeError):
        return list(FALLBACK_REMOVAL_METHODS)
    return [str(name) for name in methods]


def method_labels() -> List[str]:
    """Every entry of the panel's Method combo box, CP-GAN first."""
    return [REMODEL_LABEL, LESION_LABEL] + [REMOVAL_LABEL_PREFIX + name for name in removal_methods()]


def parse_method_label(label: str):
    """``(operation, removal method or None)`` for a Method combo-box label (or a bare method key)."""
    if label in (REMODEL_LABEL, REMODEL, "cpgan", "CP-GAN"):
        return REMODEL, None
    if label in (LESION_LABEL, LESION):
        return LESION, None
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
    (``rotations``, ``sampling_steps``: None = the model's default).
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


def run_request(request: AnonymizationRequest, progress: Optional[ProgressCallback] = None) -> Volume:
    """Run the library for ``request`` (any thread; touches no MRML) and return the output Volume."""
    report(progress, 0.0, f"starting {short_method_name(request.operation, request.method)}")
    if request.operation == REMODEL:
        function = library_function(REMODEL)
        result = call_with_supported_options(
            function, request.image, brain_mask=request.brain_mask, weights=request.weights,
            device=request.device, seed=request.seed, progress=progress, **request.options)
    elif request.operation == LESION:
        if request.lesion_mask is None:
            raise InputError("lesion-preserving anonymization needs a lesion segmentation")
        function = library_function(LESION)
        options = dict(request.options)
        steps = options.pop("sampling_steps", None)
        if steps:  # the panel's "sampling steps" are the lesion pipeline's DDIM steps
            from AnonMRILib.pipelines.lesion import LesionAnonymizationConfig

            options["config"] = LesionAnonymizationConfig(steps=int(steps))
        result = call_with_supported_options(
            function, request.image, request.lesion_mask, brain_mask=request.brain_mask,
            weights=request.weights, device=request.device, seed=request.seed, progress=progress,
            droppable=("device", "progress", "brain_mask"), **options)
    elif request.operation == DEFACE:
        function = library_function(DEFACE)
        result = call_with_supported_options(
            function, request.image, request.method, brain_mask=request.brain_mask, progress=progress,
            seed=request.seed, droppable=("device", "progress", "seed", "weights"), device=request.device)
    else:
        raise InputError(f"unknown operation {request.operation!r}")
    output = as_result_volume(result)
    if output.shape != request.image.shape:
        raise AnonMRIError(f"the pipeline returned shape {output.shape}, not the input's {request.image.shape}")
    report(progress, 1.0, "done")
    return output


@dataclass
class ScoresRequest:
    """The volumes :func:`run_scores` compares (world RAS, same grid); no MRML object."""

    original: Volume
    anonymized: Volume
    brain_mask: Optional[Volume] = None


def run_scores(request: ScoresRequest, progress: Optional[ProgressCallback] = None) -> Dict[str, Any]:
    """``AnonMRILib.evaluation.scores.scan_scores`` for ``request`` (any thread)."""
    function = library_function("scores")
    return dict(call_with_supported_options(function, request.original, request.anonymized,
                                            brain_mask=request.brain_mask, progress=progress))


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
                lesionSegments: Optional[Sequence[str]] = None) -> AnonymizationRequest:
        """Read the input nodes (main thread) into a request for :func:`run_request`.

        ``method``: a Method label (see :func:`method_labels`) or ``remodel`` / ``lesion`` / a
        removal baseline name. ``weights``: None for the bundled model or a file path.
        ``rotations`` (CP-GAN's K) and ``samplingSteps`` (diffusion): 0 = the model's default.
        """
        operation, removal = parse_method_label(method)
        if volumeNode is None:
            raise InputError("select an input volume")
        image = mrml.volume_from_node(volumeNode)
        brain = mrml.mask_from_node(brainMaskNode, volumeNode, what="brain mask") if brainMaskNode else None
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
        weights_path = str(weights) if weights not in (None, "", ".") else None
        name = f"{volumeNode.GetName()} anonymized ({short_method_name(operation, removal)})"
        return AnonymizationRequest(operation=operation, image=image, method=removal, brain_mask=brain,
                                    lesion_mask=lesion, weights=weights_path, device=str(device),
                                    seed=int(seed), options=options, input_node_id=volumeNode.GetID(),
                                    output_name=name)

    # --- step 3: result -> node ------------------------------------------------------------
    def addOutput(self, request: AnonymizationRequest, output: Volume, volumeNode=None):
        """A new volume node holding ``output``, named after the input, under the input's transform."""
        scene = self.mrmlScene()
        if volumeNode is None and request.input_node_id:
            volumeNode = scene.GetNodeByID(request.input_node_id)
        transform = volumeNode.GetParentTransformNode() if volumeNode is not None else None
        return mrml.add_volume_node(scene, output, request.output_name or "anonymized",
                                    parent_transform_node=transform)

    def process(self, method: str, volumeNode, brainMaskNode=None, lesionNode=None,
                progress: Optional[ProgressCallback] = None, **settings):
        """prepare -> run -> addOutput in the calling thread; returns the new volume node."""
        request = self.prepare(method, volumeNode, brainMaskNode, lesionNode, **settings)
        return self.addOutput(request, run_request(request, progress), volumeNode)

    # --- console scripting -----------------------------------------------------------------
    def loadSample(self):
        """Add the embedded sample head and its brain mask (labelmap) to the scene; returns both nodes."""
        from AnonMRILib.sample_data import load_sample_brain_mask, load_sample_head

        scene = self.mrmlScene()
        head = mrml.add_volume_node(scene, load_sample_head(), "AnonMRI sample head")
        brain = mrml.add_volume_node(scene, load_sample_brain_mask(), "AnonMRI sample brain", labelmap=True)
        return head, brain

    def remodelFace(self, volumeNode, brainMaskNode=None, weights=None, device: str = "auto", seed: int = 0,
                    progress: Optional[ProgressCallback] = None, rotations: int = 0):
        """CP-GAN face remodeling; every brain voxel is kept. Returns the new volume node."""
        return self.process(REMODEL, volumeNode, brainMaskNode, None, progress, weights=weights,
                            device=device, seed=seed, rotations=rotations)

    def anonymizeLesions(self, volumeNode, segmentationNode, brainMaskNode=None, weights=None,
                         device: str = "auto", seed: int = 0, samplingSteps: int = 0,
                         segments: Optional[Sequence[str]] = None, progress: Optional[ProgressCallback] = None):
        """Lesion-preserving anonymization with the lesion from ``segmentationNode`` (segments: all
        or the names given). Returns the new volume node."""
        return self.process(LESION, volumeNode, brainMaskNode, segmentationNode, progress, weights=weights,
                            device=device, seed=seed, samplingSteps=samplingSteps, lesionSegments=segments)

    def deface(self, volumeNode, method: str, brainMaskNode=None, progress: Optional[ProgressCallback] = None):
        """A removal baseline (``method`` from :func:`removal_methods`). Returns the new volume node."""
        operation, removal = parse_method_label(method)
        if operation != DEFACE:
            raise InputError(f"{method!r} is not a removal method; use one of: {', '.join(removal_methods())}")
        return self.process(REMOVAL_LABEL_PREFIX + removal, volumeNode, brainMaskNode, None, progress)

    def renderFace(self, volumeNode, view: str = "anterior", size: int = 256, device: str = "cpu") -> np.ndarray:
        """The library's ray-cast face rendering of ``volumeNode``: (size, size) float image in [0, 1]."""
        function = library_function("render")
        image = mrml.volume_from_node(volumeNode)
        return np.asarray(call_with_supported_options(function, image, view=view, size=int(size), device=device))

    def prepareScores(self, originalNode, anonymizedNode, brainMaskNode=None) -> "ScoresRequest":
        """Read the nodes for :func:`run_scores` (main thread)."""
        if originalNode is None or anonymizedNode is None:
            raise InputError("select the original and the anonymized volume")
        original = mrml.volume_from_node(originalNode)
        anonymized = mrml.volume_from_node(anonymizedNode)
        if not original.same_grid(anonymized):
            raise InputError("the anonymized volume does not lie on the original's grid")
        brain = mrml.mask_from_node(brainMaskNode, originalNode, what="brain mask") if brainMaskNode else None
        return ScoresRequest(original, anonymized, brain)

    def scores(self, originalNode, anonymizedNode, brainMaskNode=None,
               progress: Optional[ProgressCallback] = None) -> Dict[str, Any]:
        """Per-scan scores of ``anonymizedNode`` against ``originalNode`` (same grid), as a dict."""
        return run_scores(self.prepareScores(originalNode, anonymizedNode, brainMaskNode), progress)

    def scoresTable(self, scores: Dict[str, Any], tableNode=None, name: str = "AnonMRI scores"):
        """Show ``scores`` in a table node (new unless ``tableNode`` is given)."""
        return mrml.scores_table_node(self.mrmlScene(), scores, name=name, table_node=tableNode)
