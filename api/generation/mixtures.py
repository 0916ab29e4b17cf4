"""Mixtures of adapters named per request: `model` = "pirate*0.6+uppercase@2*0.4".

Each part is a model reference (NAME, NAME@VERSION or NAME:ALIAS) and its weight. The mixture is the exact
rank-stacked adapter of its parts (`adapters/compose.py`, the method of published compositions), published once
into the registry under a name derived from the parts' content hashes and weights (`mixture-<16 hex>`): a part
promoted or republished is a new mixture, a mixture asked for again is served from the registry (and the tiers
count it like any adapter). Metrics, the ledger and the response name it by its parts and their versions
(`canonical`), e.g. "pirate@1*0.6+uppercase@2*0.4".
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from adapters.identity import MIXTURE_PREFIX, ModelRef, parse_model_ref
from adapters.manifest import Manifest
from adapters.registry import AdapterNotFound, Registry
from api.errors import OpenAIError, bad_request
from api.tenancy.config import MixtureLimits

PART_SEPARATOR = "+"
WEIGHT_SEPARATOR = "*"
BUILD_WINDOW_S = 60.0


@dataclass(frozen=True)
class MixturePart:
    ref: ModelRef
    weight: float


def is_mixture(model: str) -> bool:
    return PART_SEPARATOR in model or WEIGHT_SEPARATOR in model


def parse_mixture(model: str) -> list[MixturePart]:
    """The parts of a mixture's spelling; raises ValueError naming every malformed part."""
    problems: list[str] = []
    parts: list[MixturePart] = []
    for i, text in enumerate(model.split(PART_SEPARATOR), start=1):
        ref_text, star, weight_text = text.rpartition(WEIGHT_SEPARATOR)
        if not star:
            problems.append(f"part {i} ({text!r}) must be REF*WEIGHT")
            continue
        try:
            ref = parse_model_ref(ref_text)
        except ValueError as e:
            problems.append(f"part {i}: {e}")
            continue
        try:
            weight = float(weight_text)
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight == 0:
            problems.append(f"part {i}: weight {weight_text!r} must be a finite, non-zero number")
            continue
        parts.append(MixturePart(ref, weight))
    names = [p.ref.name for p in parts]
    problems += [f"{name} is named more than once" for name in sorted({n for n in names if names.count(n) > 1})]
    if len(parts) + len(problems) < 2:
        problems.append("a mixture needs at least two parts")
    if problems:
        raise ValueError("; ".join(problems))
    return parts


def canonical(parts: list[tuple[Manifest, float]]) -> str:
    """How the request's mixture is named in responses, metrics and the ledger: versions resolved."""
    return PART_SEPARATOR.join(f"{m.label}{WEIGHT_SEPARATOR}{weight!r}" for m, weight in parts)


def mixture_name(parts: list[tuple[Manifest, float]]) -> str:
    """The registry name of a mixture: its parts' content hashes and weights, in order."""
    key = "\n".join(f"{m.content_hash}{WEIGHT_SEPARATOR}{weight!r}" for m, weight in parts)
    return MIXTURE_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:16]


class Mixtures:
    """Builds (once) and finds the mixture of resolved parts. Single event loop."""

    def __init__(self, registry: Registry, limits: MixtureLimits, clock: Callable[[], float] = time.monotonic):
        self.registry = registry
        self.limits = limits
        self._clock = clock
        self._building: dict[str, asyncio.Future[Manifest]] = {}
        self._builds: dict[str, deque[float]] = {}  # tenant -> when each of its builds started

    def check(self, parts: list[tuple[Manifest, float]]) -> None:
        """The bounds a mixture must keep, every problem at once (400)."""
        problems = []
        if len(parts) > self.limits.max_components:
            problems.append(f"{len(parts)} parts, more than the {self.limits.max_components} allowed")
        rank, most = sum(m.rank for m, _ in parts), self.registry.limits.max_lora_rank
        if rank > most:
            problems.append(f"total rank {rank} (the sum of the parts' ranks) is over the server's max LoRA rank "
                            f"{most}")
        if problems:
            raise bad_request("Mixture refused: " + "; ".join(problems) + ".", code="invalid_mixture")

    async def manifest(self, parts: list[tuple[Manifest, float]], tenant: str) -> Manifest:
        """The published mixture of `parts`, built now if it never was (counted against `tenant`'s builds)."""
        self.check(parts)
        name = mixture_name(parts)
        try:
            return self.registry.resolve(ModelRef(name, 1))
        except AdapterNotFound:
            pass
        pending = self._building.get(name)
        if pending is None:
            self._charge(tenant)
            refs = [(ModelRef(m.name, m.version), weight) for m, weight in parts]
            pending = asyncio.ensure_future(asyncio.to_thread(self._build, name, refs, canonical(parts)))
            self._building[name] = pending
            pending.add_done_callback(lambda _: self._building.pop(name, None))
        return await asyncio.shield(pending)

    def _build(self, name: str, refs: list[tuple[ModelRef, float]], description: str) -> Manifest:
        try:
            return self.registry.compose(name, refs, description)[0]
        except ValueError as e:  # parts that cannot be mixed (CompositionError), a mixture that fails validation
            raise bad_request(f"Mixture refused: {e}", code="invalid_mixture") from e

    def _charge(self, tenant: str) -> None:
        now = self._clock()
        times = self._builds.setdefault(tenant, deque())
        while times and now - times[0] >= BUILD_WINDOW_S:
            times.popleft()
        if len(times) >= self.limits.builds_per_minute:
            retry = max(1, math.ceil(BUILD_WINDOW_S - (now - times[0])))
            raise OpenAIError(429, f"This tenant built {len(times)} new mixtures in the last minute, the most "
                              "allowed; mixtures built before are still served.", code="mixture_build_limit",
                              headers={"Retry-After": str(retry)})
        times.append(now)
