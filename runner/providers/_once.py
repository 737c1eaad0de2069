"""Things a provider loads once per process (a model, an engine) and shares across calls."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["LoadedOnce"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LoadedOnce(Generic[K, V]):
    """``make(key)`` run at most once per key in this process, even from several threads at once.

    Loading is slow and its result big (a model's weights), so two calls that need the same
    key at the same moment wait for one load rather than make two.
    """

    def __init__(self, make: Callable[[K], V]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._loaded: dict[K, V] = {}

    def get(self, key: K) -> V:
        """The loaded value for ``key``, loading it first if need be. May block: a worker thread's call."""
        with self._lock:
            value = self._loaded.get(key)
            if value is None:
                value = self._loaded[key] = self._make(key)
            return value

    def loaded(self, key: K) -> V | None:
        """The value for ``key`` if it is loaded already; never blocks, so the event loop may ask."""
        return self._loaded.get(key)
