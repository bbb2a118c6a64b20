"""A generated two-subject BIDS dataset built from the embedded sample head, valid for the official validator.

sub-01 has a session (T1w, T2w, a resting-state BOLD run with its sidecar, scans.tsv with acquisition
times, sessions.tsv), sub-02 has none (T1w, T2w, scans.tsv); the top level holds README,
participants.tsv/json with identifying columns, and an inherited task sidecar.
"""
import json
from pathlib import Path

import numpy as np

from AnonMRILib.io import save_volume

from dicom_fixtures import small_sample
from multicontrast_fixtures import t2_like

#: identifying text planted in the input, which must appear nowhere in the output
PLANTED = ("Jane Roe", "1931-04-02", "St Elsewhere", "lives on Elm Street", "2021-03-04T09:15:00", "10:11:12",
           "2021-03-04", "2020-11-30")


def _write_bold(path: Path, shape=(12, 12, 8, 4), repetition_time: float = 2.0) -> None:
    """A small 4-D BOLD NIfTI whose header carries planted text (``descrip``) and an extension."""
    import nibabel as nib

    data = (np.arange(np.prod(shape), dtype=np.int16).reshape(shape) % 500).astype(np.int16)
    image = nib.Nifti1Image(data, np.diag([3.0, 3.0, 3.5, 1.0]))
    image.header.set_xyzt_units("mm", "sec")
    image.header["pixdim"][4] = repetition_time
    image.header["descrip"] = b"Jane Roe 1931-04-02"
    image.header.extensions.append(nib.nifti1.Nifti1Extension(6, b"Jane Roe, St Elsewhere"))
    image.set_qform(image.affine, code=1)
    image.set_sform(image.affine, code=1)
    nib.save(image, str(path))


def _tsv(path: Path, rows) -> None:
    path.write_text("".join("\t".join(str(v) for v in row) + "\n" for row in rows), encoding="utf-8")


def make_bids_dataset(root: Path, step: int = 3):
    """(BIDS root, brain-mask derivative root): sub-01 with ses-1, sub-02 without sessions; 4.5 mm heads."""
    bids, masks = root / "bids", root / "masks"
    bids.mkdir(parents=True)
    (bids / "dataset_description.json").write_text(json.dumps({"Name": "tiny", "BIDSVersion": "1.9.0",
                                                               "License": "CC0", "Authors": ["A. Author"]}))
    (bids / "README").write_text("A tiny synthetic dataset for the AnonMRI tests.\n")
    _tsv(bids / "participants.tsv", [("participant_id", "age", "sex", "group", "name", "birth_date", "notes"),
                                     ("sub-01", 34, "F", "control", "Jane Roe", "1931-04-02", "lives on Elm Street"),
                                     ("sub-02", 91, "M", "patient", "John Doe", "1930-01-01", "n/a")])
    (bids / "participants.json").write_text(json.dumps({
        "age": {"Description": "age at the first scan", "Units": "year"},
        "sex": {"Description": "sex", "Levels": {"F": "female", "M": "male"}},
        "group": {"Description": "group", "Levels": {"control": "control", "patient": "patient"}},
        "name": {"Description": "full name"}, "birth_date": {"Description": "date of birth"},
        "notes": {"Description": "free text"}}))
    (bids / "task-rest_bold.json").write_text(json.dumps({"TaskName": "rest", "RepetitionTime": 2.0}))
    head, brain = small_sample(step=step)
    subjects = {"sub-01/ses-1/anat/sub-01_ses-1": (head, 4.0), "sub-02/anat/sub-02": (
        head.with_array(np.rint(head.array * 1.3).astype(head.dtype)), -5.0)}
    for prefix, (t1, angle) in subjects.items():
        anat = bids / Path(prefix).parent
        anat.mkdir(parents=True)
        save_volume(t1, bids / f"{prefix}_T1w.nii.gz")
        (bids / f"{prefix}_T1w.json").write_text(json.dumps({"RepetitionTime": 2.3, "InstitutionName": "St Elsewhere",
                                                             "AcquisitionTime": "10:11:12"}))
        t2, _ = t2_like(t1, angle_deg=angle)
        save_volume(t2, bids / f"{prefix}_T2w.nii.gz")
        (masks / Path(prefix).parent).mkdir(parents=True)
        save_volume(brain, masks / f"{prefix}_desc-brain_mask.nii.gz")
    func = bids / "sub-01" / "ses-1" / "func"
    func.mkdir()
    _write_bold(func / "sub-01_ses-1_task-rest_bold.nii.gz")
    (func / "sub-01_ses-1_task-rest_bold.json").write_text(json.dumps({
        "TaskName": "rest", "RepetitionTime": 2.0, "AcquisitionTime": "10:11:12", "InstitutionName": "St Elsewhere"}))
    _tsv(bids / "sub-01" / "ses-1" / "sub-01_ses-1_scans.tsv", [
        ("filename", "acq_time"), ("anat/sub-01_ses-1_T1w.nii.gz", "2021-03-04T09:15:00"),
        ("anat/sub-01_ses-1_T2w.nii.gz", "2021-03-04T09:21:30"),
        ("func/sub-01_ses-1_task-rest_bold.nii.gz", "2021-03-04T09:30:00")])
    _tsv(bids / "sub-01" / "sub-01_sessions.tsv", [("session_id", "acq_time"), ("ses-1", "2021-03-04T09:00:00")])
    _tsv(bids / "sub-02" / "sub-02_scans.tsv", [
        ("filename", "acq_time"), ("anat/sub-02_T1w.nii.gz", "2020-11-30T14:02:00"),
        ("anat/sub-02_T2w.nii.gz", "2020-11-30T14:10:00")])
    return bids, masks


#: the environment variable that names the bids-validator executable
VALIDATOR_ENV = "BIDS_VALIDATOR"


def find_bids_validator():
    """The official bids-validator (npm, 1.x) command as a list, or (None, why it was not found).

    Looked up in this order: ``$BIDS_VALIDATOR``, ``bids-validator`` on PATH, the copy ``.ci/run``
    installs (``.ci/node/node_modules/.bin``), a ``node_modules/.bin`` at the repository root."""
    import os
    import shutil

    if shutil.which("node") is None:
        return None, "node is not installed (the official bids-validator is a node program)"
    root = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get(VALIDATOR_ENV), shutil.which("bids-validator"),
                  root / ".ci" / "node" / "node_modules" / ".bin" / "bids-validator",
                  root / "node_modules" / ".bin" / "bids-validator"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return [str(candidate)], ""
    return None, (f"bids-validator not found (set {VALIDATOR_ENV}, put it on PATH, or run "
                  "`npm install --prefix .ci/node bids-validator@1.14`)")


def run_bids_validator(command, dataset: Path) -> dict:
    """The validator's JSON report of ``dataset`` (``issues.errors``/``issues.warnings``, ``summary``)."""
    import subprocess

    result = subprocess.run(command + [str(dataset), "--json"], capture_output=True, text=True, timeout=300)
    start = result.stdout.find("{")
    if start < 0:
        raise AssertionError(f"bids-validator gave no JSON report (exit {result.returncode}): {result.stderr[-500:]}")
    return json.loads(result.stdout[start:])


def validator_errors(report: dict):
    """[(key, [files])] of the report's errors."""
    return [(issue.get("key"), [(f.get("file") or {}).get("relativePath") for f in issue.get("files", [])][:5])
            for issue in report["issues"]["errors"]]
