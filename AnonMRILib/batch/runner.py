"""Run the image tasks on Dask: one task per scan (the other contrasts depending on their session's T1w)
and one per carried image (:func:`~AnonMRILib.batch.scan.carry_image`).

    records = run_scans(layout, settings, workers=4)                     # local process pool
    records = run_scans(layout, settings, scheduler="tcp://host:8786")   # a dask.distributed cluster

* ``scheduler=None, workers=1``: Dask's synchronous scheduler in this process (no pool; tests, debugging).
* ``scheduler=None, workers=N>1``: a ``dask.distributed.LocalCluster`` of N worker *processes*, one
  thread each (the networks use all their cores' worth of torch threads per process otherwise).
* ``scheduler=ADDRESS``: an existing ``dask.distributed`` scheduler (e.g. one started by
  ``dask-jobqueue``'s ``SLURMCluster``/``PBSCluster`` or ``dask scheduler`` + ``dask worker``); every
  worker must see the input and output folders at the same paths.

Each worker process keeps the brain-extraction network it loaded for every scan it runs
(:func:`~AnonMRILib.batch.scan.worker_brain_network`). A task never raises: failures come back as
records (retried inside the task for unexpected errors; a worker that dies is rescheduled by
``dask.distributed``, and a task lost that way is reported as failed). Outputs are identical
whichever scheduler runs them: every step is deterministic on the CPU.
"""
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import DependencyError, InputError
from .bids_layout import BidsLayout
from .scan import ScanSettings, carry_image, process_scan


def _dask():
    try:
        import dask
        from dask import delayed
    except ImportError:
        raise DependencyError("batch runs need Dask (pip install 'anonmri[batch]')") from None
    return dask, delayed


def remove_stale_scratch(out_dir: Path) -> int:
    """Delete the hidden scratch folders (``.anonmri-*``) a killed run left in ``out_dir``; returns how many."""
    stale = [p for p in out_dir.rglob(".anonmri-*") if p.is_dir()] if out_dir.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return len(stale)


def run_scans(layout: BidsLayout, settings: ScanSettings, scheduler: Optional[str] = None, workers: int = 1
              ) -> List[Dict[str, Any]]:
    """Process every scan and carried image of ``layout`` (see the module docstring); one record each, in order."""
    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    dask, delayed = _dask()
    remove_stale_scratch(Path(settings.out_dir))
    tasks = {}
    for scan in layout.references:
        tasks[scan.relative_path] = delayed(process_scan, pure=False)(
            scan, settings, dask_key_name=f"scan-{scan.relative_path}")
    for scan in layout.others:
        tasks[scan.relative_path] = delayed(process_scan, pure=False)(
            scan, settings, tasks[scan.reference], dask_key_name=f"scan-{scan.relative_path}")
    for image in layout.carried_images:
        tasks[image] = delayed(carry_image, pure=False)(image, settings, dask_key_name=f"carry-{image}")
    keys = [scan.relative_path for scan in layout.scans] + list(layout.carried_images)
    if scheduler is None and workers == 1:
        return list(dask.compute(*[tasks[k] for k in keys], scheduler="synchronous"))
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise DependencyError("--workers > 1 and --scheduler need dask.distributed "
                              "(pip install 'anonmri[batch]')") from None
    cluster = None
    try:
        if scheduler is None:
            import logging

            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                                   silence_logs=logging.ERROR)
            client = Client(cluster)
        else:
            try:
                client = Client(scheduler, timeout="20s")
            except (OSError, TimeoutError) as error:
                raise InputError(f"cannot reach the Dask scheduler at {scheduler} ({type(error).__name__})") from None
        with client:
            futures = client.compute([tasks[k] for k in keys])
            records = []
            for key, future in zip(keys, futures):
                try:
                    records.append(future.result())
                except Exception as error:  # noqa: BLE001 - e.g. KilledWorker: reported for that scan only
                    records.append({"scan": key, "status": "failed", "error": f"{type(error).__name__} on the cluster"})
            return records
    finally:
        if cluster is not None:
            cluster.close()
