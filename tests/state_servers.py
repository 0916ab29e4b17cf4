"""A real redis-server and a real PostgreSQL for the shared-state tests: each on a temporary data directory and a
free loopback port, started once per session and stopped after. Missing binaries fail loudly (`make test`
installs them: Debian's redis-server and postgresql)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.ports import free_port

START_TIMEOUT_S = 60.0
PG_USER = "postgres"  # initdb refuses root; the cluster runs as Debian's postgres account


class StateServerError(RuntimeError):
    pass


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StateServerError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise StateServerError(f"{what} did not listen on 127.0.0.1:{port} within {START_TIMEOUT_S} s")


class RedisServer:
    def __init__(self, root: Path):
        binary = shutil.which("redis-server")
        if binary is None:
            raise StateServerError("redis-server not found on PATH; `make test` installs it (apt-get install "
                                   "redis-server)")
        self.port = free_port()
        self.dir = root / "redis"
        self.dir.mkdir()
        self.log = self.dir / "redis.log"
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "",
             "--appendonly", "no", "--protected-mode", "yes"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        _wait_for_port(self.port, self.proc, "redis-server", self.log)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or ([shutil.which(name)] if shutil.which(name)
                                                                      else [])
    if not found:
        raise StateServerError(f"PostgreSQL's {name} not found (looked in /usr/lib/postgresql/*/bin and PATH); "
                               "`make test` installs it (apt-get install postgresql)")
    return found[-1]


class PostgresServer:
    """One cluster, trust authentication on loopback only; `new_database` gives each test its own database."""

    def __init__(self, root: Path, durable: bool = False):
        """`durable` False (tests): no fsync. True (benchmarks): PostgreSQL's defaults, a commit is on disk."""
        initdb, postgres = _pg_bin("initdb"), _pg_bin("postgres")
        self.port = free_port()
        # Under /tmp, not pytest's tmp dir: the postgres account must reach it, and the socket path must be short.
        self.dir = Path(tempfile.mkdtemp(prefix="loraplex-pg-"))
        self._as_root = os.geteuid() == 0
        if self._as_root:
            account = pwd.getpwnam(PG_USER)
            os.chown(self.dir, account.pw_uid, account.pw_gid)
        data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self._run([initdb, "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                   *([] if durable else ["--no-sync"])])
        self.proc = subprocess.Popen(
            self._wrap([postgres, "-D", str(data), "-p", str(self.port), "-h", "127.0.0.1", "-k", str(self.dir),
                        "-c", "max_connections=100",
                        *([] if durable else ["-c", "fsync=off", "-c", "full_page_writes=off"])]),
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        _wait_for_port(self.port, self.proc, "postgres", self.log)
        self._wait_until_accepting()
        self._databases = 0

    def _wait_until_accepting(self) -> None:
        """It listens before it accepts connections ("the database system is starting up")."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=5).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    def _wrap(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", PG_USER, "--", *argv] if self._as_root else argv

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(self._wrap(argv), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise StateServerError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its DSN."""
        self._databases += 1
        name = f"t{os.getpid()}_{self._databases}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def stop(self) -> None:
        subprocess.run(self._wrap([_pg_bin("pg_ctl"), "stop", "-D", str(self.dir / "data"), "-m", "fast"]),
                       capture_output=True, check=False)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
