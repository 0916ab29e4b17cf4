"""Session fixtures: demo assets, one real `loraplex serve` (real vLLM engine), HF + PEFT references.

The server is started once per session because an engine costs 20-40 s and 2-3 GB; every end-to-end
test talks to it over loopback with the real `openai` client or httpx.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts"
SERVER_START_TIMEOUT_S = 300


TINY = "tiny"


@pytest.fixture(scope="session", autouse=True)
def private_data_home(tmp_path_factory):
    """No test writes to the real data home (~/.local/share/loraplex): what a server built without explicit paths
    keeps there (batch store, files, default ledger, drift windows) goes to a folder of the session."""
    if os.environ.get("LORAPLEX_HOME"):
        yield
        return
    os.environ["LORAPLEX_HOME"] = str(tmp_path_factory.mktemp("data-home"))
    yield
    os.environ.pop("LORAPLEX_HOME", None)


@pytest.fixture(scope="session", autouse=True)
def shared_compile_cache(tmp_path_factory):
    """Every server of the session compiles its engine into one cache (vLLM's and inductor's), so only the first
    engine of a model pays the cold compile (~30 s for tiny); each server's own data home would start cold."""
    names = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")
    unset = [name for name in names if not os.environ.get(name)]
    root = tmp_path_factory.mktemp("compile-cache")
    for name in unset:
        os.environ[name] = str(root / name.lower())
    yield
    for name in unset:
        os.environ.pop(name, None)


# Servers whose claims do not depend on the compiled graph run their engine eagerly: SmolLM2's cold compile costs
# ~75 s on two cores. The session's tiny server keeps the default (compiled), and its exactness tests cover that path.
EAGER = {"LORAPLEX_LORA_COMPILE": "off"}
# Every engine the suite starts runs one OpenMP thread, bound to no core. vLLM's default on a 2-core machine binds an
# engine's thread to core 0 and keeps core 1 for its frontend: right for one server, but the suite runs up to four
# engines side by side (the session's, SmolLM2's, the cluster's replicas), which then all took turns on core 0.
# One thread, as the default gives here, so the numerics are those of a served engine.
UNBOUND_ENGINE = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
# Test servers pass `--dtype float32`: exactness against transformers + peft holds in float32, and the default
# (auto) is bfloat16 on a CPU that has it.


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory) -> Path:
    from adapters.demo.assets import DemoConfig, ensure_demo_assets

    home = tmp_path_factory.mktemp("loraplex-home")
    ensure_demo_assets(home, DemoConfig(demo=TINY))
    return home


@pytest.fixture(scope="session")
def demo_assets(demo_home):
    """The tiny demo (random Llama and random adapters): what most tests serve, for speed."""
    from adapters.demo.assets import DemoConfig, ensure_demo_assets

    return ensure_demo_assets(demo_home, DemoConfig(demo=TINY))


EXTRA_ADAPTER = "extra-mlp"


@pytest.fixture(scope="session")
def adapter_dirs(demo_assets, demo_home) -> dict[str, Path]:
    """The demo adapters plus one served through `--adapter`: four adapters for three engine slots, so
    slots get rewritten while the session runs."""
    from adapters.demo.loras import MLP, DemoAdapterSpec, build_adapter

    extra = build_adapter(demo_assets.model_dir, DemoAdapterSpec(EXTRA_ADAPTER, rank=16, alpha=16,
                                                                 target_modules=MLP, seed=99),
                          demo_home / "extra-adapters" / EXTRA_ADAPTER)
    return {**demo_assets.adapter_dirs, EXTRA_ADAPTER: extra}


def _descendants(pid: int) -> set[int]:
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        children = []
        # Every thread's list: a child started by a thread other than the main one (Ray runs a replica's code
        # on one) is listed under that thread only.
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children += (task / "children").read_text().split()
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


TENANTS = {
    # name: (adapters it may use, priority, limits)
    "acme": (["*"], "premium", {}),
    "globex": (["globex-*"], "standard", {}),
    "obs": (["*"], "standard", {}),
    "tiny": (["sql-helper"], "standard", {"requests_per_minute": 3, "max_tokens": 16}),
    "solo": (["*"], "standard", {"max_concurrent": 1}),
    "quad": (["*"], "standard", {"max_concurrent": 4}),
    "tokmin": (["*"], "standard", {"tokens_per_minute": 120}),
}
PRICES = {"prompt": 1.0, "completion": 2.0}
MIXING_TENANT = "acme"  # the one tenant allowed mixtures of adapters per request
# Virtual models of the session server (api/graphs); tests/e2e/test_virtual_models.py reloads more.
VIRTUAL_MODELS = {
    "triage": {"cascade": {"stages": ["sql-helper", "poet"], "escalate_when": {"output_matches": "(?i)sorry"}}},
    "vote": {"ensemble": {"members": ["sql-helper", "poet", "support-bot"]}},
    "sql-pair": {"ensemble": {"members": ["sql-helper", "sql-helper@1"], "aggregate": "max_mean_logprob"}},
}
# Drift windows small enough for a test to fill (api/observability/drift.py).
DRIFT_WINDOW = 20


@dataclass(frozen=True)
class Keys:
    admin: str
    metrics: str
    tenants: dict[str, str]

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tenants[tenant]}"}

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    @property
    def metrics_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.metrics}"}


def ledger_rows(server: str, keys: Keys, request_id: str) -> list[dict]:
    """The server's ledger rows of one request (its X-Request-Id, or the id the server gave it), read as admin."""
    usage = httpx.get(f"{server}/v1/usage?limit=10000", headers=keys.admin_headers, timeout=30).json()["data"]
    return [row for row in usage if row["request_id"] == request_id]


@pytest.fixture(scope="session")
def keys() -> Keys:
    from api.tenancy.keys import generate_key

    return Keys(admin=generate_key(), metrics=generate_key(), tenants={name: generate_key() for name in TENANTS})


@pytest.fixture(scope="session")
def tenants_file(demo_home, keys) -> Path:
    import yaml

    from api.tenancy.keys import hash_key

    config = {
        "machine_cost_per_hour": 3.6,
        "admin_key_hashes": [hash_key(keys.admin)],
        "metrics_key_hashes": [hash_key(keys.metrics)],
        "priority_classes": {"premium": {"weight": 4}, "standard": {"weight": 1}},
        "pricing": {"default": PRICES},
        "tenants": [
            {"name": name, "key_hashes": [hash_key(keys.tenants[name])], "adapters": adapters,
             "priority": priority, "limits": limits, "mixtures": name == MIXING_TENANT}
            for name, (adapters, priority, limits) in TENANTS.items()
        ],
        "virtual_models": VIRTUAL_MODELS,
    }
    path = demo_home / "tenants.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class ServerProcess:
    """One real `loraplex serve` (real vLLM engine) on loopback; restartable for lifecycle tests."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path):
        self.argv, self.env, self.log_path = argv, env, log_path
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.ready = False
        self.children: set[int] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Starts the process and returns at once; `wait_ready` (or `ensure_running`) waits for its engine."""
        log = self.log_path.open("a")
        self.proc = subprocess.Popen([*self.argv, "--port", str(self.port)], cwd=REPO,
                                     env={**self.env, **UNBOUND_ENGINE},
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.ready = False

    def wait_ready(self) -> None:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail("server did not become ready in time")
            time.sleep(1)
        self.children = _descendants(self.proc.pid)
        self.ready = True

    def ensure_running(self) -> None:
        """Starts the server unless it is up and ready; one still starting is waited for, one still shutting down
        is waited out first."""
        if self.proc is not None and self.proc.poll() is None:
            if not self.ready:
                self.wait_ready()
                return
            try:
                if httpx.get(f"{self.url}/ready", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.kill9()
        self.start()

    def kill9(self) -> None:
        """SIGKILL to the whole process group: server, engine core and workers die at once."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code. Fails if any process of the server is left."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.kill9()
            pytest.fail("server did not exit within 90 s of SIGTERM")
        time.sleep(1)
        left = [pid for pid in self.children | {self.proc.pid} if _alive(pid)]
        assert not left, f"processes left behind after shutdown: {left}"
        return code


@pytest.fixture(scope="session")
def server_process(demo_home, adapter_dirs, tenants_file):
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / "server.log"
    log_path.write_text("")
    env = {**os.environ, "LORAPLEX_HOME": str(demo_home), "VLLM_CPU_KVCACHE_SPACE": "1"}
    argv = [sys.executable, "-m", "api.cli", "serve", "--demo", TINY, "--dtype", "float32", "--max-num-seqs", "32",
            "--config", str(tenants_file),
            # Two slots for four demo adapters and up to 200 published ones: slots are rewritten all the
            # time, and the last slot is occupied, which is what vllm#48421 leaks into.
            "--max-loras", "2", "--max-cpu-loras", "8", "--drain-timeout-s", "60",
            # Tests read per-adapter series of adapters served late in the session (after test_registry_serving's
            # ~65 of 200): none may fall into `other`. Not more: /metrics renders on the event loop (~90 ms a MiB).
            "--metrics-top-n", "150",
            "--drift-reference-requests", str(DRIFT_WINDOW), "--drift-window-requests", str(DRIFT_WINDOW),
            "--adapter", f"{EXTRA_ADAPTER}={adapter_dirs[EXTRA_ADAPTER]}",
            "--grpc-port", str(free_port())]  # tests/e2e/test_grpc.py
    process = ServerProcess(argv, env, log_path)
    process.launch()
    yield process
    if process.proc.poll() is None:
        process.stop()


@pytest.fixture(scope="session", autouse=True)
def launch_session_server_early(request, private_data_home, shared_compile_cache):
    """When the session will need the server, its engine boots (~60 s on two cores) from the first test on, beside
    the unit tests that run before the end-to-end ones (under `make test`, beside the other session,
    `tests/run_suite.py`); the `server` fixture waits for it to be ready."""
    if any("server_process" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("server_process")


@pytest.fixture(scope="session")
def ray_cluster_launch(s3_endpoint):
    """The two-node Ray cluster of `tests/e2e/test_cluster.py` (`tests/ray_cluster.py`), launched in a thread: its
    nodes start beside the tests that run before that module, and the module waits for them. Its nodes reach the S3
    store with the environment they start with, as an operator's would."""
    from tests.ray_cluster import RayCluster

    root = Path(tempfile.mkdtemp(prefix="lpray-"))  # short: Ray's socket paths live under it
    env = {**os.environ, **FAKE_AWS_ENV, "AWS_ENDPOINT_URL": s3_endpoint, **UNBOUND_ENGINE}
    cluster = RayCluster(root, workers=1, env=env)
    cluster.launch()
    yield cluster
    cluster.kill()
    ARTIFACTS.mkdir(exist_ok=True)
    for log in root.glob("*.log"):
        shutil.copy(log, ARTIFACTS / f"ray-{log.name}")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def launch_ray_cluster_early(request, private_data_home, shared_compile_cache):
    if any("ray_cluster_launch" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("ray_cluster_launch")


@pytest.fixture(scope="session")
def grpc_address(server, server_process) -> str:
    """host:port of the session server's gRPC front (Open Inference Protocol v2)."""
    return f"127.0.0.1:{server_process.argv[server_process.argv.index('--grpc-port') + 1]}"


@pytest.fixture(scope="session")
def server(server_process) -> str:
    """Base URL of the session's real server (restarted if a lifecycle test stopped it)."""
    server_process.ensure_running()
    return server_process.url


@pytest.fixture(scope="session")
def metrics_text(server, keys):
    """The session server's /metrics page, read with the metrics key: `metrics_text()`, or only some samples:
    `metrics_text("loraplex_engine_unfinished_requests")` (fast whatever the number of series)."""
    return lambda *names: httpx.get(f"{server}/metrics", headers=keys.metrics_headers, timeout=30,
                                    params=[("name[]", name) for name in names]).text


@pytest.fixture(scope="session")
def acme(keys) -> dict[str, str]:
    """Headers of the tenant every general test uses (it may use every model)."""
    return keys.headers("acme")


@pytest.fixture(scope="session")
def registry(demo_home, demo_assets):
    """The same registry the session server reads (its index and store), for publishing during tests."""
    from adapters.base_model import base_model_spec
    from adapters.registry import Registry, RegistryConfig

    config = RegistryConfig(store_uri=str(demo_home / "registry" / "blobs"),
                            index_url=str(demo_home / "registry" / "index.sqlite"))
    reg = Registry.from_config(config, base_model_spec(demo_assets.model_dir), max_lora_rank=64)
    yield reg
    reg.close()


@pytest.fixture(scope="session")
def base_model_id() -> str:
    from adapters.demo.tiny_llama import TinyLlamaSpec

    return TinyLlamaSpec().model_id


@pytest.fixture(scope="session")
def adapter_names() -> list[str]:
    from adapters.demo.loras import DEMO_ADAPTERS

    return [spec.name for spec in DEMO_ADAPTERS]


@pytest.fixture(scope="session")
def openai_client(server, keys):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key=keys.tenants["acme"], max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def async_openai_client(server, keys):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{server}/v1", api_key=keys.tenants["acme"], max_retries=0, timeout=120)


class HFReference:
    """Greedy decoding with transformers + peft in float32, without KV cache, as the ground truth. One copy of the
    base model holds every adapter asked for (peft's named adapters), each run alone; the base model runs with them
    disabled. A LoRA layer then computes what it computes in a model of that one adapter: its base layer, plus the
    active adapter's product where it targets the layer."""

    def __init__(self, model_dir: Path, adapter_dirs: dict[str, Path]):
        self.model_dir = model_dir
        self.adapter_dirs = adapter_dirs
        self._model = None  # the base model; a PeftModel once an adapter is loaded
        self._names: dict[str | Path, str] = {}  # adapter -> its name in the PeftModel
        self._cache: dict[tuple, list[int]] = {}

    def _logits(self, adapter: str | Path | None, ids):
        """`adapter`: a demo adapter's name, any adapter folder, or None for the base model."""
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        if self._model is None:
            self._model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        if adapter is not None and adapter not in self._names:
            folder = adapter if isinstance(adapter, Path) else self.adapter_dirs[adapter]
            name = f"adapter{len(self._names)}"
            if isinstance(self._model, PeftModel):
                self._model.load_adapter(folder, adapter_name=name)
            else:
                self._model = PeftModel.from_pretrained(self._model, folder, adapter_name=name)
            self._model.eval()  # no LoRA dropout
            self._names[adapter] = name
        with torch.no_grad():
            if adapter is not None:
                self._model.set_adapter(self._names[adapter])
                return self._model(ids).logits
            if isinstance(self._model, PeftModel):
                with self._model.disable_adapter():
                    return self._model(ids).logits
            return self._model(ids).logits

    def greedy(self, adapter: str | Path | None, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        import torch

        key = (adapter, tuple(prompt_ids), max_new_tokens)
        if key not in self._cache:
            ids = torch.tensor([prompt_ids])
            out = []
            for _ in range(max_new_tokens):
                next_id = int(self._logits(adapter, ids)[0, -1].argmax())
                out.append(next_id)
                ids = torch.cat([ids, torch.tensor([[next_id]])], dim=1)
            self._cache[key] = out
        return self._cache[key]

    def prompt_logprobs(self, adapter: str | Path | None, prompt_ids: list[int]) -> list[float]:
        """Log-probability of each prompt token after the ones before it (the first has none: not listed)."""
        import torch

        logits = self._logits(adapter, torch.tensor([prompt_ids]))[0, :-1]
        logprobs = torch.log_softmax(logits, dim=-1)
        return [float(logprobs[i, token]) for i, token in enumerate(prompt_ids[1:])]


@pytest.fixture(scope="session")
def hf_reference(demo_assets, adapter_dirs) -> HFReference:
    return HFReference(demo_assets.model_dir, adapter_dirs)


@pytest.fixture(scope="session")
def tokenizer(demo_assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_assets.model_dir)


# ---------------------------------------------------------------- SmolLM2: the embedded default, a real model


@pytest.fixture(scope="session")
def smollm2_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("smollm2-home")


@pytest.fixture(scope="session")
def smollm2_process(smollm2_home):
    """A second real server, on SmolLM2 with its four adapters in four engine slots, open (no tenants). It builds
    its assets itself in its home (SmolLM2 converted from the packaged GGUF and its trained adapters: about 30 s
    on one core, 540 MB) before its engine starts. Launched, not awaited: see `launch_smollm2_server_early`."""
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / "server-smollm2.log"
    log_path.write_text("")
    env = {**os.environ, "LORAPLEX_HOME": str(smollm2_home), "LORAPLEX_DEMO_HOME": str(smollm2_home),
           "VLLM_CPU_KVCACHE_SPACE": "1", **EAGER}
    argv = [sys.executable, "-m", "api.cli", "serve", "--demo", "smollm2", "--dtype", "float32", "--max-num-seqs", "32",
            "--max-loras", "4", "--max-cpu-loras", "4", "--drain-timeout-s", "10"]
    process = ServerProcess(argv, env, log_path)
    process.launch()
    yield process
    if process.proc.poll() is None:
        process.stop()


@pytest.fixture(scope="session", autouse=True)
def launch_smollm2_server_early(request, private_data_home, shared_compile_cache):
    """When the session will need the SmolLM2 server, it builds its assets and boots from the first test on, on the
    core the unit tests leave free, instead of at its module (about 55 s there); it then idles until its module,
    whose `smollm2_server` waits for it to be ready."""
    if any("smollm2_process" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("smollm2_process")


@pytest.fixture(scope="module")
def smollm2_server(smollm2_process) -> str:
    """Stopped when the module that asked is done, so it never runs beside the later modules' heavy work. The
    session's tiny server is not stopped: a restart costs more than it idles."""
    smollm2_process.ensure_running()
    yield smollm2_process.url
    if smollm2_process.proc.poll() is None:
        smollm2_process.stop()


@pytest.fixture(scope="module")
def smollm2_assets(smollm2_server, smollm2_home):
    """What the server built (ready means built)."""
    from adapters.demo.assets import DemoConfig, ensure_demo_assets

    return ensure_demo_assets(smollm2_home, DemoConfig(demo="smollm2"))


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_assets) -> HFReference:
    return HFReference(smollm2_assets.model_dir, smollm2_assets.adapter_dirs)


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_assets.model_dir)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real redis-server on a free loopback port for the whole session."""
    from tests.state_servers import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("state"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory):
    """A real PostgreSQL cluster on a free loopback port for the whole session."""
    from tests.state_servers import PostgresServer

    server = PostgresServer(tmp_path_factory.mktemp("state"))
    yield server
    server.stop()


FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    """A moto S3 server on a free loopback port for the whole session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def new_s3_bucket(s3_endpoint: str) -> str:
    """A new empty bucket on the session's S3 server."""
    import boto3

    bucket = f"loraplex-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, **_boto3_credentials()).create_bucket(Bucket=bucket)
    return bucket


def _boto3_credentials() -> dict[str, str]:
    return {"aws_access_key_id": FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            "region_name": FAKE_AWS_ENV["AWS_DEFAULT_REGION"]}


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch) -> str:
    """A new empty bucket; boto3 in the test reaches the loopback server through AWS_ENDPOINT_URL."""
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    return new_s3_bucket(s3_endpoint)


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path) -> str:
    """Where a SQL-backed store lives, once per backend: a fresh SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "state" / "db.sqlite")
    return request.getfixturevalue("postgres_server").new_database()
