"""Weights resolution: package folder, $ANONMRI_WEIGHTS_DIR, user cache, then a verified download.

No network here: downloads are served from a file:// URL and from an http.server on loopback.
"""
import functools
import hashlib
import http.server
import json
import threading
from pathlib import Path

import pytest

from AnonMRILib import weights_store
from AnonMRILib.errors import WeightsError
from AnonMRILib.weights_store import WeightsAsset, resolve_weights_file

PAYLOAD = b"safetensors-like bytes " * 5000


def _asset(url, data=PAYLOAD, name="sub/model.safetensors"):
    return {name: WeightsAsset(name, hashlib.sha256(data).hexdigest(), len(data), url)}


@pytest.fixture
def folders(tmp_path):
    package, offline, cache, served = (tmp_path / n for n in ("package", "offline", "cache", "served"))
    for folder in (package, offline, cache, served):
        folder.mkdir()
    (served / "model.safetensors").write_bytes(PAYLOAD)
    return package, offline, cache, served


def test_the_manifest_lists_every_large_weights_file_with_its_checksum():
    """Every large shipped file is listed with its checksum; a listed file not shipped (HD-BET fold 0)
    has a local source and resolves with downloads off (conftest: converted into the session cache)."""
    manifest = weights_store.load_manifest()
    folder = weights_store.PACKAGE_WEIGHTS_DIR
    large = {p.relative_to(folder).as_posix() for p in folder.rglob("*.safetensors")
             if p.stat().st_size >= weights_store.FETCH_THRESHOLD_BYTES}
    assert large and large <= set(manifest)
    assert set(manifest) - large <= set(weights_store.LOCAL_SOURCES)
    for name, asset in manifest.items():
        assert asset.url.startswith("https://") and asset.url.endswith(Path(name).name)
        path = resolve_weights_file(name, allow_download=False)
        if name in large:
            assert path == folder / name
        else:
            assert path.parent != (folder / name).parent and not (folder / name).exists()
        assert weights_store.sha256_of(path) == asset.sha256, f"{name}: rerun --write-manifest"
    card = json.loads((folder / "brain_extraction" / "hdbet.json").read_text())
    assert manifest["brain_extraction/" + card["file"]].sha256 == card["sha256"]


def test_lookup_order_package_then_environment_folder_then_cache(folders):
    package, offline, cache, served = folders
    manifest = _asset("file:///nonexistent/model.safetensors")
    for folder in (offline, cache):
        (folder / "sub").mkdir()
        (folder / "sub" / "model.safetensors").write_bytes(PAYLOAD)
    order = [package, offline, cache]
    assert resolve_weights_file("sub/model.safetensors", manifest, order) == offline / "sub" / "model.safetensors"
    (package / "sub").mkdir()
    (package / "sub" / "model.safetensors").write_bytes(PAYLOAD)
    assert resolve_weights_file("sub/model.safetensors", manifest, order) == package / "sub" / "model.safetensors"


def test_search_folders_read_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ANONMRI_WEIGHTS_DIR", str(tmp_path / "site"))
    monkeypatch.delenv("ANONMRI_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folders = weights_store.search_folders()
    assert folders[1:] == [tmp_path / "site", tmp_path / "xdg" / "anonmri" / "weights"]
    monkeypatch.setenv("ANONMRI_CACHE_DIR", str(tmp_path / "scratch"))
    assert weights_store.search_folders()[1:] == [tmp_path / "site", tmp_path / "scratch"]


def test_download_from_a_file_url_is_verified_cached_and_then_found_offline(folders):
    package, offline, cache, served = folders
    manifest = _asset((served / "model.safetensors").as_uri())
    messages = []
    path = resolve_weights_file("sub/model.safetensors", manifest, [package, offline, cache],
                                progress=lambda f, m: messages.append(f))
    assert path == cache / "sub" / "model.safetensors" and path.read_bytes() == PAYLOAD
    assert messages and messages[-1] == 1.0
    (served / "model.safetensors").unlink()  # the source is gone: the cached copy is used
    assert resolve_weights_file("sub/model.safetensors", manifest, [package, offline, cache]) == path


def test_download_over_http_on_loopback(folders):
    package, offline, cache, served = folders
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/model.safetensors"
        path = resolve_weights_file("sub/model.safetensors", _asset(url), [package, offline, cache])
        assert path.read_bytes() == PAYLOAD
    finally:
        server.shutdown()
        server.server_close()


def test_a_wrong_checksum_is_refused_and_nothing_is_left(folders):
    package, offline, cache, served = folders
    manifest = _asset((served / "model.safetensors").as_uri(), data=b"other bytes")
    with pytest.raises(WeightsError, match="SHA-256"):
        resolve_weights_file("sub/model.safetensors", manifest, [package, offline, cache])
    assert [p for p in cache.rglob("*") if p.is_file()] == []


def test_a_failed_download_leaves_nothing_and_says_how_to_work_offline(folders):
    package, offline, cache, served = folders
    manifest = _asset((served / "missing.safetensors").as_uri())
    with pytest.raises(WeightsError, match="ANONMRI_WEIGHTS_DIR"):
        resolve_weights_file("sub/model.safetensors", manifest, [package, offline, cache])
    assert [p for p in cache.rglob("*") if p.is_file()] == []
    with pytest.raises(WeightsError, match="downloading is off"):
        resolve_weights_file("sub/model.safetensors", manifest, [package, offline, cache], allow_download=False)


def test_a_corrupt_local_file_is_refused(folders):
    package, offline, cache, served = folders
    (offline / "sub").mkdir()
    (offline / "sub" / "model.safetensors").write_bytes(b"truncated")
    with pytest.raises(WeightsError, match="never loaded"):
        resolve_weights_file("sub/model.safetensors", _asset("file:///x"), [package, offline, cache])


def test_write_manifest_lists_only_large_files_and_keeps_the_entries_of_files_not_shipped(tmp_path):
    (tmp_path / "big.safetensors").write_bytes(b"x" * 2048)
    (tmp_path / "small.safetensors").write_bytes(b"x" * 10)
    path = weights_store.write_manifest(tmp_path, base_url="https://example.org/w", threshold_bytes=1024)
    data = json.loads(path.read_text())
    assert list(data["files"]) == ["big.safetensors"]
    assert weights_store.load_manifest(path)["big.safetensors"].url == "https://example.org/w/big.safetensors"
    # a listed file that is fetched or built (not in the folder) keeps its entry on a rewrite
    data["files"]["sub/fetched.safetensors"] = {"sha256": "ab" * 32, "bytes": 5}
    path.write_text(json.dumps(data))
    (tmp_path / "big.safetensors").write_bytes(b"y" * 4096)
    data = json.loads(weights_store.write_manifest(tmp_path, threshold_bytes=1024).read_text())
    assert data["files"]["sub/fetched.safetensors"] == {"sha256": "ab" * 32, "bytes": 5}
    assert data["files"]["big.safetensors"]["bytes"] == 4096
