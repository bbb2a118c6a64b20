"""Worker entries: what the panel runs in a separate process (``AnonMRILib.worker``).

Each entry is ``function(volumes, options, progress) -> mapping`` (see :mod:`AnonMRILib.worker`);
the panel names one as ``"AnonMRIModuleLib.jobs:<function>"`` in a :class:`~.tasks.ProcessTask`.
They call the same functions as the console API (:func:`.core.run_request`, ...), touch no MRML
and import neither Qt nor slicer, so they run in ``PythonSlicer`` and in any Python.

:func:`request_job` / :func:`scores_job` turn a request into ``(entry, volumes, options)``.
"""
from typing import Any, Dict, List, Mapping, Optional, Tuple

from AnonMRILib.io.volume import Volume
from AnonMRILib.progress import ProgressCallback, report, sub_progress

from . import core

ANONYMIZE = "AnonMRIModuleLib.jobs:anonymize"
BRAIN_MASK = "AnonMRIModuleLib.jobs:brain_mask"
RENDER = "AnonMRIModuleLib.jobs:render"
SCORES = "AnonMRIModuleLib.jobs:scores"

#: the request fields that travel as JSON (the Volumes travel as files)
_REQUEST_FIELDS = ("operation", "method", "weights", "device", "seed", "options", "output_name",
                   "check_brain_mask", "contrasts")
#: job-file keys of the other contrasts' images and outputs: ``other_image_1``, ``other_output_1``, ...
OTHER_IMAGE_KEY = "other_image_{}"
OTHER_OUTPUT_KEY = "other_output_{}"


def _numbered(mapping: Mapping[str, Any], key_pattern: str) -> List[Any]:
    """The values under ``key_pattern.format(1)``, ``.format(2)``, ... up to the first missing key."""
    values = []
    while key_pattern.format(len(values) + 1) in mapping:
        values.append(mapping[key_pattern.format(len(values) + 1)])
    return values


def request_job(request: "core.AnonymizationRequest") -> Tuple[str, Dict[str, Volume], Dict[str, Any]]:
    """``(entry, volumes, options)`` of a :class:`~.core.AnonymizationRequest` for a ProcessTask."""
    volumes = {"image": request.image, "brain_mask": request.brain_mask, "lesion_mask": request.lesion_mask}
    for number, other in enumerate(request.other_images, start=1):
        volumes[OTHER_IMAGE_KEY.format(number)] = other
    options = {name: getattr(request, name) for name in _REQUEST_FIELDS}
    return ANONYMIZE, {k: v for k, v in volumes.items() if v is not None}, options


def request_from_job(volumes: Mapping[str, Volume], options: Mapping[str, Any]) -> "core.AnonymizationRequest":
    """The request :func:`request_job` described, rebuilt in the worker."""
    fields = {name: options[name] for name in _REQUEST_FIELDS if name in options}
    return core.AnonymizationRequest(image=volumes["image"], brain_mask=volumes.get("brain_mask"),
                                     lesion_mask=volumes.get("lesion_mask"),
                                     other_images=_numbered(volumes, OTHER_IMAGE_KEY), **fields)


def outputs_from_result(result: Mapping[str, Any]) -> List[Volume]:
    """The output Volumes of an :func:`anonymize` result, in the request's image order."""
    return [result["output"]] + _numbered(result, OTHER_OUTPUT_KEY)


def anonymize(volumes: Mapping[str, Volume], options: Mapping[str, Any],
              progress: Optional[ProgressCallback] = None) -> Dict[str, Any]:
    """The anonymized volume (``output``; other contrasts' outputs ``other_output_1``, ...) and, when
    it was computed here, the brain mask used."""
    request = request_from_job(volumes, options)
    outputs, brain = core.run_request_outputs(request, progress)
    result: Dict[str, Any] = {"output": outputs[0]}
    for number, output in enumerate(outputs[1:], start=1):
        result[OTHER_OUTPUT_KEY.format(number)] = output
    if brain is not None and request.brain_mask is None:
        result["brain_mask"] = brain
    core.release_device_memory()
    return result


def brain_mask(volumes: Mapping[str, Volume], options: Mapping[str, Any],
               progress: Optional[ProgressCallback] = None) -> Dict[str, Any]:
    """The library's brain mask of ``image`` on the chosen device (``brain_mask``)."""
    mask = core.compute_brain_mask(volumes["image"], device=str(options.get("device", "auto")), progress=progress)
    core.release_device_memory()
    return {"brain_mask": mask}


def render(volumes: Mapping[str, Volume], options: Mapping[str, Any],
           progress: Optional[ProgressCallback] = None) -> Dict[str, Any]:
    """Face renderings of ``image`` (and ``output`` when given): ``image_0``, ``image_1`` arrays."""
    import numpy as np

    render_face = core.library_function("render")
    keys = [key for key in ("image", "output") if key in volumes]
    result: Dict[str, Any] = {}
    for index, key in enumerate(keys):
        report(progress, index / len(keys), f"rendering face {index + 1}")
        image = core.call_with_supported_options(
            render_face, volumes[key], view=str(options.get("view", "anterior")), size=int(options.get("size", 256)),
            device=str(options.get("device", "auto")))
        result[f"image_{index}"] = np.asarray(image, dtype=np.float32)
    report(progress, 1.0, "done")
    core.release_device_memory()
    return result


def scores_job(request: "core.ScoresRequest") -> Tuple[str, Dict[str, Volume], Dict[str, Any]]:
    """``(entry, volumes, options)`` of a :class:`~.core.ScoresRequest`."""
    volumes = {"original": request.original, "anonymized": request.anonymized, "brain_mask": request.brain_mask}
    return SCORES, {k: v for k, v in volumes.items() if v is not None}, {"device": request.device}


def scores(volumes: Mapping[str, Volume], options: Mapping[str, Any],
           progress: Optional[ProgressCallback] = None) -> Dict[str, Any]:
    """Per-scan scores (``scores``: a flat ``{name: value}``)."""
    from .mrml import flatten_scores

    request = core.ScoresRequest(volumes["original"], volumes["anonymized"], volumes.get("brain_mask"),
                                 str(options.get("device", "auto")))
    values = core.run_scores(request, sub_progress(progress, 0.0, 1.0))
    core.release_device_memory()
    return {"scores": dict(flatten_scores(values))}
