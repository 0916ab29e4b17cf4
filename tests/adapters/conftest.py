"""Fixtures for the registry tests: the demo base model's spec, adapter copies to mutate, a real S3 API on loopback."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}


@pytest.fixture(scope="session")
def base_spec(demo_assets):
    from adapters.base_model import base_model_spec

    return base_model_spec(demo_assets.model_dir)


@pytest.fixture
def copy_adapter(demo_assets, tmp_path) -> Callable[..., Path]:
    """A fresh copy of a demo adapter folder, free to mutate."""

    def copy(source: str = "sql-helper") -> Path:
        target = tmp_path / f"{source}-{uuid.uuid4().hex[:8]}"
        shutil.copytree(demo_assets.adapter_dirs[source], target)
        return target

    return copy


@pytest.fixture(scope="session")
def edit_config() -> Callable[..., None]:
    """Update (or with value None, remove) keys of a folder's adapter_config.json."""

    def edit(folder: Path, **updates) -> None:
        path = folder / "adapter_config.json"
        config = json.loads(path.read_text())
        for key, value in updates.items():
            if value is None:
                config.pop(key, None)
            else:
                config[key] = value
        path.write_text(json.dumps(config))

    return edit


@pytest.fixture(scope="session")
def rewrite_tensors() -> Callable[[Path, Callable[[dict], dict]], None]:
    """Replace a folder's weights with `mutate(tensors)`, saved as safetensors."""

    def rewrite(folder: Path, mutate: Callable[[dict], dict]) -> None:
        from safetensors.torch import load_file, save_file

        path = folder / "adapter_model.safetensors"
        save_file(mutate(load_file(path)), path)

    return rewrite


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    """A moto S3 server on a free loopback port for the whole session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch) -> str:
    """A new empty bucket; boto3 in the test reaches the loopback server through AWS_ENDPOINT_URL."""
    import boto3

    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    bucket = f"loraplex-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    return bucket
