"""Headless Chromium: a screenshot and the rendered DOM of a page, for dashboard tests and docs."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
WINDOW_SIZE = "1600,1000"
# Without the background-networking flags Chromium keeps dialing out, which a closed network refuses loudly.
QUIET_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars")


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def render_page(url: str, png_path: Path, wait_ms: int = 4000, timeout_s: float = 60.0) -> str:
    """Loads `url`, lets `wait_ms` of virtual time pass (timers and fetches run), writes a PNG screenshot to
    `png_path` and returns the serialized DOM at that moment."""
    binary = find_chromium()
    if binary is None:
        raise BrowserError(f"no Chromium found on PATH (looked for {', '.join(CHROMIUM_NAMES)}); "
                           "on Debian: apt-get install chromium")
    png_path = Path(png_path).resolve()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    png_path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="loraplex-chromium-") as profile:
        cmd = [binary, *QUIET_FLAGS, f"--user-data-dir={profile}", f"--window-size={WINDOW_SIZE}",
               f"--virtual-time-budget={wait_ms}", f"--screenshot={png_path}", "--dump-dom", url]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as e:
            raise BrowserError(f"chromium did not finish within {timeout_s:.0f} s for {url}") from e
    if done.returncode != 0:
        raise BrowserError(f"chromium exited with {done.returncode} for {url}: {_tail(done.stderr)}")
    if not png_path.is_file() or png_path.stat().st_size == 0:
        raise BrowserError(f"chromium wrote no screenshot for {url}: {_tail(done.stderr)}")
    if "<html" not in done.stdout.lower():
        raise BrowserError(f"chromium dumped no DOM for {url}: {_tail(done.stderr)}")
    return done.stdout


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"
