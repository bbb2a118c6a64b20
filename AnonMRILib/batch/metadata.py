"""The text files of a de-identified BIDS dataset: tables, sidecars, column dictionaries, plain files.

    outputs, decisions = prepare_metadata(layout, MetadataSettings(date_shift=True), subjects)
    write_metadata(outputs, out_dir)                        # every file atomically

Rules (every decision is returned as a :data:`Decision` and written to the derivative's
``anonmri_metadata.tsv``; values never are):

* **Tables** (``participants.tsv``, ``*sessions.tsv``, ``*scans.tsv``, ``phenotype/*.tsv``), per
  column, the first rule that applies:

  1. ``participant_id``, ``session_id``, ``filename``: kept (keys).
  2. ``acq_time``: removed; with ``date_shift``, every date of a subject is shifted by one random
     whole number of days drawn for that subject (``secrets``; never written anywhere), so that the
     subject's first acquisition falls in 1915-1924 (the BIDS recommendation for shifted dates:
     1925 or earlier); times of day and the relative timing within the subject are kept.
  3. a name that identifies (:data:`IDENTIFYING_NAME`: names, birth, dates, addresses, contacts,
     record numbers, comments/notes/descriptions): dropped.
  4. ``age``: kept, or binned to the lower edge of ``age_bin``-year bins; 89 or older is always
     written ``89+`` (HIPAA safe harbour, as the BIDS specification and validator ask).
  5. a value that looks like a date or a time: dropped.
  6. every value a number (or ``n/a``): kept.
  7. every value a ``Levels`` key of the column's JSON dictionary: kept (categorical).
  8. ``sex``, ``handedness``, ``group``, ``species``, ``strain``, ``strain_rrid`` with short
     one-word values: kept (BIDS categorical columns).
  9. anything else (free text): dropped. Declare ``Levels`` in the JSON dictionary to keep a column.

  ``participants.tsv`` keeps the rows of the subjects in the output only.
* **Column dictionaries** (``participants.json``, ``*sessions.json``, ``*scans.json``,
  ``phenotype/*.json``): the entries of dropped columns are removed.
* **Sidecars** (every other ``.json``): the keys of :data:`~AnonMRILib.io.sidecar.DROPPED_KEYS`
  are removed (the same rule as the de-identified images' sidecars).
* **Other files** (``README``, ``CHANGES``, ``LICENSE``, ``.bidsignore``, ``*.bval``/``*.bvec``,
  ``*_events.tsv``, physiology, ``code/``, ...): copied unchanged; the README is the authors'
  text and is not rewritten.
"""
import datetime
import json
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ..errors import InputError
from ..io.sidecar import DROPPED_KEYS
from .bids_layout import BidsLayout, subject_of

#: (file, column or key, decision, rule)
Decision = Tuple[str, str, str, str]
#: one output text: relative path -> the text to write, or the input file to copy unchanged
Outputs = Dict[str, Union[str, Path]]

KEY_COLUMNS = ("participant_id", "session_id", "filename")
TIME_COLUMN = "acq_time"
AGE_COLUMN = "age"
#: ages at or above this are written "89+"
AGE_TOP = 89
CATEGORICAL_COLUMNS = ("sex", "handedness", "group", "species", "strain", "strain_rrid")
#: column names that identify a person (searched in the lower-cased name)
IDENTIFYING_NAME = re.compile(r"name|birth|dob|date|address|street|city|zip|postcode|postal|phone|mail|ssn|"
                              r"mrn|nhs|insurance|initials|comment|note|remark|descr|free_?text|contact|"
                              r"physician|doctor|referr|accession|record")
_DATE_LIKE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}[/.]\d{1,2}[/.]\d{2,4}|\d{1,2}:\d{2}")
_ACQ_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2})(T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z?)?$")
_DATE_LABEL = re.compile(r"(19|20)\d{2}(0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01])")
_ONE_WORD = re.compile(r"^[A-Za-z0-9_.+-]{1,16}$")
#: shifted first acquisitions fall in [SHIFT_EARLIEST, SHIFT_LATEST)
SHIFT_LATEST = datetime.date(1925, 1, 1)
SHIFT_SPAN_DAYS = 3652


@dataclass(frozen=True)
class MetadataSettings:
    """How the tables' identifying columns are treated (see the module docstring)."""

    #: shift acquisition times by one random offset per subject (False: remove them)
    date_shift: bool = False
    #: width in years of the age bins (0: ages kept; 89 or older is always "89+")
    age_bin: int = 0

    def __post_init__(self) -> None:
        if self.age_bin < 0 or self.age_bin > 50:
            raise InputError(f"--age-bin must be 0 (keep ages) to 50 years, got {self.age_bin}")


def table_kind(relative_path: str) -> Optional[str]:
    """Which metadata table (or its column dictionary) ``relative_path`` is: ``participants``,
    ``sessions``, ``scans``, ``phenotype/<name>``, or None."""
    path = Path(relative_path)
    if path.suffix not in (".tsv", ".json"):
        return None
    if path.parts[0] == "phenotype":
        return f"phenotype/{path.stem}"
    if path.name in ("participants.tsv", "participants.json"):
        return "participants"
    for kind in ("sessions", "scans"):
        if path.stem == kind or path.stem.endswith(f"_{kind}"):
            return kind
    return None


def _read_tsv(path: Path) -> Tuple[List[str], List[List[str]]]:
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError):
        raise InputError(f"{path.name}: cannot be read as UTF-8 text") from None
    rows = [line.split("\t") for line in lines if line.strip()]
    if not rows:
        raise InputError(f"{path.name}: empty table")
    header = rows[0]
    if any(len(row) != len(header) for row in rows[1:]):
        raise InputError(f"{path.name}: rows and header have different numbers of columns")
    return header, rows[1:]


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise InputError(f"{path.name}: not valid JSON") from None
    if not isinstance(data, dict):
        raise InputError(f"{path.name}: not a JSON object")
    return data


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def column_rule(name: str, values: Sequence[str], levels: Optional[dict]) -> Tuple[str, str]:
    """(decision, rule) for one table column other than ``acq_time`` (rules 1 and 3-9 of the module)."""
    lower = name.lower()
    present = [v for v in values if v != "n/a"]
    if lower in KEY_COLUMNS:
        return "kept", "key column"
    if IDENTIFYING_NAME.search(lower):
        return "dropped", "identifying column name"
    if lower == AGE_COLUMN:
        return "kept", "age"
    if any(_DATE_LIKE.search(v) for v in present):
        return "dropped", "date- or time-like values"
    if all(_is_number(v) for v in present):
        return "kept", "numeric"
    if isinstance(levels, dict) and all(v in levels for v in present):
        return "kept", "categorical (Levels in the JSON dictionary)"
    if lower in CATEGORICAL_COLUMNS and all(_ONE_WORD.match(v) for v in present):
        return "kept", "BIDS categorical column"
    return "dropped", "free text"


def age_value(value: str, bin_years: int) -> str:
    """An age as written: ``89+`` from 89 on, binned to the bin's lower edge when ``bin_years``."""
    if value in ("n/a", f"{AGE_TOP}+"):
        return value
    try:
        age = float(value)
    except ValueError:
        return "n/a"
    if age >= AGE_TOP:
        return f"{AGE_TOP}+"
    if bin_years:
        return str(int(age // bin_years * bin_years))
    return value


def _parse_acq_time(value: str) -> Optional[Tuple[datetime.date, str]]:
    match = _ACQ_TIME.match(value)
    if not match:
        return None
    try:
        return datetime.date.fromisoformat(match.group(1)), match.group(2) or ""
    except ValueError:
        return None


def draw_offsets(root: Path, tables: Iterable[str], rng: Callable[[int], int] = secrets.randbelow
                 ) -> Dict[str, int]:
    """Subject label -> days to add to every date of that subject (see rule 2 of the module)."""
    earliest: Dict[str, datetime.date] = {}
    for relative in tables:
        subject = subject_of(relative)
        if subject is None:
            continue
        header, rows = _read_tsv(root / relative)
        if TIME_COLUMN not in header:
            continue
        column = header.index(TIME_COLUMN)
        for row in rows:
            parsed = _parse_acq_time(row[column])
            if parsed is not None and (subject not in earliest or parsed[0] < earliest[subject]):
                earliest[subject] = parsed[0]
    offsets = {}
    for subject, first in sorted(earliest.items()):
        target = SHIFT_LATEST - datetime.timedelta(days=1 + rng(SHIFT_SPAN_DAYS))
        offsets[subject] = (target - first).days
    return offsets


def _acq_times(values: Sequence[str], offset: Optional[int]) -> List[str]:
    shifted = []
    for value in values:
        parsed = _parse_acq_time(value)
        if offset is None or parsed is None:
            shifted.append("n/a")
        else:
            shifted.append((parsed[0] + datetime.timedelta(days=offset)).isoformat() + parsed[1])
    return shifted


def carry_table(root: Path, relative: str, levels: Dict[str, dict], settings: MetadataSettings,
                offsets: Dict[str, int], subjects: Sequence[str]) -> Tuple[str, List[Decision]]:
    """The de-identified text of one metadata table and its column decisions."""
    header, rows = _read_tsv(root / relative)
    columns = [[row[i] for row in rows] for i in range(len(header))]
    kept_header, kept_columns, decisions = [], [], []
    for name, values in zip(header, columns):
        if name == TIME_COLUMN and table_kind(relative) in ("sessions", "scans"):
            if settings.date_shift:
                values = _acq_times(values, offsets.get(subject_of(relative) or ""))
                decision, rule = "shifted", "acquisition time, one random offset per subject"
            else:
                decision, rule = "dropped", "acquisition time"
        else:
            decision, rule = column_rule(name, values, (levels.get(name) or {}).get("Levels"))
            if decision == "kept" and name.lower() == AGE_COLUMN:
                values = [age_value(v, settings.age_bin) for v in values]
                decision, rule = ("binned", f"age, {settings.age_bin}-year bins, {AGE_TOP}+") \
                    if settings.age_bin else ("kept", f"age, {AGE_TOP} or older written {AGE_TOP}+")
        decisions.append((relative, name, decision, rule))
        if decision != "dropped":
            kept_header.append(name)
            kept_columns.append(values)
    rows_out = list(zip(*kept_columns)) if kept_columns else []
    if relative == "participants.tsv" and "participant_id" in kept_header:
        index = kept_header.index("participant_id")
        wanted = {f"sub-{s}" for s in subjects}
        rows_out = [row for row in rows_out if row[index] in wanted]
    text = "".join("\t".join(row) + "\n" for row in [tuple(kept_header)] + rows_out)
    return text, decisions


def scrub_sidecar(root: Path, relative: str) -> Tuple[str, List[Decision]]:
    """A carried JSON sidecar without its identifying keys (:data:`~AnonMRILib.io.sidecar.DROPPED_KEYS`)."""
    data = _read_json(root / relative)
    dropped = [key for key in data if key in DROPPED_KEYS]
    kept = {key: value for key, value in data.items() if key not in DROPPED_KEYS}
    return json.dumps(kept, indent=2) + "\n", [(relative, key, "dropped", "identifying sidecar key")
                                               for key in dropped]


def prepare_metadata(layout: BidsLayout, settings: MetadataSettings, subjects: Sequence[str],
                     rng: Callable[[int], int] = secrets.randbelow) -> Tuple[Outputs, List[Decision]]:
    """Every carried text file of ``layout`` (read and checked now, written by :func:`write_metadata`).

    ``subjects``: the labels the output dataset holds (``participants.tsv`` keeps their rows).
    Raises :class:`InputError` (one line) for a table or JSON file that cannot be read.
    """
    root = Path(layout.root)
    files = [f for f in layout.carried_files if f != "dataset_description.json"]
    tables = [f for f in files if f.endswith(".tsv") and table_kind(f)]
    dictionaries = {f: _read_json(root / f) for f in files if f.endswith(".json") and table_kind(f)}
    offsets = draw_offsets(root, tables, rng) if settings.date_shift else {}
    outputs: Outputs = {}
    decisions: List[Decision] = []
    dropped_by_kind: Dict[str, set] = {}
    for relative in tables:
        kind = table_kind(relative)
        levels: Dict[str, dict] = {}
        for dictionary, content in dictionaries.items():
            if table_kind(dictionary) == kind and (dictionary.count("/") == 0 or
                                                  Path(dictionary).stem == Path(relative).stem):
                levels.update({k: v for k, v in content.items() if isinstance(v, dict)})
        outputs[relative], table_decisions = carry_table(root, relative, levels, settings, offsets, subjects)
        decisions.extend(table_decisions)
        dropped_by_kind.setdefault(kind, set()).update(d[1] for d in table_decisions if d[2] == "dropped")
    for relative, content in dictionaries.items():
        dropped = dropped_by_kind.get(table_kind(relative), set())
        kept = {key: value for key, value in content.items() if key not in dropped}
        if settings.age_bin and isinstance(kept.get(AGE_COLUMN), dict):
            kept[AGE_COLUMN] = dict(kept[AGE_COLUMN], Description=(
                f"{kept[AGE_COLUMN].get('Description', 'age')} (binned by AnonMRI: lower edge of "
                f"{settings.age_bin}-year bins; {AGE_TOP} or older: {AGE_TOP}+)"))
        outputs[relative] = json.dumps(kept, indent=2) + "\n"
        decisions.extend((relative, key, "dropped", "entry of a dropped column") for key in content if key in dropped)
    for relative in files:
        if relative in outputs:
            continue
        if relative.endswith(".json"):
            outputs[relative], sidecar_decisions = scrub_sidecar(root, relative)
            decisions.extend(sidecar_decisions)
        else:
            outputs[relative] = root / relative
    decisions.extend((name, "", "left out", "not carried (sourcedata, derivatives or hidden)")
                     for name in layout.left_out)
    decisions.extend(label_warnings([s.relative_path for s in layout.scans] + list(layout.carried_images) + files))
    return outputs, decisions


def label_warnings(relative_paths: Iterable[str]) -> List[Decision]:
    """A ``warning`` decision for each subject or session folder whose label looks like a date
    (``ses-20210304``): file names are carried as they are, so such a label must be renamed before sharing."""
    folders = sorted({"/".join(p.split("/")[: i + 1]) for p in relative_paths
                      for i, part in enumerate(p.split("/")[:2]) if part.startswith(("sub-", "ses-"))})
    return [(folder, "label", "warning", "the label looks like a date; rename it before sharing")
            for folder in folders if _DATE_LABEL.search(folder.rsplit("/", 1)[-1])]


def write_metadata(outputs: Outputs, out_dir: Path) -> None:
    """Write every prepared text file (or copy) into ``out_dir``, each atomically."""
    from ..io.writers import OutputTransaction

    for relative, content in sorted(outputs.items()):
        with OutputTransaction() as transaction:
            if isinstance(content, Path):
                transaction.add_file(out_dir / relative, lambda staged, s=content: shutil.copyfile(str(s), str(staged)),
                                     protect=[content])
            else:
                transaction.add_file(out_dir / relative,
                                     lambda staged, t=content: staged.write_text(t, encoding="utf-8"))
