"""Holding a real vLLM engine still, so that an end-to-end test orders its events by construction.

A test that needs "the stream is still running when X happens" cannot get it from a long stream: on a busy
machine the test process itself can be seconds late (measured: a client thread beside a running stream built its
`httpx.Client` 4.5 s late while the server answered a fresh process in 2 ms). So the engine's processes are
stopped (SIGSTOP) while the test acts, and let run only in short pulses:

    with EngineGate.of(server_pid) as gate:              # the engine is held: no token is generated
        stream = StreamReader(url, headers, body)        # the request reaches the engine, which cannot run it
        gate.pulse_until(lambda: bool(stream.chunks))    # a first chunk, and at most a pulse's tokens more
        stream.drop()                                    # drop, kill, signal: the stream cannot end meanwhile
    # released here whatever happened

The HTTP server, admission, the ledger and Ray keep running while the engine is held; only generation (and
adapter loads into the engine) wait.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import _alive, _descendants

PULSE_S = 0.03  # how long one pulse lets the engine run: a few steps of the tiny model
SETTLE_S = 0.1  # how long a held engine's last outputs are given to reach the condition before the next pulse


class EngineGate:
    """SIGSTOP / SIGCONT on a server's (or a Ray replica's) engine processes: its descendants."""

    def __init__(self, pids: Iterable[int]):
        self.pids = sorted(pids)
        if not self.pids:
            raise RuntimeError("no engine processes to hold")

    @classmethod
    def of(cls, parent_pid: int) -> EngineGate:
        return cls(_descendants(parent_pid))

    def hold(self) -> None:
        self._signal(signal.SIGSTOP)

    def release(self) -> None:
        self._signal(signal.SIGCONT)

    def pulse(self, seconds: float = PULSE_S, server_pid: int | None = None) -> None:
        """Lets the engine run for `seconds`, timed by a child process at real-time priority where allowed: the
        test process itself can wake seconds late (its threads reading a fast stream hold the GIL), and so can a
        plain child on a saturated machine, and the engine would run on meanwhile.
        `server_pid`: a server held while the engine runs, so that the pulse works only on the requests the
        server had already handed the engine."""
        engine = " ".join(str(pid) for pid in self.pids if _alive(pid))
        script = f"kill -CONT {engine} 2>/dev/null; sleep {seconds}; kill -STOP {engine} 2>/dev/null"
        if server_pid is not None:
            script = f"kill -STOP {server_pid}; {script}; kill -CONT {server_pid}"
        subprocess.run([*_realtime(), "sh", "-c", script], check=False)

    def pulse_until(self, condition: Callable[[], bool], timeout_s: float = 300, pulse_s: float = PULSE_S,
                    server_pid: int | None = None) -> None:
        """Pulses until `condition` holds, looking after each pulse with the engine held (so the condition sees
        a state that cannot move on). `server_pid`: see `pulse`."""
        deadline = time.monotonic() + timeout_s
        while not _wait(condition, SETTLE_S):
            if time.monotonic() > deadline:
                raise AssertionError("the held engine never reached the condition")
            self.pulse(pulse_s, server_pid)

    def __enter__(self) -> EngineGate:
        self.hold()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _signal(self, sig: int) -> None:
        for pid in self.pids:
            if _alive(pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


@functools.cache
def _realtime() -> list[str]:
    """`chrt -f 99` where this process may use it (root, or an RLIMIT_RTPRIO that allows it), else nothing.
    Measured with three busy loops beside the engine: 25 plain pulses of 0.03 s took up to 2.7 s, and that one
    pulse ran a 1000-token stream to its end; at real-time priority they took 33-48 ms."""
    command = ["chrt", "-f", "99"]
    if shutil.which("chrt") and subprocess.run([*command, "true"], capture_output=True).returncode == 0:
        return command
    return []


def _wait(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    if not _wait(condition, timeout_s):
        raise AssertionError(f"never {what} within {timeout_s} s")


class StreamReader:
    """An SSE stream read on a thread of its own: the test thread keeps pulsing and signalling meanwhile.
    `drop()` shuts the connection down from the test thread (as a client that goes away), even while the reader
    waits for a chunk that a held engine cannot produce."""

    def __init__(self, url: str, headers: dict[str, str], body: dict):
        self.events: list[str] = []  # the `data:` payloads, [DONE] included
        self.status: int | None = None
        self.error: BaseException | None = None
        self._socket: socket.socket | None = None
        self._dropped = False
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(url, headers, body), daemon=True)
        self._thread.start()

    @property
    def chunks(self) -> list[dict]:
        return [json.loads(e) for e in list(self.events) if e != "[DONE]"]

    def drop(self) -> None:
        if not self._connected.wait(60):
            raise AssertionError("the stream never got its response head")
        if self._socket is None:
            raise AssertionError(f"the stream failed before its response head: {self.error!r}")
        self._dropped = True
        self._socket.shutdown(socket.SHUT_RDWR)
        self.join()

    def join(self, timeout_s: float = 120) -> None:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError("the stream did not end")
        if self.error is not None and not self._dropped:
            raise self.error

    def _read(self, url: str, headers: dict[str, str], body: dict) -> None:
        try:
            with httpx.stream("POST", url, headers=headers, json=body, timeout=300) as response:
                self.status = response.status_code
                self._socket = response.extensions["network_stream"].get_extra_info("socket")
                self._connected.set()
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[len("data: "):])
        except BaseException as e:  # noqa: BLE001 (handed to the test thread by join)
            self.error = e
        finally:
            self._connected.set()


async def until_engine_holds(client: httpx.AsyncClient, count: int, headers: dict[str, str] | None = None,
                             timeout_s: float = 120) -> None:
    """Waits until the engine's frontend tracks `count` unfinished requests (read from the server's /metrics):
    with the engine held, they will share its next steps. `headers`: the metrics key, where one is required."""
    deadline = time.monotonic() + timeout_s
    while True:
        page = await client.get("/metrics", headers=headers or {},
                                params=[("name[]", "loraplex_engine_unfinished_requests")])
        if sum(s.value for family in text_string_to_metric_families(page.text) for s in family.samples) >= count:
            return
        assert time.monotonic() < deadline, f"{count} requests never reached the engine"
        await asyncio.sleep(0.05)
