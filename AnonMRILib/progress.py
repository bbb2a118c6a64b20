"""The one progress convention of AnonMRI.

A long step accepts ``progress: ProgressCallback | None`` and calls ``progress(fraction, message)``
with ``fraction`` in [0, 1]. The CLI shows it as a tqdm bar, Slicer as a progress bar. Callbacks may
raise :class:`Cancelled` to stop the work (the Slicer panel's Cancel button does this).
"""
from typing import Callable, Optional

ProgressCallback = Callable[[float, str], None]


class Cancelled(Exception):
    """Raised by a progress callback to cancel the running step."""


def report(progress: Optional[ProgressCallback], fraction: float, message: str) -> None:
    """Call ``progress`` if there is one, with ``fraction`` clipped to [0, 1]."""
    if progress is not None:
        progress(min(1.0, max(0.0, float(fraction))), message)


def sub_progress(progress: Optional[ProgressCallback], start: float, end: float) -> Optional[ProgressCallback]:
    """A callback that maps a sub-step's [0, 1] onto [start, end] of ``progress``."""
    if progress is None:
        return None

    def _sub(fraction: float, message: str) -> None:
        report(progress, start + (end - start) * min(1.0, max(0.0, fraction)), message)

    return _sub


class TqdmProgress:
    """A progress callback that drives a tqdm bar (used by the CLI); a context manager."""

    def __init__(self, description: str = "", disable: bool = False) -> None:
        from tqdm import tqdm

        self._description = description
        self._bar = tqdm(total=1000, desc=description, disable=disable, leave=False,
                         bar_format="{percentage:3.0f}%|{bar}| {desc}")

    def __call__(self, fraction: float, message: str) -> None:
        self._bar.n = int(round(1000 * fraction))
        label = f"{self._description}: {message}" if self._description else message
        self._bar.set_description_str(label, refresh=False)
        self._bar.refresh()

    def __enter__(self) -> "TqdmProgress":
        return self

    def __exit__(self, *exc) -> None:
        self._bar.close()
