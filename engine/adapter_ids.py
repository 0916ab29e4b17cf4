"""Stable integer ids for adapters, keyed by name and content hash.

vLLM caches adapters (and prefix-cache blocks) by `lora_int_id` and `lora_name`. Keying both on the content
hash means a changed adapter can never be served from a cache that holds its old weights.
"""

from __future__ import annotations

import hashlib
import threading

from adapters.identity import AdapterIdentity

_MAX_ID = 2**31 - 1


class AdapterIds:
    """Maps (name, content hash) to a positive int that stays the same for the life of the process,
    and across processes unless two keys collide (then the later key probes to the next free id)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], int] = {}
        self._taken: set[int] = set()
        self._lock = threading.Lock()

    def id_for(self, identity: AdapterIdentity) -> int:
        key = (identity.name, identity.content_hash)
        with self._lock:
            if key in self._by_key:
                return self._by_key[key]
            digest = hashlib.sha256(f"{identity.name}\0{identity.content_hash}".encode()).digest()
            candidate = int.from_bytes(digest[:4], "big") % _MAX_ID + 1
            while candidate in self._taken:
                candidate = candidate % _MAX_ID + 1
            self._by_key[key] = candidate
            self._taken.add(candidate)
            return candidate


ENGINE_NAME_SEPARATOR = "#"


def engine_lora_name(identity: AdapterIdentity) -> str:
    """The name vLLM sees: it includes the hash so prefix-cache keys change with the content."""
    return f"{identity.name}{ENGINE_NAME_SEPARATOR}{identity.content_hash[:16]}"


def adapter_name_of(engine_name: str) -> str:
    """The adapter's name in an `engine_lora_name`."""
    return engine_name.split(ENGINE_NAME_SEPARATOR, 1)[0]
