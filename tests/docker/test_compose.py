"""docker/compose.yaml against the Compose Specification's JSON schema (the copy check-jsonschema ships,
Apache-2.0), and the settings that must agree with the files next to it: mounts, Prometheus targets and key,
Grafana provisioning, the OTLP endpoint, the replicas profile, and the grace period."""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from engine.tracing import traces_url
from tests.docker.paths import DOCKER, DRAIN_TIMEOUT_S, REPO, SHUTDOWN_MARGIN_S, UVICORN_CUT_S

COMPOSE = DOCKER / "compose.yaml"
LORAPLEX_SERVICES = ("loraplex", "loraplex-s3")
REPLICAS = {"redis", "postgres", "minio", "minio-init", "loraplex-s3"}


def compose_schema() -> dict:
    schema = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    return json.loads(schema.read_text())


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # resolves the `<<: *loraplex` merge keys


def test_matches_the_compose_spec(compose):
    jsonschema.Draft202012Validator(compose_schema()).validate(compose)


@pytest.mark.parametrize(("path", "value"), [
    (("services", "loraplex", "ports"), 8000),
    (("services", "loraplex", "stop_grace_period"), ["45s"]),
    (("services", "loraplex", "restart_policy"), "always"),
])
def test_the_schema_catches_a_broken_file(compose, path, value):
    broken = copy.deepcopy(compose)
    *parents, leaf = path
    node = broken
    for key in parents:
        node = node[key]
    node[leaf] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(compose_schema()).validate(broken)


def default_of(value: str) -> str:
    """`${VAR:-default}` -> default; anything else as it is."""
    match = re.fullmatch(r"\$\{\w+:-([^}]*)\}", value)
    return match.group(1) if match else value


def test_every_file_it_mounts_or_builds_from_exists(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name}: {source}"
            else:
                assert source in compose["volumes"], f"{name}: volume {source} is not declared"
        if "build" in service:
            context = (DOCKER / service["build"]["context"]).resolve()
            assert context == REPO and (context / service["build"]["dockerfile"]).is_file()
    for secret in compose["secrets"].values():
        assert (DOCKER / default_of(secret["file"])).is_file()


def test_loraplex_services_share_the_image_and_drain_in_time(compose):
    for name in LORAPLEX_SERVICES:
        service = compose["services"][name]
        assert service["image"] == "loraplex:cpu" and service["command"][0] == "serve"
        assert re.fullmatch(r"\d+s", service["stop_grace_period"])
        assert int(service["stop_grace_period"][:-1]) >= DRAIN_TIMEOUT_S + UVICORN_CUT_S + SHUTDOWN_MARGIN_S - 5
        assert service["shm_size"]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_traces_go_to_the_collectors_otlp_http_receiver(compose):
    collector = yaml.safe_load((DOCKER / "otel-collector.yaml").read_text())
    port = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].rsplit(":", 1)[1]
    assert "otlp" in collector["service"]["pipelines"]["traces"]["receivers"]
    for name in LORAPLEX_SERVICES:
        endpoint = flag(compose["services"][name]["command"], "--otlp-endpoint")
        assert traces_url(endpoint) == f"http://otel-collector:{port}/v1/traces"


def test_prometheus_scrapes_every_server_with_the_metrics_key(compose):
    prometheus = compose["services"]["prometheus"]
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    targets = set()
    for job in config["scrape_configs"]:
        assert job["metrics_path"] == "/metrics"
        assert job["authorization"]["type"] == "Bearer"
        secret = Path(job["authorization"]["credentials_file"])
        assert secret.parent == Path("/run/secrets") and secret.name in prometheus["secrets"]
        targets |= {t for c in job["static_configs"] for t in c["targets"]}
    assert targets == {f"{name}:8000" for name in LORAPLEX_SERVICES}
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard(compose):
    grafana = compose["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    provisioning = DOCKER / "grafana" / "provisioning"
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"]
    port = compose["services"]["prometheus"]["ports"][0].rsplit(":", 1)[1]
    assert source["url"] == f"http://prometheus:{port}"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "loraplex.yaml").read_text())["providers"]
    dashboard = Path(mounts["./grafana/loraplex-dashboard.json"])
    assert dashboard.parent == Path(provider["options"]["path"])
    assert grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == str(dashboard)


def test_replicas_profile(compose):
    profiled = {name for name, s in compose["services"].items() if "replicas" in s.get("profiles", [])}
    assert profiled == REPLICAS
    server = compose["services"]["loraplex-s3"]
    bucket = re.fullmatch(r"s3://([^/]+)/.+", flag(server["command"], "--store-uri")).group(1)
    assert server["environment"]["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert f"mc mb --ignore-existing local/{bucket}" in compose["services"]["minio-init"]["command"][0]
    assert server["depends_on"]["minio-init"]["condition"] == "service_completed_successfully"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert server["environment"][key] in compose["services"]["minio"]["environment"].values()
    assert flag(server["command"], "--limits-url") == "redis://redis:6379/0"
    postgres = compose["services"]["postgres"]["environment"]
    for option in ("--ledger-url", "--index-url"):
        url = urlsplit(flag(server["command"], option))
        assert (url.scheme, url.hostname, url.path) == ("postgresql", "postgres", f"/{postgres['POSTGRES_DB']}")
        assert (url.username, url.password) == (postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"])
    for store in ("redis", "postgres"):
        assert server["depends_on"][store]["condition"] == "service_healthy"


def test_published_ports_are_loopback_only(compose):
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name}: {port}"
