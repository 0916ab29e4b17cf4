"""Loopback ports for the servers a test session starts."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

# Ray's workers listen on 10002-19999 by default.
FIRST_PORT = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# "i/n": this session takes the ports p with p % n == i, so sessions run side by side (tests/run_suite.py) never
# choose the same port.
SHARD_ENV = "LORAPLEX_TEST_PORT_SHARD"
_handed_out: set[int] = set()


def _shard() -> tuple[int, int]:
    index, _, count = os.environ.get(SHARD_ENV, "0/1").partition("/")
    return int(index), int(count)


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A loopback port free now, from below the kernel's ephemeral range. A server binds its port only once its
    engine has started, a minute after the port is chosen; a port from the ephemeral range can meanwhile become the
    local port of any outgoing connection (seen: the SmolLM2 server's, while the Ray cluster started)."""
    index, count = _shard()
    ports = [port for port in range(FIRST_PORT, _ephemeral_start())
             if port % count == index and port not in _handed_out]
    random.SystemRandom().shuffle(ports)  # sessions not sharded (two checkouts) rarely try the same ones
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # this machine's ephemeral range starts at or below FIRST_PORT
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
