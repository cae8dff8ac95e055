"""JSON-lines input records: the one reader and the one error type of every data loader.

A leaf module: eval/workload.py (RACE, QuALITY) and eval/mooncake.py (traces) both read
through it, so neither imports the other for it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A malformed input record; the message names the file and the line."""


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) per non-blank line; a bad line is a DataError naming it."""
    with path.open("rb") as f:  # NOTE: decode per line so a bad byte names its line
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path} line {lineno}: not UTF-8 ({e.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path} line {lineno}: malformed JSON ({e})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path} line {lineno}: expected a JSON object")
            yield lineno, row
