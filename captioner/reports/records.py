"""Reading records: the JSON one evaluated run wrote (``captioner recipe run``; docs/*/rows/NAME.json), each error
naming its file."""

from __future__ import annotations

import json
from pathlib import Path


class RecordError(ValueError):
    """A record that cannot be read: the message names the file."""


def read_record(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise RecordError(f"{path}: cannot read the record ({err})") from None
    except json.JSONDecodeError as err:
        raise RecordError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: a record is a JSON object, not {type(data).__name__}")
    return data


def read_rows(folder: Path) -> dict[str, dict]:
    """name -> record of every NAME.json in ``folder`` (none when it does not exist), in name order."""
    return {path.stem: read_record(path) for path in sorted(folder.glob("*.json"))} if folder.is_dir() else {}
