"""A background task with progress and cancel, polled by the panel (no Qt in here).

The panel starts a :class:`BackgroundTask` whose function receives a ``progress(fraction, message)``
callback, then polls :meth:`BackgroundTask.status` from a ``qt.QTimer`` (as SlicerMONAIAuto3DSeg
polls its process) to move the progress bar; Slicer's event loop keeps running meanwhile. Cancel
sets a flag that the next progress call turns into :class:`~AnonMRILib.progress.Cancelled`, so the
library stops at its next progress report and nothing is added to the scene.

The function must not touch MRML (it runs in a worker thread): read nodes before, write after.
"""
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional

from AnonMRILib.progress import Cancelled, ProgressCallback

PENDING, RUNNING, DONE, FAILED, CANCELLED = "pending", "running", "done", "failed", "cancelled"


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


class BackgroundTask:
    """Run ``function(progress)`` in a daemon thread; thread-safe status, cancel and result."""

    def __init__(self, function: Callable[[ProgressCallback], Any], name: str = "AnonMRI") -> None:
        self._function = function
        self._name = name
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._finished = threading.Event()
        self._state = PENDING
        self._fraction = 0.0
        self._message = ""
        self._started_at = 0.0
        self._ended_at = 0.0
        self._thread: Optional[threading.Thread] = None
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.error_traceback = ""

    # --- called by the worker ----------------------------------------------------------------
    def _progress(self, fraction: float, message: str) -> None:
        if self._cancel.is_set():
            raise Cancelled("cancelled by the user")
        with self._lock:
            self._fraction = min(1.0, max(0.0, float(fraction)))
            self._message = str(message)

    def _run(self) -> None:
        try:
            result = self._function(self._progress)
            if self._cancel.is_set():
                raise Cancelled("cancelled by the user")
        except Cancelled:
            state, result = CANCELLED, None
        except BaseException as error:  # reported to the panel, never lost in the thread
            with self._lock:
                self.error = error
                self.error_traceback = traceback.format_exc()
            state, result = FAILED, None
        else:
            state = DONE
        with self._lock:
            self.result = result
            self._state = state
            if state == DONE:
                self._fraction = 1.0
            self._ended_at = time.monotonic()
        self._finished.set()

    # --- called by the panel -----------------------------------------------------------------
    def start(self) -> "BackgroundTask":
        """Start the worker thread (once)."""
        with self._lock:
            if self._state != PENDING:
                raise RuntimeError("a BackgroundTask can be started only once")
            self._state = RUNNING
            self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Ask the work to stop at its next progress report."""
        self._cancel.set()

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    def status(self) -> TaskStatus:
        """A snapshot for the progress bar (cheap; call it from a QTimer)."""
        with self._lock:
            end = self._ended_at if self._ended_at else time.monotonic()
            elapsed = end - self._started_at if self._started_at else 0.0
            return TaskStatus(self._state, self._fraction, self._message, elapsed)

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Block until finished (console use and tests); True when it finished in time."""
        return self._finished.wait(timeout_s)
