"""`make test`: the whole suite as two pytest sessions side by side, one for each family of engine servers.

- The tiny model's: tests/e2e but test_smollm2.py, against the session's `loraplex serve --demo tiny` and the small
  servers its modules start (the kill -9 resume server, the two-node Ray cluster's replicas). Much of its time is
  spent waiting on engines that start, stop or are held.
- The rest: the tests outside tests/e2e (about 2,600, 3 to 4 minutes on one core, no server), then test_smollm2.py,
  whose server builds its assets and boots beside them.

Side by side they share the machine's cores instead of taking turns. `python -m pytest` still runs everything in
one session. The first session prints as it goes; the second's report is written to artifacts/pytest-rest.log and
printed when both are done. The exit status is the first non-zero of the two. Arguments are passed to both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.ports import SHARD_ENV

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
REST_LOG = REPO / "artifacts" / "pytest-rest.log"
SMOLLM2 = "tests/e2e/test_smollm2.py"


def tiny_paths() -> list[str]:
    return ["tests/e2e", f"--ignore={SMOLLM2}"]


def rest_paths() -> list[str]:
    """In order: every folder and test module of tests/ but e2e, then SmolLM2's module."""
    outside = sorted(path.name for path in TESTS.iterdir()
                     if (path.is_dir() and path.name not in ("e2e", "__pycache__"))
                     or (path.name.startswith("test_") and path.suffix == ".py"))
    return [*(f"tests/{name}" for name in outside), SMOLLM2]


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", *args]
    REST_LOG.parent.mkdir(exist_ok=True)
    with REST_LOG.open("w") as log:
        rest = subprocess.Popen([*pytest, *rest_paths()], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, SHARD_ENV: "1/2"})
        try:
            tiny_status = subprocess.call([*pytest, *tiny_paths()], cwd=REPO, env={**os.environ, SHARD_ENV: "0/2"})
            rest_status = rest.wait()
        finally:
            if rest.poll() is None:  # interrupted: the terminal's Ctrl-C reached it too
                rest.terminate()
                rest.wait()
    print(f"\n{'=' * 30} the other session ({REST_LOG.relative_to(REPO)}) {'=' * 30}", flush=True)
    print(REST_LOG.read_text(), end="", flush=True)
    return tiny_status or rest_status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
