"""The reports of a run, all in the derivative ``derivatives/anonmri/``: per-image TSV, metadata decisions,
per-subject HTML pages; and the two ``dataset_description.json`` files (raw dataset, derivative)."""
import csv
import html
import io
import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Sequence, Tuple

from .. import __version__
from ..io.deidentification import method_description

TSV_NAME = "anonmri_scans.tsv"
METADATA_TSV_NAME = "anonmri_metadata.tsv"
COLUMNS = ("participant_id", "session", "scan", "suffix", "method", "status", "attempts", "seconds",
           "brain_voxels_exact", "brain_ml", "head_ml", "changed_ml", "changed_fraction_of_head_outside_brain",
           "reference", "warning", "error")


def derivative_dir(out_dir: Path) -> Path:
    from .scan import DERIVATIVE

    return Path(out_dir) / DERIVATIVE


def atomic_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` in one rename."""
    from ..io.writers import OutputTransaction

    with OutputTransaction() as outputs:
        outputs.add_file(path, lambda staged: staged.write_text(text, encoding="utf-8"))


def write_scores_tsv(out_dir: Path, records: Iterable[Dict[str, Any]]) -> Path:
    """``anonmri_scans.tsv``: one row per image of this run (skipped scans with the figures of their run)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, COLUMNS, delimiter="\t", extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: ("n/a" if record.get(k) in (None, "") else record.get(k)) for k in COLUMNS})
    path = derivative_dir(out_dir) / TSV_NAME
    atomic_text(path, buffer.getvalue())
    return path


def write_metadata_tsv(out_dir: Path, decisions: Sequence[Sequence[str]]) -> Path:
    """``anonmri_metadata.tsv``: file, column or key, decision, rule (never a value)."""
    rows = [("file", "field", "decision", "rule")] + [tuple(d) for d in decisions]
    path = derivative_dir(out_dir) / METADATA_TSV_NAME
    atomic_text(path, "".join("\t".join(v or "n/a" for v in row) + "\n" for row in rows))
    return path


def write_subject_pages(out_dir: Path, records: List[Dict[str, Any]]) -> List[Path]:
    """``sub-<label>.html``: the subject's images, their status, scores and warnings, and each scan's rendering."""
    from .bids_layout import Scan, parse_name
    from .scan import DERIVATIVE, output_names

    derivative = derivative_dir(out_dir)

    pages = []
    subjects = sorted({r["participant_id"] for r in records if r.get("participant_id")})
    for subject in subjects:
        rows = []
        for record in (r for r in records if r.get("participant_id") == subject):
            parsed = parse_name(record["scan"])
            figure = ""
            if parsed is not None and record.get("method") != "none":
                scan = Scan(record["scan"], subject[4:], record.get("session") or None, *parsed)
                png = output_names(scan)["figure"]
                if (out_dir / png).is_file():
                    src = Path(png).relative_to(DERIVATIVE).as_posix()
                    figure = f'<img src="{html.escape(src)}" alt="de-identified face" height="160">'
            scores = ", ".join(f"{k} {record[k]}" for k in ("changed_ml", "changed_fraction_of_head_outside_brain",
                                                           "brain_voxels_exact", "seconds") if k in record)
            rows.append(f"<tr><td>{html.escape(record['scan'])}</td><td>{html.escape(str(record.get('status')))}</td>"
                        f"<td>{html.escape(scores)}</td>"
                        f"<td>{html.escape(str(record.get('warning', '') or record.get('error', '')))}</td>"
                        f"<td>{figure}</td></tr>")
        page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>AnonMRI " + html.escape(subject) +
                "</title></head><body><h1>" + html.escape(subject) + "</h1><table border='1'>"
                "<tr><th>image</th><th>status</th><th>scores</th><th>warning / error</th><th>de-identified face</th></tr>"
                + "".join(rows) + "</table></body></html>\n")
        path = derivative / f"{subject}.html"
        atomic_text(path, page)
        pages.append(path)
    return pages


def dataset_descriptions(bids_dir: Path, summary: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(raw, derivative) ``dataset_description.json`` contents: the input's, ``DatasetType`` raw, plus a
    ``GeneratedBy`` entry saying it was de-identified by AnonMRI and how (``summary``); the derivative's
    (``DatasetType`` derivative, ``GeneratedBy``, ``SourceDatasets`` the raw dataset it sits in)."""
    from ..errors import InputError

    try:
        source = json.loads((bids_dir / "dataset_description.json").read_text(encoding="utf-8-sig"))
    except (OSError, ValueError, UnicodeDecodeError):
        raise InputError("dataset_description.json: not valid JSON") from None
    if not isinstance(source, dict):
        raise InputError("dataset_description.json: not a JSON object")
    generated = {"Name": "AnonMRI", "Version": __version__, "Description": summary}
    previous = source.get("GeneratedBy") if isinstance(source.get("GeneratedBy"), list) else []
    raw = dict(source, DatasetType="raw", GeneratedBy=previous + [generated])
    raw.setdefault("BIDSVersion", "1.9.0")
    raw.setdefault("Name", "BIDS dataset")
    derivative = {"Name": f"AnonMRI de-identification report of {raw['Name']}", "BIDSVersion": raw["BIDSVersion"],
                  "DatasetType": "derivative", "GeneratedBy": [generated], "SourceDatasets": [{"URL": "../../"}]}
    if "License" in source:
        derivative["License"] = source["License"]
    return raw, derivative


def write_dataset_descriptions(out_dir: Path, descriptions: Tuple[Dict[str, Any], Dict[str, Any]]) -> List[Path]:
    """Write the (raw, derivative) descriptions of :func:`dataset_descriptions`."""
    paths = [out_dir / "dataset_description.json", derivative_dir(out_dir) / "dataset_description.json"]
    for path, content in zip(paths, descriptions):
        atomic_text(path, json.dumps(content, indent=2) + "\n")
    return paths


def deidentification_summary(method: str, carried_suffixes: Sequence[str], date_shift: bool, age_bin: int) -> str:
    """The one line that says how the dataset was de-identified (``GeneratedBy`` Description)."""
    times = "shifted by one random offset per subject" if date_shift else "removed"
    ages = f"binned to {age_bin} years" if age_bin else "kept"
    return (f"De-identified by AnonMRI. T1w: {method_description(method)}. "
            + (f"{', '.join(carried_suffixes)} of a T1w's session: the T1w's face carried through a rigid "
               "registration, brain voxels kept. " if carried_suffixes else "")
            + "Every other image: header text and extensions removed, voxels unchanged. "
            f"Acquisition times {times}; identifying participants.tsv columns dropped, ages {ages} (89+ top-coded); "
            "identifying sidecar keys removed.")
