"""vLLM's engine processes exit when the server process dies, however it died.

vLLM's engine-core and worker processes outlived a server killed with SIGKILL (1.5 GB RSS, 25% CPU, until
killed by hand). In every process vLLM starts, a daemon thread watches the parent: once the process has been
re-parented (its parent died), it kills itself. Polling the parent id is used rather than PR_SET_PDEATHSIG,
which fires when the creating *thread* exits, not the process.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

POLL_S = 0.5
_started = False


def watch_parent() -> None:
    """In a child process (vLLM's engine core, its workers): die with the parent. Idempotent; does nothing
    in the server process itself, whose parent may come and go (a shell, a supervisor)."""
    global _started
    if _started or multiprocessing.parent_process() is None:
        return
    _started = True
    parent = os.getppid()
    threading.Thread(target=_watch, args=(parent,), name="loraplex-orphan-guard", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)
