"""A cache of service answers on disk, so that a rerun or a repeat does not pay twice.

Entries are keyed by a hash of what identifies the answer (service, endpoint, query or URL,
result count), never by a credential, and hold only the parsed answer. Files are written to a
temporary name and renamed, so concurrent attempts never read half an entry; a damaged entry
is a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any


class DiskCache:
    def __init__(self, folder: Path | str):
        self.folder = Path(folder)

    def _path(self, key: list[Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, ensure_ascii=False, sort_keys=True).encode()).hexdigest()
        return self.folder / digest[:2] / f"{digest}.json"

    def get(self, key: list[Any]) -> Any | None:
        try:
            return json.loads(self._path(key).read_text(encoding="utf-8"))["value"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: list[Any], value: Any) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps({"key": key, "value": value}, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)
