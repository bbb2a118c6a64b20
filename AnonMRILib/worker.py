"""Run one library call in a separate process and report its progress as lines on stdout.

The 3D Slicer panel (and any other GUI) starts ``python -m AnonMRILib.worker JOB_FOLDER/job.json``
so that long work (remodeling, lesion anonymization, brain masks, renderings, scores) never holds
the GUI's Python interpreter; it polls the process and kills it to cancel.

A job folder (created private by :func:`create_job_folder`) holds:

- ``job.json``: ``{"entry": "package.module:function", "python_path": [...], "volumes":
  {"image": "image.volume.npy", ...}, "options": {...}}``;
- the input volumes under neutral names (``image.volume.npy`` with its affine in
  ``image.volume.json``, ``brain_mask.volume.npy``, ...: never a patient's). Raw ``.npy`` voxels and
  a JSON affine are exact both ways and fast to write (the GUI thread writes them): a compressed
  NRRD of a 1.5 mm head took ~2 s.

The worker calls ``function(volumes, options, progress)`` with the volumes read back as
:class:`~AnonMRILib.io.volume.Volume` s, and writes what it returns (a mapping) into the same folder:
a Volume as ``<key>.volume.npy`` + ``.volume.json``, a numpy array as ``<key>.npy``, anything else
into ``result.json``.
It prints one line per event, ``ANONMRI {"event": ...}`` (see :func:`parse_line`):

- ``{"event": "progress", "fraction": 0.4, "message": "..."}``;
- ``{"event": "done", "outputs": {"output": "output.volume.npy"}}`` (exit status 0);
- ``{"event": "error", "type": "InputError", "message": "...", "traceback": "..."}`` (exit status 2
  for an :class:`~AnonMRILib.errors.AnonMRIError`, 1 otherwise).

:func:`read_outputs` reads the results back. Nothing here imports a GUI toolkit.
"""
import importlib
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import numpy as np

from .errors import AnonMRIError, DependencyError, InputError
from .io.volume import Volume

#: prefix of every event line the worker prints (other lines on stdout/stderr are log text)
LINE_PREFIX = "ANONMRI "
JOB_FILE = "job.json"
RESULT_FILE = "result.json"
VOLUME_SUFFIX = ".volume.npy"
AFFINE_SUFFIX = ".volume.json"


def create_job_folder(parent: Optional[str] = None) -> Path:
    """A new private folder (mode 0700 on POSIX) for one job's files; the caller deletes it."""
    folder = Path(tempfile.mkdtemp(prefix="anonmri-job-", dir=parent))
    if os.name == "posix":
        os.chmod(folder, 0o700)
    return folder


def write_job(folder: Path, entry: str, volumes: Mapping[str, Volume], options: Optional[Mapping] = None,
              python_path: Sequence[str] = ()) -> Path:
    """Write the volumes (``<key>.volume.npy``; keys are neutral words) and ``job.json``; returns its path.

    ``entry`` is ``"module:function"``; ``options`` must be JSON-serialisable.
    """
    folder = Path(folder)
    files = {}
    for key, volume in volumes.items():
        if volume is None:
            continue
        _check_key(key)
        files[key] = save_job_volume(volume, folder, key)
    job = {"entry": str(entry), "python_path": [str(p) for p in python_path], "volumes": files,
           "options": dict(options or {})}
    path = folder / JOB_FILE
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def _check_key(key: str) -> None:
    if not key or not key.replace("_", "").isalnum():
        raise InputError(f"job file key {key!r}: use letters, digits and '_' only")


def save_job_volume(volume: Volume, folder: Path, key: str) -> str:
    """Write ``volume`` as ``<key>.volume.npy`` (voxels) + ``<key>.volume.json`` (affine); returns the .npy name."""
    name = key + VOLUME_SUFFIX
    np.save(Path(folder) / name, np.asarray(volume.array), allow_pickle=False)
    (Path(folder) / (key + AFFINE_SUFFIX)).write_text(
        json.dumps(np.asarray(volume.affine, dtype=np.float64).tolist()), encoding="utf-8")
    return name


def load_job_volume(folder: Path, name: str) -> Volume:
    """The Volume :func:`save_job_volume` wrote (exact voxels and affine)."""
    if not name.endswith(VOLUME_SUFFIX):
        raise InputError(f"{name}: not a job volume")
    key = name[: -len(VOLUME_SUFFIX)]
    affine = np.array(json.loads((Path(folder) / (key + AFFINE_SUFFIX)).read_text(encoding="utf-8")))
    return Volume(np.load(Path(folder) / name, allow_pickle=False), affine)


def event_line(event: str, **fields: Any) -> str:
    """One event line as printed by the worker."""
    return LINE_PREFIX + json.dumps(dict(event=event, **fields))


def parse_line(line: str) -> Optional[Dict[str, Any]]:
    """The event of a worker's output line, or None for a log line."""
    line = line.rstrip("\r\n")
    if not line.startswith(LINE_PREFIX):
        return None
    try:
        event = json.loads(line[len(LINE_PREFIX):])
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def resolve_entry(entry: str) -> Callable:
    """The function named ``"package.module:function"``."""
    module_name, _, function_name = str(entry).partition(":")
    if not module_name or not function_name:
        raise InputError(f"job entry {entry!r}: expected 'package.module:function'")
    function = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(function):
        raise InputError(f"job entry {entry!r}: {module_name} has no function {function_name}")
    return function


def write_outputs(folder: Path, result: Mapping[str, Any]) -> Dict[str, str]:
    """Write a job's result mapping into ``folder`` (see the module docstring); returns key -> file."""
    if not isinstance(result, Mapping):
        raise AnonMRIError(f"a worker entry must return a mapping, not a {type(result).__name__}")
    files: Dict[str, str] = {}
    plain: Dict[str, Any] = {}
    for key, value in result.items():
        _check_key(key)
        if isinstance(value, Volume):
            files[key] = save_job_volume(value, folder, key)
        elif isinstance(value, np.ndarray):
            files[key] = key + ".npy"
            np.save(Path(folder) / files[key], value, allow_pickle=False)
        else:
            plain[key] = value
    if plain:
        (Path(folder) / RESULT_FILE).write_text(json.dumps(plain, default=_plain_value), encoding="utf-8")
        files.update({key: RESULT_FILE for key in plain})
    return files


def _plain_value(value: Any) -> Any:
    """numpy scalars and arrays as JSON numbers and lists (``json.dumps`` default)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def read_outputs(folder: Path, files: Mapping[str, str]) -> Dict[str, Any]:
    """Read back what :func:`write_outputs` wrote (Volumes, arrays, JSON values)."""
    folder = Path(folder)
    plain = None
    result: Dict[str, Any] = {}
    for key, name in files.items():
        if name == RESULT_FILE:
            if plain is None:
                plain = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
            result[key] = plain[key]
        elif name.endswith(VOLUME_SUFFIX):
            result[key] = load_job_volume(folder, name)
        else:
            result[key] = np.load(folder / name, allow_pickle=False)
    return result


def run_job(job_path: Path, out=None) -> int:
    """Run the job of ``job_path``, printing event lines to ``out`` (stdout); returns the exit status."""
    out = out or sys.stdout

    def emit(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    def progress(fraction: float, message: str) -> None:
        emit(event_line("progress", fraction=min(1.0, max(0.0, float(fraction))), message=str(message)))

    try:
        job_path = Path(job_path)
        job = json.loads(job_path.read_text(encoding="utf-8"))
        for path in reversed(job.get("python_path", [])):
            if path not in sys.path:
                sys.path.insert(0, path)
        function = resolve_entry(job["entry"])
        volumes = {key: load_job_volume(job_path.parent, name) for key, name in job.get("volumes", {}).items()}
        result = function(volumes, dict(job.get("options", {})), progress)
        files = write_outputs(job_path.parent, result)
    except BaseException as error:  # reported to the parent as one parseable line
        if isinstance(error, ImportError) and not isinstance(error, AnonMRIError):
            missing = getattr(error, "name", None) or str(error)
            error = DependencyError(f"this method needs the Python package '{missing}', which cannot be imported "
                                    f"here ({error})")
        emit(event_line("error", type=type(error).__name__, message=str(error),
                        user_error=isinstance(error, AnonMRIError), traceback=traceback.format_exc()))
        return 2 if isinstance(error, AnonMRIError) else 1
    emit(event_line("done", outputs=files))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        sys.stderr.write("usage: python -m AnonMRILib.worker JOB.json\n")
        return 2
    return run_job(Path(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
