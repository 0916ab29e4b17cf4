"""What admission hands out: a `Ticket` for slots, held from grant to release."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Ticket:
    """Engine slots (one per sequence), held from grant to `FairAdmission.release`."""

    tenant: str
    slots: int = 1
    adapter: str | None = None  # the adapter's label; None: the base model
    enqueued_at: float = 0.0
    queue_seconds: float = 0.0
    granted_at: float = 0.0
    released: bool = False
    # A batch line's ticket: runs only on slots live traffic leaves free; `preempt` makes its holder give it back.
    background: bool = False
    preempt: Callable[[], None] | None = None
    preempted: bool = False
