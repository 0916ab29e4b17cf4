"""The real HTTP server (uvicorn, with the server's own settings) on a loopback port, in a thread."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time

from api.config import ServerConfig
from api.input_limits import InputLimits
from api.lifecycle import DrainingServer, http_config


class RunningServer:
    """A DrainingServer on its own thread and event loop, on a loopback port chosen by the kernel."""

    def __init__(self, app, lifecycle, drain_timeout_s: float = 30.0, limits: InputLimits = InputLimits(),
                 keep_alive_s: float = ServerConfig.model_fields["keep_alive_s"].default):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = http_config(app, limits, log_level="warning", keep_alive_s=keep_alive_s, graceful_timeout_s=1)
        self.server = DrainingServer(config, lifecycle, drain_timeout_s)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))
            # A process would exit here and close its sockets; let transports closed on the way out finish.
            self.loop.run_until_complete(asyncio.sleep(0.2))
        finally:
            self.loop.close()
            self.sock.close()

    def __enter__(self) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.server.started
        return self

    def sigterm(self) -> None:
        """What the signal handler does, on the server's loop (signals only reach a main thread)."""
        self.loop.call_soon_threadsafe(self.server.handle_exit, signal.SIGTERM, None)

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
