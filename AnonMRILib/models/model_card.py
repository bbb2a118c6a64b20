"""Checks shared by every shipped model: the SHA-256 of a weights file against its JSON model card.

Weights ship as ``safetensors`` (never pickle) with a small JSON card beside them (configuration,
training data, metrics and the file's SHA-256). Each model family reads its own card; the
checksum and its check live here, once.
"""
import hashlib
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Dict, Union

from ..errors import WeightsError

PathLike = Union[str, Path]


def sha256_of(path: PathLike) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: PathLike, expected: str, what: str = "weights") -> None:
    """Raise :class:`WeightsError` unless ``path``'s SHA-256 equals the card's ``expected`` digest."""
    actual = sha256_of(path)
    if str(expected) != actual:
        raise WeightsError(f"{what} {path} are corrupt or do not belong to their model card "
                           f"(SHA-256 {actual[:12]}... differs from the card's {str(expected)[:12]}...)")


class JSONConfig:
    """``to_dict`` / ``from_dict`` for a config dataclass stored as JSON in a model card.

    Tuples are written as JSON lists and read back as tuples; unknown keys are refused with a
    ``ValueError`` (a card for another model version must not load silently).
    """

    def to_dict(self) -> Dict[str, Any]:
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]):
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys: {sorted(unknown)}")
        return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in data.items()})
