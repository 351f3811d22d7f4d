"""A model a tool builds from its spec on first use: `visit`'s summariser, `file_analyzer`'s
vision model.

Tools travel to the processes that run attempts (pickled for ray); a loaded model does not,
so the slot pickles empty and each process builds its own, once, under a lock, since the
attempts of one process share the tool. A different spec (settings read from the
environment at each call) builds the model again.
"""

from __future__ import annotations

import threading
from typing import Any


class LazyModel:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._model: Any = None
        self._spec: str | None = None

    def get(self, spec: str, **options: Any) -> Any:
        """The model `spec` names, loaded with `options` the first time it is asked for."""
        with self._lock:
            if self._model is None or self._spec != spec:
                from toolself.models import load_model

                self._model, self._spec = load_model(spec, **options), spec
            return self._model

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()
