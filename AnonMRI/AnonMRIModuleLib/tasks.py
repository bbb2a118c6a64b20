"""Long work in a separate Python process, polled by the panel (no Qt in here).

Slicer's PythonQt main thread holds the GIL whenever Python is idle, so a worker *thread* would
only run in the gaps of the GUI's timer. A :class:`ProcessTask` instead writes its input volumes
into a private job folder (``AnonMRILib.worker``: mode 0700, neutral names such as
``image.volume.npy``), starts ``PythonSlicer -m AnonMRILib.worker job.json`` (outside Slicer:
``sys.executable``) and reads the worker's event lines from its stdout in a small reader thread
that only waits on the pipe. The panel calls :meth:`ProcessTask.status` from a ``qt.QTimer``
through a :class:`JobPoller` (the timer is injected, so tests drive it without Qt). Cancel kills the
whole process tree at once; the job folder is deleted when the task ends, however it ends (and at
interpreter exit for a task still running).
"""
import collections
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from AnonMRILib import errors as library_errors
from AnonMRILib.worker import create_job_folder, parse_line, read_outputs, write_job

PENDING, RUNNING, DONE, FAILED, CANCELLED = "pending", "running", "done", "failed", "cancelled"

#: the folder holding the ``AnonMRILib`` package (put on the worker's PYTHONPATH)
LIBRARY_ROOT = str(Path(library_errors.__file__).resolve().parent.parent)
#: the folder holding ``AnonMRIModuleLib`` (worker entries of the module live there)
MODULE_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True)
class TaskStatus:
    """What the panel shows: ``state``, ``fraction`` in [0, 1], the last progress ``message``."""

    state: str
    fraction: float
    message: str
    elapsed_s: float

    @property
    def finished(self) -> bool:
        return self.state in (DONE, FAILED, CANCELLED)


def python_executable(candidates: Sequence[str] = ()) -> str:
    """The Python to run the worker with.

    The first existing file of ``candidates`` (the panel passes Slicer's ``bin/PythonSlicer``),
    else ``PythonSlicer`` on the PATH when running inside Slicer (``sys.executable`` is then the
    application), else ``sys.executable``.
    """
    for candidate in candidates:
        if candidate and os.path.isfile(candidate):
            return str(candidate)
    executable_name = os.path.basename(sys.executable).lower()
    if not executable_name.startswith("python"):  # embedded in an application (Slicer)
        found = shutil.which("PythonSlicer")
        if found:
            return found
    return sys.executable


def kill_process_tree(process: subprocess.Popen) -> None:
    """Kill ``process`` and every process it started (it runs in its own session / group)."""
    if process.poll() is not None:
        return
    try:
        if os.name == "posix":
            os.killpg(process.pid, signal.SIGKILL)
        else:
            subprocess.run(["taskkill", "/F", "/T", "/PID", str(process.pid)], capture_output=True, check=False)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        process.kill()
    except OSError:
        pass


def _finalize(process_holder: List[Optional[subprocess.Popen]], folder: str) -> None:
    """Kill a still-running worker and delete the job folder (task end, garbage collection, exit)."""
    process = process_holder[0]
    if process is not None:
        kill_process_tree(process)
        try:
            process.wait(5)
        except (subprocess.TimeoutExpired, OSError):
            pass
    shutil.rmtree(folder, ignore_errors=True)


def _rebuild_error(event: Mapping[str, Any]) -> BaseException:
    """The worker's error as an exception of the same AnonMRILib class where there is one."""
    name = str(event.get("type", ""))
    message = str(event.get("message", "the worker failed"))
    cls = getattr(library_errors, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls(message)
    if event.get("user_error"):
        return library_errors.AnonMRIError(message)
    return RuntimeError(f"{name}: {message}" if name else message)


class ProcessTask:
    """One library call ``entry(volumes, options, progress)`` in a separate Python process.

    ``entry``: ``"package.module:function"`` importable in the worker (``AnonMRIModuleLib.jobs``
    or ``AnonMRILib...``; ``python_path``: extra folders to import it from). ``volumes``: the input
    Volumes under neutral keys. ``options``: JSON values. After :meth:`start`, poll :meth:`status`; when it is ``done`` the function's result
    mapping is in :attr:`result`, when ``failed`` the error is in :attr:`error`.
    """

    def __init__(self, entry: str, volumes: Mapping[str, Any], options: Optional[Mapping[str, Any]] = None,
                 name: str = "AnonMRI", python: Optional[str] = None, python_candidates: Sequence[str] = (),
                 environment: Optional[Mapping[str, str]] = None, temporary_parent: Optional[str] = None,
                 python_path: Sequence[str] = ()) -> None:
        self._entry = entry
        self._volumes = dict(volumes)
        self._options = dict(options or {})
        self.name = name
        self._python = python or python_executable(python_candidates)
        self._environment = dict(environment or {})
        self._temporary_parent = temporary_parent
        self._python_path = [str(p) for p in python_path]
        self._lock = threading.Lock()
        self._state = PENDING
        self._fraction = 0.0
        self._message = ""
        self._started_at = 0.0
        self._ended_at = 0.0
        self._events: "collections.deque" = collections.deque()
        self.log: "collections.deque" = collections.deque(maxlen=200)
        self._process_holder: List[Optional[subprocess.Popen]] = [None]
        self._reader: Optional[threading.Thread] = None
        self._finalizer = None
        self.folder: Optional[Path] = None
        self._outputs: Optional[Dict[str, str]] = None
        self._error_event: Optional[Dict[str, Any]] = None
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.error_traceback = ""

    @property
    def process(self) -> Optional[subprocess.Popen]:
        return self._process_holder[0]

    # --- start ---------------------------------------------------------------------------------
    def command(self, job_path: Path) -> List[str]:
        return [self._python, "-m", "AnonMRILib.worker", str(job_path)]

    def start(self) -> "ProcessTask":
        """Write the job folder and start the worker process (once)."""
        if self._state != PENDING:
            raise RuntimeError("a ProcessTask can be started only once")
        self._state = RUNNING
        self._started_at = time.monotonic()
        self.folder = create_job_folder(self._temporary_parent)
        self._finalizer = weakref.finalize(self, _finalize, self._process_holder, str(self.folder))
        try:
            job_path = write_job(self.folder, self._entry, self._volumes, self._options,
                                 python_path=self._python_path + [MODULE_ROOT, LIBRARY_ROOT])
            self._volumes = {}  # the files hold them now; free the memory
            environment = dict(os.environ)
            environment.update(self._environment)
            environment["PYTHONPATH"] = os.pathsep.join(
                [LIBRARY_ROOT] + [p for p in environment.get("PYTHONPATH", "").split(os.pathsep) if p])
            environment["PYTHONUNBUFFERED"] = "1"
            options: Dict[str, Any] = {}
            if os.name == "posix":
                options["start_new_session"] = True
            else:
                options["creationflags"] = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0) | getattr(
                    subprocess, "CREATE_NO_WINDOW", 0)
            process = subprocess.Popen(self.command(job_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=str(self.folder), env=environment,
                                       universal_newlines=True, encoding="utf-8", errors="replace", **options)
        except BaseException as error:
            self._fail(error, traceback.format_exc())
            return self
        self._process_holder[0] = process
        self._reader = threading.Thread(target=self._read_lines, args=(process.stdout,),
                                        name=f"{self.name} output", daemon=True)
        self._reader.start()
        return self

    def _read_lines(self, stream) -> None:
        """Reader thread: waits on the pipe (no GIL held while waiting), queues each line."""
        try:
            for line in stream:
                self._events.append(line)
        except (OSError, ValueError):
            pass

    # --- poll ----------------------------------------------------------------------------------
    def _drain(self) -> None:
        while self._events:
            line = self._events.popleft()
            event = parse_line(line)
            if event is None:
                self.log.append(line.rstrip("\n"))
            elif event["event"] == "progress":
                self._fraction = float(event.get("fraction", self._fraction))
                self._message = str(event.get("message", ""))
            elif event["event"] == "done":
                self._outputs = dict(event.get("outputs", {}))
            elif event["event"] == "error":
                self._error_event = event

    def poll(self) -> None:
        """Read the worker's new output; when it has exited, collect the result and clean up."""
        with self._lock:
            if self._state != RUNNING:
                return
            self._drain()
            process = self.process
            if process is None or process.poll() is None:
                return
            if self._reader is not None:
                self._reader.join(2.0)  # the rest of the output after the exit
            self._drain()
            if self._outputs is not None and process.returncode == 0:
                try:
                    self.result = read_outputs(self.folder, self._outputs)
                except BaseException as error:
                    self._fail(error, traceback.format_exc())
                    return
                self._finish(DONE)
                self._fraction = 1.0
            elif self._error_event is not None:
                self._fail(_rebuild_error(self._error_event), str(self._error_event.get("traceback", "")))
            else:
                self._fail(RuntimeError(f"the AnonMRI worker process ended with status {process.returncode}"),
                           "\n".join(self.log))

    def _finish(self, state: str) -> None:
        self._state = state
        self._ended_at = time.monotonic()
        if self._finalizer is not None:
            self._finalizer()  # kills a live worker, deletes the job folder

    def _fail(self, error: BaseException, details: str) -> None:
        self.error = error
        self.error_traceback = details
        self._finish(FAILED)

    def status(self) -> TaskStatus:
        """Poll, then a snapshot for the progress bar (cheap; call it from a QTimer)."""
        self.poll()
        with self._lock:
            end = self._ended_at if self._ended_at else time.monotonic()
            elapsed = end - self._started_at if self._started_at else 0.0
            return TaskStatus(self._state, self._fraction, self._message, elapsed)

    # --- cancel / wait -------------------------------------------------------------------------
    def cancel(self) -> None:
        """Kill the worker process tree now; nothing of its result is read."""
        with self._lock:
            if self._state not in (PENDING, RUNNING):
                return
            self._message = "cancelled"
            self._finish(CANCELLED)

    @property
    def cancel_requested(self) -> bool:
        return self._state == CANCELLED

    def wait(self, timeout_s: Optional[float] = None, interval_s: float = 0.05) -> bool:
        """Poll until finished (console use and tests); True when it finished in time."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.status().finished:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(interval_s)
        return True

    def run(self) -> Any:
        """Start, wait, and return the result or raise the error (synchronous use)."""
        if self._state == PENDING:
            self.start()
        self.wait()
        if self._state == FAILED:
            raise self.error
        if self._state == CANCELLED:
            from AnonMRILib.progress import Cancelled

            raise Cancelled("cancelled")
        return self.result


class JobPoller:
    """The panel's running tasks, advanced by ``tick()`` on every timeout of an injected timer.

    ``timer`` needs ``start()`` and ``stop()`` (a ``qt.QTimer`` whose ``timeout()`` calls
    :meth:`tick`; in tests a plain object). Callbacks run on the thread that calls :meth:`tick`
    (the GUI thread): ``on_status(status)`` on every tick, ``on_done(result, status)`` once done,
    ``on_end(task, status)`` once cancelled or failed.
    """

    def __init__(self, timer=None) -> None:
        self._timer = timer
        self.jobs: List[Dict[str, Any]] = []

    def add(self, task, kind: str, on_done: Callable, on_status: Optional[Callable] = None,
            on_end: Optional[Callable] = None):
        self.jobs.append(dict(task=task, kind=kind, on_done=on_done, on_status=on_status, on_end=on_end))
        if self._timer is not None:
            self._timer.start()
        return task

    def job(self, kind: str):
        """The running task of ``kind``, or None."""
        for job in self.jobs:
            if job["kind"] == kind:
                return job["task"]
        return None

    def tick(self) -> None:
        for job in list(self.jobs):
            status = job["task"].status()
            if job["on_status"] is not None:
                job["on_status"](status)
            if not status.finished:
                continue
            self.jobs.remove(job)
            if status.state == DONE:
                job["on_done"](job["task"].result, status)
            elif job["on_end"] is not None:
                job["on_end"](job["task"], status)
        if not self.jobs and self._timer is not None:
            self._timer.stop()

    def cancel_all(self) -> None:
        for job in self.jobs:
            job["task"].cancel()
