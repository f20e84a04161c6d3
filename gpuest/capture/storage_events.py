"""When each storage of a traced step is allocated and freed, in op order.

Fake tensors follow the real program's reference counting: a storage dies when the last tensor on it
does, whether Python, autograd's saved variables or the autocast weight cache held it. A weak
finalizer on each storage the recorder sees therefore reports its free at the moment the real
program's caching allocator would get it back. Events are tokens: "+SID:BYTES" (allocated), "-SID" (freed).
"""
from __future__ import annotations

import weakref
from typing import Callable, Iterable

import torch

PERSISTENT_KINDS = ("weights", "inputs", "optimizer_state")
HOST = "host"   # tensors the real program keeps in host memory: tracked so their uses allocate nothing


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None  # tensors without storage (sparse, nested) are not tracked


class StorageEvents:
    """Assigns each live storage an id and collects its allocation and free events.

    on_free(key): called (at the next `drain`) with the storage key of each storage that died, so the
    caller can forget state keyed by it before the key is reused by a new storage."""

    def __init__(self, on_free: Callable[[int], None]) -> None:
        self._on_free = on_free
        self._sid_by_key: dict[int, int] = {}
        self._dead: list[tuple[int, int]] = []   # (sid, key) reported by finalizers, not yet drained
        self._next_sid = 0
        self.persistent: list[tuple[int, int, str]] = []   # (sid, bytes, kind) alive before the step

    def _track(self, st: torch.UntypedStorage) -> tuple[int, bool]:
        """(sid, newly seen) of a live storage."""
        key = st._cdata
        sid = self._sid_by_key.get(key)
        if sid is not None:
            return sid, False
        sid = self._next_sid
        self._next_sid += 1
        self._sid_by_key[key] = sid
        fin = weakref.finalize(st, self._dead.append, (sid, key))
        fin.atexit = False
        return sid, True

    def add_persistent(self, ts: Iterable[torch.Tensor], kind: str) -> None:
        """Storages alive before the step starts (parameters, buffers, inputs, optimizer state), or with kind
        HOST, ones that live in host memory in the real program."""
        if kind not in PERSISTENT_KINDS + (HOST,):
            raise ValueError(f"unknown persistent kind {kind!r}; accepted: {', '.join(PERSISTENT_KINDS + (HOST,))}")
        for t in ts:
            st = _storage(t)
            if st is None:
                continue
            sid, new = self._track(st)
            if new and kind != HOST:
                self.persistent.append((sid, int(st.nbytes()), kind))

    def touch(self, ts: Iterable[torch.Tensor], events: list[str]) -> None:
        """Append an allocation event to `events` for each storage of `ts` not seen before."""
        for t in ts:
            st = _storage(t)
            if st is None:
                continue
            sid, new = self._track(st)
            if new:
                events.append(f"+{sid}:{int(st.nbytes())}")

    def drain(self, events: list[str]) -> None:
        """Append free events for storages that died since the last drain."""
        while self._dead:
            sid, key = self._dead.pop(0)
            if self._sid_by_key.get(key) == sid:
                del self._sid_by_key[key]
                self._on_free(key)
            events.append(f"-{sid}")

    def sids(self, ts: Iterable[torch.Tensor]) -> list[int]:
        """Ids of the live storages of `ts` (seen before)."""
        out = []
        for t in ts:
            st = _storage(t)
            if st is not None and st._cdata in self._sid_by_key:
                out.append(self._sid_by_key[st._cdata])
        return out
