"""Session fixtures: demo assets, one real `loraplex serve` (real vLLM engine), HF + PEFT references.

The server is started once per session because an engine costs 20-40 s and 2-3 GB; every end-to-end
test talks to it over loopback with the real `openai` client or httpx.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts"
SERVER_START_TIMEOUT_S = 300


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory) -> Path:
    from engine.demo_assets import ensure_demo_assets

    home = tmp_path_factory.mktemp("loraplex-home")
    ensure_demo_assets(home)
    return home


@pytest.fixture(scope="session")
def demo_assets(demo_home):
    from engine.demo_assets import ensure_demo_assets

    return ensure_demo_assets(demo_home)


EXTRA_ADAPTER = "extra-mlp"


@pytest.fixture(scope="session")
def adapter_dirs(demo_assets, demo_home) -> dict[str, Path]:
    """The demo adapters plus one served through `--adapter`: four adapters for three engine slots, so
    slots get rewritten while the session runs."""
    from adapters.demo import MLP, DemoAdapterSpec, build_adapter

    extra = build_adapter(demo_assets.model_dir, DemoAdapterSpec(EXTRA_ADAPTER, rank=16, alpha=16,
                                                                 target_modules=MLP, seed=99),
                          demo_home / "extra-adapters" / EXTRA_ADAPTER)
    return {**demo_assets.adapter_dirs, EXTRA_ADAPTER: extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.fixture(scope="session")
def server(demo_home, adapter_dirs) -> str:
    """Base URL of a real `loraplex serve` on the embedded default. Teardown checks no process is left."""
    ARTIFACTS.mkdir(exist_ok=True)
    port = _free_port()
    log = (ARTIFACTS / "server.log").open("w")
    env = {**os.environ, "LORAPLEX_HOME": str(demo_home), "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--max-num-seqs", "32",
         # As many slots as demo adapters: the last slot is occupied, which is what vllm#48421 leaks.
         "--max-loras", "3", "--max-cpu-loras", "4", "--adapter", f"{EXTRA_ADAPTER}={adapter_dirs[EXTRA_ADAPTER]}"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}; see {ARTIFACTS / 'server.log'}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("server did not become healthy in time")
        time.sleep(1)
    children = _descendants(proc.pid)
    yield base
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("server did not exit within 60 s of SIGTERM")
    time.sleep(1)
    left = [pid for pid in children | {proc.pid} if _alive(pid)]
    log.close()
    assert not left, f"processes left behind after shutdown: {left}"


@pytest.fixture(scope="session")
def base_model_id() -> str:
    from engine.tiny_llama import TinyLlamaSpec

    return TinyLlamaSpec().model_id


@pytest.fixture(scope="session")
def adapter_names() -> list[str]:
    from adapters.demo import DEMO_ADAPTERS

    return [spec.name for spec in DEMO_ADAPTERS]


@pytest.fixture(scope="session")
def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_openai_client(server):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


class HFReference:
    """Greedy decoding with transformers + peft in float32, without KV cache, as the ground truth."""

    def __init__(self, model_dir: Path, adapter_dirs: dict[str, Path]):
        self.model_dir = model_dir
        self.adapter_dirs = adapter_dirs
        self._models: dict[str | None, object] = {}
        self._cache: dict[tuple, list[int]] = {}

    def model(self, adapter: str | None):
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        if adapter not in self._models:
            base = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            model = base if adapter is None else PeftModel.from_pretrained(base, self.adapter_dirs[adapter])
            self._models[adapter] = model.eval()
        return self._models[adapter]

    def greedy(self, adapter: str | None, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        import torch

        key = (adapter, tuple(prompt_ids), max_new_tokens)
        if key not in self._cache:
            model = self.model(adapter)
            ids = torch.tensor([prompt_ids])
            out = []
            with torch.no_grad():
                for _ in range(max_new_tokens):
                    next_id = int(model(ids).logits[0, -1].argmax())
                    out.append(next_id)
                    ids = torch.cat([ids, torch.tensor([[next_id]])], dim=1)
            self._cache[key] = out
        return self._cache[key]


@pytest.fixture(scope="session")
def hf_reference(demo_assets, adapter_dirs) -> HFReference:
    return HFReference(demo_assets.model_dir, adapter_dirs)


@pytest.fixture(scope="session")
def tokenizer(demo_assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_assets.model_dir)
