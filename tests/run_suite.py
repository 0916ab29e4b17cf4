"""`make test`: the whole suite as two pytest sessions side by side, the end-to-end tests and the rest.

The end-to-end tests (tests/e2e) spend most of their time waiting on their servers' engines; the rest (about 2,600
tests, 3 to 4 minutes on one core) needs no server. Side by side they share the machine's cores instead of taking
turns. `python -m pytest` still runs everything in one session.

The end-to-end session prints as it goes; the other's report is written to artifacts/pytest-rest.log and printed
when both are done. The exit status is the first non-zero of the two. Arguments are passed to both sessions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.ports import SHARD_ENV

REPO = Path(__file__).resolve().parents[1]
REST_LOG = REPO / "artifacts" / "pytest-rest.log"


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", *args]
    REST_LOG.parent.mkdir(exist_ok=True)
    with REST_LOG.open("w") as log:
        rest = subprocess.Popen([*pytest, "--ignore=tests/e2e"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, SHARD_ENV: "1/2"})
        try:
            e2e_status = subprocess.call([*pytest, "tests/e2e"], cwd=REPO, env={**os.environ, SHARD_ENV: "0/2"})
            rest_status = rest.wait()
        finally:
            if rest.poll() is None:  # interrupted: the terminal's Ctrl-C reached it too
                rest.terminate()
                rest.wait()
    print(f"\n{'=' * 30} the tests outside tests/e2e ({REST_LOG.relative_to(REPO)}) {'=' * 30}", flush=True)
    print(REST_LOG.read_text(), end="", flush=True)
    return e2e_status or rest_status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
