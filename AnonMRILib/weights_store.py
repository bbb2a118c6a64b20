"""Find a weights file, or fetch it once from a release asset, verified by SHA-256.

The weights above about a megabyte can leave the repository (3D Slicer's Extensions Index limits an
extension's repository to 100 MB) and be fetched on first use. :func:`resolve_weights_file` looks,
in order:

1. in the package's own ``weights/`` folder (a source checkout, a wheel, the Slicer extension);
2. in ``$ANONMRI_WEIGHTS_DIR`` (a folder an offline site fills by hand: same relative names);
3. in the user cache (``$XDG_CACHE_HOME/anonmri/weights``, ``~/.cache/anonmri/weights``, on Windows
   ``%LOCALAPPDATA%\\anonmri\\weights``);
4. else downloads the asset's URL into the user cache: streamed into a temporary file in that
   folder, its SHA-256 checked, then renamed into place; a wrong checksum or a broken download
   raises :class:`~AnonMRILib.errors.WeightsError` and leaves nothing behind.

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
from typing import Dict, List, Optional, Sequence

from .errors import WeightsError
from .progress import ProgressCallback, report

PACKAGE_WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MANIFEST_FILE = "manifest.json"
ENVIRONMENT_VARIABLE = "ANONMRI_WEIGHTS_DIR"
#: where release assets are published (the project's intended GitHub home; see the README)
DEFAULT_BASE_URL = "https://github.com/anonmri/SlicerAnonMRI/releases/download/weights-v1"
#: files at least this large are listed in the manifest (fetchable); smaller ones always ship
FETCH_THRESHOLD_BYTES = 1 << 20
CHUNK_BYTES = 1 << 20


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
    """The per-user cache folder of fetched weights."""
    if os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "anonmri" / "weights"


def search_folders(package_dir: Path = PACKAGE_WEIGHTS_DIR) -> List[Path]:
    """The folders looked in, in order: package, ``$ANONMRI_WEIGHTS_DIR``, user cache."""
    folders = [Path(package_dir)]
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
        os.replace(temporary, target)
    except WeightsError:
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


def resolve_weights_file(name: str, manifest: Optional[Dict[str, WeightsAsset]] = None,
                         folders: Optional[Sequence[Path]] = None, allow_download: bool = True,
                         progress: Optional[ProgressCallback] = None) -> Path:
    """The path of weights file ``name`` (relative to the weights folder), fetched if needed.

    A file that is not in the manifest is looked up in the folders only (no checksum to verify).
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
        raise WeightsError(f"weights file {name} was not found in {', '.join(str(f) for f in folders)}")
    if not allow_download:
        raise WeightsError(f"weights file {name} is not here and downloading is off; put it into "
                           f"${ENVIRONMENT_VARIABLE} or {user_cache_dir()}")
    return download(asset, folders[-1], progress)


def write_manifest(folder: Path = PACKAGE_WEIGHTS_DIR, base_url: str = DEFAULT_BASE_URL,
                   threshold_bytes: int = FETCH_THRESHOLD_BYTES) -> Path:
    """(Re)write ``folder/manifest.json`` from the ``.safetensors`` files at least ``threshold_bytes`` big."""
    folder = Path(folder)
    files = {}
    for path in sorted(folder.rglob("*.safetensors")):
        size = path.stat().st_size
        if size >= threshold_bytes:
            files[path.relative_to(folder).as_posix()] = {"sha256": sha256_of(path), "bytes": size}
    target = folder / MANIFEST_FILE
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
