"""``anonmri bids``: outputs under the same names, masks, sidecars, dataset_description; resumable; a run
that dies midway leaves no partial output; Dask on a 2-worker cluster matches the local run bit for bit."""
import hashlib
import json

import numpy as np
import pytest

pytest.importorskip("dask")

from AnonMRILib.cli.main import main  # noqa: E402
from AnonMRILib.io import load_volume  # noqa: E402

from bids_fixtures import make_bids_dataset  # noqa: E402

SCANS = ("sub-01/ses-1/anat/sub-01_ses-1_T1w.nii.gz", "sub-01/ses-1/anat/sub-01_ses-1_T2w.nii.gz",
         "sub-02/anat/sub-02_T1w.nii.gz", "sub-02/anat/sub-02_T2w.nii.gz")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_bids_dataset(tmp_path_factory.mktemp("bids"))


def bids_app(bids, masks, out, *extra):
    extra = list(extra) if "--scheduler" in extra else ["--workers", "1", *extra]
    return main(["bids", str(bids), str(out), "participant", "--method", "black", "--brain-masks", str(masks),
                 "--quiet", *extra])


def tree_digest(root):
    """SHA-256 of every output file except the run-dependent TSV/HTML/JSON records (which hold timings)."""
    digest = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.endswith(("_scan.json", ".tsv", ".html")):
            digest[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def snapshot(root):
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_bids_app_outputs_sidecars_and_resume(dataset, tmp_path):
    bids, masks = dataset
    before = snapshot(bids)
    out = tmp_path / "out"
    assert bids_app(bids, masks, out) == 0
    for scan in SCANS:
        written, source = load_volume(out / scan), load_volume(bids / scan)
        assert written.same_grid(source) and written.dtype == source.dtype
        assert not np.array_equal(written.array, source.array)
        entities, suffix = scan.rsplit("/", 1)[1].split(".")[0].rsplit("_", 1)
        mask = load_volume(out / scan.rsplit("/", 1)[0] / f"{entities}_mod-{suffix}_defacemask.nii.gz")
        assert np.array_equal(mask.array != 0, written.array != source.array)
        sidecar = json.loads((out / scan.replace(".nii.gz", ".json")).read_text())
        assert "black" in sidecar["DeidentificationMethod"]
        assert [c["CodeValue"] for c in sidecar["DeidentificationMethodCodeSequence"]] == ["113100", "113102"]
        if suffix == "T1w":
            assert sidecar["RepetitionTime"] == 2.3 and "InstitutionName" not in sidecar
            brain = load_volume(masks / scan.replace("_T1w.nii.gz", "_desc-brain_mask.nii.gz")).array != 0
            assert np.array_equal(written.array[brain], source.array[brain])
    description = json.loads((out / "dataset_description.json").read_text())
    assert description["DatasetType"] == "derivative" and description["GeneratedBy"][0]["Name"] == "AnonMRI"
    rows = (out / "anonmri_scans.tsv").read_text().splitlines()
    assert len(rows) == 5 and all("\tdone\t" in row for row in rows[1:])
    assert (out / "sub-01.html").is_file()
    assert (out / "sub-01" / "figures" / "sub-01_ses-1_T2w_before_after.png").is_file()
    assert snapshot(bids) == before  # the input dataset is never modified
    # a second run skips every scan and rewrites no output
    outputs = {k: v for k, v in snapshot(out).items() if k.endswith(".nii.gz")}
    assert bids_app(bids, masks, out) == 0
    rows = (out / "anonmri_scans.tsv").read_text().splitlines()
    assert all("\tskipped\t" in row for row in rows[1:])
    assert {k: v for k, v in snapshot(out).items() if k.endswith(".nii.gz")} == outputs


def test_a_run_dying_midway_leaves_no_partial_output_and_resumes(dataset, tmp_path, monkeypatch):
    import AnonMRILib.io.writers as writers

    bids, masks = dataset
    out = tmp_path / "out"
    real = writers.write_volume_file
    calls = {"n": 0}

    def dies_on_the_sixth_volume(*args, **kwargs):  # the first scan writes 3 volumes; die inside the second
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # like a kill: not an error a task catches
        return real(*args, **kwargs)

    monkeypatch.setattr(writers, "write_volume_file", dies_on_the_sixth_volume)
    assert bids_app(bids, masks, out, "--participant-label", "01") == 130  # "cancelled"
    monkeypatch.undo()
    files = [p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()]
    scratch = [p for p in out.rglob(".anonmri-*")]
    assert not scratch
    assert "sub-01/ses-1/anat/sub-01_ses-1_T1w.nii.gz" in files  # the first scan finished
    assert not any("T2w" in name for name in files), files     # nothing of the scan that died
    # a process killed by SIGKILL cannot clean up: its hidden scratch folder is removed by the next run
    stale = out / "sub-01" / "ses-1" / "anat" / ".anonmri-killed"
    stale.mkdir()
    (stale / "sub-01_ses-1_T2w.nii.gz").write_bytes(b"partial")
    assert bids_app(bids, masks, out, "--participant-label", "01") == 0
    rows = (out / "anonmri_scans.tsv").read_text().splitlines()
    assert "\tskipped\t" in rows[1] and "\tdone\t" in rows[2] and not stale.exists()


def test_dask_cluster_matches_the_local_run_bit_for_bit(dataset, tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    bids, masks = dataset
    local, remote = tmp_path / "local", tmp_path / "remote"
    assert bids_app(bids, masks, local, "--no-figures") == 0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        assert bids_app(bids, masks, remote, "--no-figures", "--scheduler", cluster.scheduler_address) == 0
    assert tree_digest(local) == tree_digest(remote) and len(tree_digest(local)) >= 4 * 3


def test_local_process_pool_matches_too(dataset, tmp_path):
    """``--workers 2``: a LocalCluster of worker processes (the default on machines with 4+ cores)."""
    pytest.importorskip("dask.distributed")
    bids, masks = dataset
    local, pool = tmp_path / "local", tmp_path / "pool"
    label = ["--participant-label", "02", "--no-figures"]
    assert bids_app(bids, masks, local, *label) == 0
    assert main(["bids", str(bids), str(pool), "participant", "--method", "black", "--brain-masks", str(masks),
                 "--workers", "2", "--quiet", *label]) == 0
    assert tree_digest(local) == tree_digest(pool) and len(tree_digest(local)) >= 2 * 3


def test_bad_dataset_and_failed_scans(dataset, tmp_path, capsys):
    bids, masks = dataset
    assert main(["bids", str(tmp_path), str(tmp_path / "o"), "participant", "--quiet"]) == 2
    assert main(["bids", str(bids), str(bids / "derivatives"), "participant", "--quiet"]) == 2
    assert main(["bids", str(bids), str(tmp_path / "o"), "participant", "--participant-label", "09", "--quiet"]) == 2
    # a missing brain mask fails that subject's T1w (and blocks its T2w) without stopping the other subject
    partial = tmp_path / "partial_masks"
    (partial / "sub-02" / "anat").mkdir(parents=True)
    (partial / "sub-02" / "anat" / "sub-02_desc-brain_mask.nii.gz").write_bytes(
        (masks / "sub-02" / "anat" / "sub-02_desc-brain_mask.nii.gz").read_bytes())
    out = tmp_path / "o2"
    assert main(["bids", str(bids), str(out), "participant", "--method", "black", "--brain-masks", str(partial),
                 "--no-figures", "--workers", "1", "--quiet"]) == 1
    rows = [row.split("\t") for row in (out / "anonmri_scans.tsv").read_text().splitlines()]
    status = {row[2]: row[5] for row in rows[1:]}
    assert status[SCANS[0]] == "failed" and status[SCANS[1]] == "blocked"
    assert status[SCANS[2]] == "done" and status[SCANS[3]] == "done"


def test_sigkill_midway_leaves_only_finished_scans(dataset, tmp_path):
    """A real kill (SIGKILL, no clean-up possible) after the first scan finished: every scan is either complete
    (its record exists) or has no visible output file; the next run removes the scratch and finishes."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    bids, masks = dataset
    out = tmp_path / "out"
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    process = subprocess.Popen([sys.executable, "-m", "AnonMRILib", "bids", str(bids), str(out), "participant",
                                "--method", "black", "--brain-masks", str(masks), "--participant-label", "01",
                                "--workers", "1", "--no-figures", "--quiet"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first_record = out / "sub-01" / "figures" / "sub-01_ses-1_T1w_scan.json"
    deadline = time.monotonic() + 120
    while not first_record.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert first_record.exists()
    records = {p.name[: -len("_scan.json")] for p in out.rglob("*_scan.json")}
    assert len(records) < 2, "the run finished before it could be killed; nothing was tested"
    for path in out.rglob("*"):
        if path.is_file() and not any(part.startswith(".anonmri-") for part in path.relative_to(out).parts):
            stem = path.name.split(".")[0].replace("_mod-T1w_defacemask", "_T1w").replace("_mod-T2w_defacemask", "_T2w")
            stem = stem.replace("_desc-brain_mask", "_T1w").replace("_before_after", "").replace("_scan", "")
            if path.name in ("dataset_description.json",):
                continue
            assert stem in records, f"partial output of an unfinished scan: {path.relative_to(out)}"
    assert bids_app(bids, masks, out, "--participant-label", "01", "--no-figures") == 0
    assert not list(out.rglob(".anonmri-*"))
    assert len(list(out.rglob("*_scan.json"))) == 2
