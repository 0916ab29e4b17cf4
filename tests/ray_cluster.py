"""A real multi-node Ray cluster on this machine: each node its own `ray start` (its own raylet, object store and
resources), started with Ray's CLI as an operator would, and each on an address of its own on loopback.

Ray replaces 127.0.0.1 by the host's routable address; any other 127.x.y.z is used as given, so node i listens
on 127.0.0.(i+2) and nothing leaves the machine. The cluster runs with token authentication on (`RAY_AUTH_MODE=token`,
a token of the session), as a secured production cluster does; `env` is what a process that joins it needs.
A node is lost as a host is: every process of its `ray start`, raylet and workers included, killed at once.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import _descendants
from tests.ports import free_port

START_TIMEOUT_S = 120
STARTED = "Ray runtime started"
RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE_BYTES = 256 * 2**20  # only deltas and reports cross it


class RayNode:
    """One `ray start --block`: it stays in the foreground and its processes (raylet, workers, agents) are its
    descendants."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.argv, self.env, self.log = argv, env, log
        self.proc: subprocess.Popen | None = None
        self._starts = 0  # "Ray runtime started" lines in the log before the last start

    def start(self) -> None:
        self._starts = self._starts_logged()
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._starts_logged() == self._starts:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ray start did not start within {START_TIMEOUT_S} s; see {self.log}")
            time.sleep(0.2)

    def _starts_logged(self) -> int:
        return self.log.read_text().count(STARTED) if self.log.exists() else 0

    def processes(self) -> set[int]:
        return {self.proc.pid, *_descendants(self.proc.pid)} if self.proc is not None else set()

    def kill(self) -> None:
        """SIGKILL to every process of the node at once, as when its host is lost."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)


class RayCluster:
    """A head node and `workers` more, each with `num_cpus` CPUs."""

    def __init__(self, root: Path, workers: int = 1, num_cpus: int = 1, env: dict[str, str] | None = None):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.port = free_port()
        self.env = {**(env or os.environ), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        common = ["--num-cpus", str(num_cpus), "--object-store-memory", str(OBJECT_STORE_BYTES),
                  "--disable-usage-stats", "--block"]
        self.head = RayNode(
            [RAY, "start", "--head", "--node-ip-address", "127.0.0.2", "--port", str(self.port),
             "--temp-dir", str(root / "ray"), "--include-dashboard=false", "--dashboard-port", str(free_port()),
             "--ray-client-server-port", str(free_port()), *common],
            self.env, root / "head.log")
        self.workers = [
            RayNode([RAY, "start", "--address", self.address, "--node-ip-address", f"127.0.0.{i + 3}", *common],
                    self.env, root / f"worker-{i}.log")
            for i in range(workers)]

    @property
    def address(self) -> str:
        return f"127.0.0.2:{self.port}"

    @property
    def nodes(self) -> list[RayNode]:
        return [self.head, *self.workers]

    def launch(self) -> None:
        """`start` in a thread of its own, so that the nodes start beside other work; `wait_started` joins it."""
        def start() -> None:
            try:
                self.start()
            except BaseException as e:  # noqa: BLE001 (raised again by wait_started)
                self._error = e

        self._thread = threading.Thread(target=start, name="ray-cluster-start", daemon=True)
        self._thread.start()

    def wait_started(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise RuntimeError("the Ray cluster did not start") from self._error

    def start(self) -> None:
        """The head, then the other nodes (they join through the head's GCS)."""
        self.head.start()
        self.head.wait_started()
        for node in self.workers:
            node.start()
        for node in self.workers:
            node.wait_started()

    def node_of(self, pid: int) -> RayNode | None:
        """The node a process runs on (a replica's worker is a descendant of its node's raylet)."""
        return next((node for node in self.nodes if pid in node.processes()), None)

    def kill(self) -> None:
        """Every node, at once (the end of the tests: nothing there is kept), once a launch is over."""
        if self._thread is not None:
            self._thread.join()
        for node in reversed(self.nodes):
            node.kill()
