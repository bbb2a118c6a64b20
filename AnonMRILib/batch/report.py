"""Per-scan scores TSV, per-subject HTML pages and the output dataset's description."""
import csv
import html
import io
import json
from pathlib import Path
from typing import Any, Dict, Iterable, List

from .. import __version__
from ..io.deidentification import method_description

TSV_NAME = "anonmri_scans.tsv"
COLUMNS = ("participant_id", "session", "scan", "suffix", "method", "status", "attempts", "seconds",
           "brain_voxels_exact", "brain_ml", "head_ml", "changed_ml", "changed_fraction_of_head_outside_brain",
           "reference", "error")


def _atomic_text(path: Path, text: str) -> None:
    from ..io.writers import OutputTransaction

    with OutputTransaction() as outputs:
        outputs.add_file(path, lambda staged: staged.write_text(text, encoding="utf-8"))


def write_scores_tsv(out_dir: Path, records: Iterable[Dict[str, Any]]) -> Path:
    """``anonmri_scans.tsv``: one row per scan of this run (skipped scans with the figures of their run)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, COLUMNS, delimiter="\t", extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: ("n/a" if record.get(k) in (None, "") else record.get(k)) for k in COLUMNS})
    path = out_dir / TSV_NAME
    _atomic_text(path, buffer.getvalue())
    return path


def write_subject_pages(out_dir: Path, records: List[Dict[str, Any]]) -> List[Path]:
    """``sub-<label>.html``: the subject's scans, their status and scores, and each before/after PNG."""
    from .scan import output_names
    from .bids_layout import Scan, parse_name

    pages = []
    subjects = sorted({r["participant_id"] for r in records if r.get("participant_id")})
    for subject in subjects:
        rows = []
        for record in (r for r in records if r.get("participant_id") == subject):
            parsed = parse_name(record["scan"])
            figure = ""
            if parsed is not None:
                scan = Scan(record["scan"], subject[4:], record.get("session") or None, *parsed)
                png = output_names(scan)["figure"]
                if (out_dir / png).is_file():
                    figure = f'<img src="{html.escape(png)}" alt="before/after" height="160">'
            scores = ", ".join(f"{k} {record[k]}" for k in ("changed_ml", "changed_fraction_of_head_outside_brain",
                                                           "brain_voxels_exact", "seconds") if k in record)
            rows.append(f"<tr><td>{html.escape(record['scan'])}</td><td>{html.escape(str(record.get('status')))}</td>"
                        f"<td>{html.escape(scores)}</td><td>{html.escape(str(record.get('error', '')))}</td>"
                        f"<td>{figure}</td></tr>")
        page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>AnonMRI " + html.escape(subject) +
                "</title></head><body><h1>" + html.escape(subject) + "</h1><table border='1'>"
                "<tr><th>scan</th><th>status</th><th>scores</th><th>error</th><th>before / after</th></tr>"
                + "".join(rows) + "</table></body></html>\n")
        path = out_dir / f"{subject}.html"
        _atomic_text(path, page)
        pages.append(path)
    return pages


def write_dataset_description(bids_dir: Path, out_dir: Path, method: str) -> Path:
    """The output dataset's ``dataset_description.json``: a derivative ``GeneratedBy`` AnonMRI."""
    source = {}
    try:
        source = json.loads((bids_dir / "dataset_description.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    description = {
        "Name": f"{source.get('Name', 'BIDS dataset')} (de-identified by AnonMRI)",
        "BIDSVersion": source.get("BIDSVersion", "1.9.0"),
        "DatasetType": "derivative",
        "GeneratedBy": [{"Name": "AnonMRI", "Version": __version__, "Description": method_description(method)}],
    }
    for key in ("License", "Authors", "Acknowledgements", "HowToAcknowledge", "Funding", "ReferencesAndLinks"):
        if key in source:
            description[key] = source[key]
    path = out_dir / "dataset_description.json"
    _atomic_text(path, json.dumps(description, indent=2) + "\n")
    return path
