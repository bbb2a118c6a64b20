"""``anonmri bids``: the whole dataset de-identified as a raw BIDS dataset the official validator accepts,
masks/figures/reports in derivatives/anonmri; metadata rules; resumable; a run that dies midway leaves no
partial output; Dask on a 2-worker cluster matches the local run bit for bit."""
import hashlib
import json

import numpy as np
import pytest

pytest.importorskip("dask")

from AnonMRILib.cli.main import main  # noqa: E402
from AnonMRILib.io import load_volume  # noqa: E402

from bids_fixtures import PLANTED, find_bids_validator, make_bids_dataset, run_bids_validator, validator_errors  # noqa: E402,E501

DERIVATIVE = "derivatives/anonmri"
BOLD = "sub-01/ses-1/func/sub-01_ses-1_task-rest_bold.nii.gz"

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
        mask = load_volume(out / DERIVATIVE / scan.rsplit("/", 1)[0] / f"{entities}_mod-{suffix}_defacemask.nii.gz")
        changed = written.array != source.array
        assert np.all(mask.array[changed] != 0)  # a convex region holding every changed voxel, not their shape
        region = mask.array != 0
        assert not np.array_equal(region, changed)
        starts = np.diff(region.astype(np.int8), axis=2, prepend=0) == 1
        assert starts.sum(axis=2).max() <= 1  # convex: one run per column
        sidecar = json.loads((out / scan.replace(".nii.gz", ".json")).read_text())
        assert "black" in sidecar["DeidentificationMethod"]
        assert [c["CodeValue"] for c in sidecar["DeidentificationMethodCodeSequence"]] == ["113100", "113102"]
        if suffix == "T1w":
            assert sidecar["RepetitionTime"] == 2.3 and "InstitutionName" not in sidecar
            brain = load_volume(masks / scan.replace("_T1w.nii.gz", "_desc-brain_mask.nii.gz")).array != 0
            assert np.array_equal(written.array[brain], source.array[brain])
    description = json.loads((out / "dataset_description.json").read_text())
    assert description["DatasetType"] == "raw" and description["Name"] == "tiny" and description["License"] == "CC0"
    assert description["GeneratedBy"][-1]["Name"] == "AnonMRI" and "black" in description["GeneratedBy"][-1]["Description"]
    derivative = json.loads((out / DERIVATIVE / "dataset_description.json").read_text())
    assert derivative["DatasetType"] == "derivative" and derivative["GeneratedBy"][0]["Name"] == "AnonMRI"
    assert derivative["SourceDatasets"] == [{"URL": "../../"}]
    rows = (out / DERIVATIVE / "anonmri_scans.tsv").read_text().splitlines()
    assert len(rows) == 6 and all("\tdone\t" in row for row in rows[1:])
    assert (out / DERIVATIVE / "sub-01.html").is_file()
    assert (out / DERIVATIVE / "sub-01" / "figures" / "sub-01_ses-1_T2w_deidentified.png").is_file()
    assert not list(out.rglob("*before*"))  # the original face is never rendered into an output
    assert snapshot(bids) == before  # the input dataset is never modified
    # a second run skips every scan and rewrites no output
    outputs = {k: v for k, v in snapshot(out).items() if k.endswith(".nii.gz")}
    assert bids_app(bids, masks, out) == 0
    rows = (out / DERIVATIVE / "anonmri_scans.tsv").read_text().splitlines()
    assert len(rows) == 6 and all("\tskipped\t" in row for row in rows[1:])
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
    assert "participants.tsv" not in files                      # text files come after the images
    # a process killed by SIGKILL cannot clean up: its hidden scratch folder is removed by the next run
    stale = out / "sub-01" / "ses-1" / "anat" / ".anonmri-killed"
    stale.mkdir()
    (stale / "sub-01_ses-1_T2w.nii.gz").write_bytes(b"partial")
    assert bids_app(bids, masks, out, "--participant-label", "01") == 0
    rows = (out / DERIVATIVE / "anonmri_scans.tsv").read_text().splitlines()
    assert "\tskipped\t" in rows[1] and "\tdone\t" in rows[2] and not stale.exists()
    assert (out / "participants.tsv").is_file() and (out / BOLD).is_file()


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
    rows = [row.split("\t") for row in (out / DERIVATIVE / "anonmri_scans.tsv").read_text().splitlines()]
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
    first_record = out / DERIVATIVE / "sub-01" / "figures" / "sub-01_ses-1_T1w_scan.json"
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
            if path.name in ("dataset_description.json",) or path.relative_to(out).as_posix() == BOLD:
                continue  # written before the scans / a carried image, itself written by one rename
            assert stem in records, f"partial output of an unfinished scan: {path.relative_to(out)}"
    assert bids_app(bids, masks, out, "--participant-label", "01", "--no-figures") == 0
    assert not list(out.rglob(".anonmri-*"))
    assert len(list(out.rglob("*_scan.json"))) == 2


def _all_text(root):
    """Every output file's bytes (NIfTI decompressed), for the planted-text check."""
    import gzip

    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            yield path.relative_to(root).as_posix(), gzip.decompress(data) if path.name.endswith(".gz") else data


def _acq_times(path):
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    return [row[rows[0].index("acq_time")] for row in rows[1:]] if "acq_time" in rows[0] else None


def test_whole_dataset_is_valid_bids_with_every_file_and_no_identifying_metadata(dataset, tmp_path):
    """The issue's acceptance test: reface, --date-shift; the official validator reports no error on the input
    and on the output; every input file is in the output; no planted identifying text and no unshifted
    acquisition time survives anywhere (derivative included)."""
    import datetime

    import nibabel as nib

    validator, why = find_bids_validator()
    if validator is None:
        pytest.skip(why)
    bids, masks = dataset
    assert validator_errors(run_bids_validator(validator, bids)) == []  # the input is valid: the test can fail
    out = tmp_path / "out"
    assert main(["bids", str(bids), str(out), "participant", "--method", "reface", "--brain-masks", str(masks),
                 "--workers", "1", "--no-figures", "--date-shift", "--quiet"]) == 0
    report = run_bids_validator(validator, out)
    assert validator_errors(report) == []
    inputs = {p.relative_to(bids).as_posix() for p in bids.rglob("*") if p.is_file()}
    outputs = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert inputs <= outputs, sorted(inputs - outputs)
    added = {name for name in outputs - inputs if not name.startswith(DERIVATIVE + "/")}
    assert added == {"sub-01/ses-1/anat/sub-01_ses-1_T2w.json", "sub-02/anat/sub-02_T2w.json"}  # their method
    for name, data in _all_text(out):
        for planted in PLANTED:
            assert planted.encode() not in data, f"{planted!r} survives in {name}"
    # one offset per subject: relative timing kept, dates before 1925
    before = _acq_times(bids / "sub-01/ses-1/sub-01_ses-1_scans.tsv") + _acq_times(bids / "sub-01/sub-01_sessions.tsv")
    after = _acq_times(out / "sub-01/ses-1/sub-01_ses-1_scans.tsv") + _acq_times(out / "sub-01/sub-01_sessions.tsv")
    parse = datetime.datetime.fromisoformat
    assert all(parse(t).year < 1925 for t in after)
    assert {parse(a) - parse(b) for a, b in zip(after, before)} == {parse(after[0]) - parse(before[0])}
    # the BOLD run: voxels and TR unchanged, header text and extensions gone, sidecar scrubbed
    source, carried = nib.load(str(bids / BOLD)), nib.load(str(out / BOLD))
    assert np.array_equal(np.asarray(source.dataobj), np.asarray(carried.dataobj))
    assert carried.header["pixdim"][4] == 2.0 and carried.header["descrip"] == b""
    assert not carried.header.extensions and np.array_equal(source.affine, carried.affine)
    sidecar = json.loads((out / BOLD.replace(".nii.gz", ".json")).read_text())
    assert sidecar == {"TaskName": "rest", "RepetitionTime": 2.0}
    participants = (out / "participants.tsv").read_text().splitlines()
    assert participants == ["participant_id\tage\tsex\tgroup", "sub-01\t34\tF\tcontrol", "sub-02\t89+\tM\tpatient"]
    decisions = (out / DERIVATIVE / "anonmri_metadata.tsv").read_text()
    for column in ("name\tdropped", "birth_date\tdropped", "notes\tdropped", "age\tkept", "acq_time\tshifted"):
        assert column in decisions
    assert "reface" in json.loads((out / "dataset_description.json").read_text())["GeneratedBy"][-1]["Description"]


def test_black_output_with_figures_is_valid_too(dataset, tmp_path):
    """Figures, HTML pages, masks and records all live in the derivative: the validator sees no stray file."""
    validator, why = find_bids_validator()
    if validator is None:
        pytest.skip(why)
    bids, masks = dataset
    out = tmp_path / "out"
    assert bids_app(bids, masks, out, "--method", "black", "T2w=keep") == 0
    assert validator_errors(run_bids_validator(validator, out)) == []
    rows = (out / DERIVATIVE / "anonmri_scans.tsv").read_text()
    assert rows.count("anatomical image carried with its face untreated") == 2
    assert list((out / DERIVATIVE).rglob("*.png")) and not (out / "sub-01" / "figures").exists()
    assert "acq_time" not in (out / "sub-02/sub-02_scans.tsv").read_text()  # removed without --date-shift


def test_metadata_rules():
    from AnonMRILib.batch.metadata import age_value, column_rule

    assert column_rule("participant_id", ["sub-01"], None) == ("kept", "key column")
    assert column_rule("first_name", ["Jane"], None)[0] == "dropped"
    assert column_rule("scan_day", ["2021-03-04"], None) == ("dropped", "date- or time-like values")
    assert column_rule("weight", ["70.5", "n/a"], None) == ("kept", "numeric")
    assert column_rule("diagnosis", ["MCI"], None) == ("dropped", "free text")
    assert column_rule("diagnosis", ["MCI"], {"MCI": "mild cognitive impairment"})[0] == "kept"
    assert column_rule("sex", ["F", "M"], None)[0] == "kept"
    assert column_rule("sex", ["female, pregnant"], None)[0] == "dropped"
    assert [age_value(v, 0) for v in ("34", "88.5", "89", "95", "89+", "n/a", "old")] == \
        ["34", "88.5", "89+", "89+", "89+", "n/a", "n/a"]
    assert [age_value(v, 5) for v in ("34", "35", "87")] == ["30", "35", "85"]


def test_age_bins_and_removed_times(dataset):
    from AnonMRILib.batch.bids_layout import find_scans
    from AnonMRILib.batch.metadata import MetadataSettings, prepare_metadata
    from AnonMRILib.errors import InputError

    bids, _ = dataset
    layout = find_scans(bids, ["02"])
    texts, decisions = prepare_metadata(layout, MetadataSettings(age_bin=10), ["02"])
    assert texts["participants.tsv"].splitlines() == ["participant_id\tage\tsex\tgroup", "sub-02\t89+\tM\tpatient"]
    assert texts["sub-02/sub-02_scans.tsv"].splitlines()[0] == "filename"
    assert "10-year bins" in json.loads(texts["participants.json"])["age"]["Description"]
    assert ("sub-02/sub-02_scans.tsv", "acq_time", "dropped", "acquisition time") in decisions
    assert not any(name.startswith("sub-01") for name in texts)
    with pytest.raises(InputError):
        MetadataSettings(age_bin=-1)


def test_what_is_not_carried_and_bad_method_choices(dataset, tmp_path):
    import shutil

    from AnonMRILib.batch.bids_layout import find_scans
    from AnonMRILib.cli.bids import parse_methods

    bids, masks = dataset
    copy = tmp_path / "bids"
    shutil.copytree(bids, copy)
    for name in ("sourcedata/sub-01/IM0001.dcm", ".git/config", "sub-01/.DS_Store", "code/convert.py"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text("x")
    layout = find_scans(copy)
    assert set(layout.left_out) == {"sourcedata", ".git", "sub-01/.DS_Store"}
    assert "code/convert.py" in layout.carried_files and BOLD in layout.carried_images
    assert parse_methods(["reface", "FLAIR=keep", "angio=carry"]) == (
        "reface", ("T2w", "PDw", "PD", "T2starw", "angio"))
    from AnonMRILib.batch.metadata import label_warnings

    assert [w[0] for w in label_warnings(["sub-01/ses-20210304/anat/x.nii.gz", "sub-01/ses-1/x.tsv",
                                          "sub-19990101/anat/y.nii.gz"])] == ["sub-01/ses-20210304", "sub-19990101"]
    assert label_warnings(["sub-01/ses-1/anat/sub-01_ses-1_T1w.nii.gz"]) == []
    for bad in (["smudge"], ["T2w=smudge"], ["T1w=keep"]):
        assert main(["bids", str(bids), str(tmp_path / "o"), "participant", "--quiet", "--method", *bad]) == 2
    assert not (tmp_path / "o").exists()
