"""Every kustomization under docker/k8s rendered with `kubectl kustomize` and validated offline: built-in kinds
against the Kubernetes JSON schemas (kubernetes-validate, strict), custom resources (ServiceMonitor,
VirtualService), which those schemas do not cover, by the structural checks below; then the settings that must
agree with each other (selectors, probes, grace period and drain, HPA metric and adapter rules, tenants file)."""

from __future__ import annotations

import base64
import copy
import functools
import re
import subprocess

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from api.observability.outcome import RequestOutcome
from api.observability.request_metrics import AdmissionCounts, Metrics
from api.observability.slo import DEFAULT_SLO
from api.tenancy.config import load_tenancy_config
from tests.docker.paths import DRAIN_TIMEOUT_S, K8S, SHUTDOWN_MARGIN_S, UVICORN_CUT_S, tool

OVERLAYS = ("canary", "cpu", "gpu")
KUSTOMIZATIONS = tuple(f"overlays/{o}" for o in OVERLAYS) + ("prometheus-adapter",)
# The oldest Kubernetes the manifests claim to support, and the newest the schemas know.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
CUSTOM_RESOURCES = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("networking.istio.io/v1", "VirtualService")}
# Startup window (periodSeconds x failureThreshold) an overlay's engine gets before the kubelet restarts it.
STARTUP_WINDOW_S = {"cpu": (120, 600), "canary": (120, 600), "gpu": (600, 3600)}


@functools.cache
def render(kustomization: str) -> tuple[dict, ...]:
    result = subprocess.run([tool("kubectl"), "kustomize", str(K8S / kustomization)], check=False,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def of_kind(docs, kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind: str) -> dict:
    [doc] = of_kind(docs, kind)
    return doc


def is_custom(doc: dict) -> bool:
    return (doc["apiVersion"], doc["kind"]) in CUSTOM_RESOURCES


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_every_overlay_is_checked():
    assert sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir()) == list(OVERLAYS)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_built_in_kinds_match_the_kubernetes_schemas(kustomization, version):
    built_in = [d for d in render(kustomization) if not is_custom(d)]
    assert built_in
    for doc in built_in:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schemas_catch_a_broken_deployment():
    deployment = copy.deepcopy(one(render("overlays/cpu"), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError, match="periodSecond"):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_kind_is_validated_one_way_or_the_other(kustomization):
    """A custom resource the schemas do not know must be one of those with structural checks here."""
    for doc in render(kustomization):
        if is_custom(doc):
            continue
        kubernetes_validate.validate(doc, VERSIONS[-1])  # raises SchemaNotFoundError for an unknown kind


def pod_spec(docs) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def container(docs) -> dict:
    [main] = pod_spec(docs)["containers"]
    return main


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_pick_the_deployments_pods(overlay):
    docs = render(f"overlays/{overlay}")
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(one(docs, "Service")["spec"]["selector"], pod_labels)
    assert selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod_labels)
    target = one(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])


def test_releases_do_not_select_each_others_pods():
    stable, canary = render("overlays/cpu"), render("overlays/canary")
    assert not selects(one(stable, "Service")["spec"]["selector"],
                       one(canary, "Deployment")["spec"]["template"]["metadata"]["labels"])
    assert not selects(one(canary, "Service")["spec"]["selector"],
                       one(stable, "Deployment")["spec"]["template"]["metadata"]["labels"])


def probe_path(probe: dict) -> str:
    assert probe["httpGet"]["port"] == "http"
    return probe["httpGet"]["path"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes(overlay):
    main = container(render(f"overlays/{overlay}"))
    assert probe_path(main["readinessProbe"]) == "/ready"
    assert probe_path(main["livenessProbe"]) == "/health"
    assert probe_path(main["startupProbe"]) == "/health"
    startup = main["startupProbe"]
    low, high = STARTUP_WINDOW_S[overlay]
    assert low <= startup["periodSeconds"] * startup["failureThreshold"] <= high
    assert [p["containerPort"] for p in main["ports"] if p["name"] == "http"] == [8000]


def flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name:
            return args[i + 1]
    return None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_covers_prestop_and_drain(overlay):
    docs = render(f"overlays/{overlay}")
    main = container(docs)
    assert main["args"][0] == "serve"
    drain = float(flag(main["args"], "--drain-timeout-s") or DRAIN_TIMEOUT_S)
    [sleep, seconds] = main["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep == "sleep"
    needed = float(seconds) + drain + UVICORN_CUT_S + SHUTDOWN_MARGIN_S
    assert pod_spec(docs)["terminationGracePeriodSeconds"] >= needed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hardened_pod(overlay):
    docs = render(f"overlays/{overlay}")
    pod, main = pod_spec(docs), container(docs)
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    assert main["securityContext"]["readOnlyRootFilesystem"]
    assert not main["securityContext"]["allowPrivilegeEscalation"]
    mounts = {m["mountPath"] for m in main["volumeMounts"]}
    assert {"/data", "/tmp", "/dev/shm", "/etc/loraplex"} <= mounts
    assert main["resources"]["limits"]["memory"]


def test_gpu_overlay_asks_for_a_gpu():
    assert container(render("overlays/gpu"))["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container(render("overlays/gpu"))["image"] == "loraplex:gpu"
    assert container(render("overlays/cpu"))["image"] == "loraplex:cpu"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tenants_secret_is_a_valid_tenants_file(overlay, tmp_path):
    docs = render(f"overlays/{overlay}")
    main = container(docs)
    config_path = flag(main["args"], "--config")
    [mount] = [m for m in main["volumeMounts"] if config_path.startswith(m["mountPath"] + "/")]
    [volume] = [v for v in pod_spec(docs)["volumes"] if v["name"] == mount["name"]]
    [secret] = [s for s in of_kind(docs, "Secret") if s["metadata"]["name"] == volume["secret"]["secretName"]]
    key = config_path[len(mount["mountPath"]) + 1:]
    path = tmp_path / "tenants.yaml"
    path.write_bytes(base64.b64decode(secret["data"][key]))
    config = load_tenancy_config(str(path))
    assert config.admin_key_hashes and all(t.key_hashes for t in config.tenants)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor(overlay):
    docs = render(f"overlays/{overlay}")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["name"]
    services = [s for s in of_kind(docs, "Service")
                if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in services] == [one(docs, "Service")["metadata"]["name"]]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and re.fullmatch(r"\d+s", endpoint["interval"])
    auth = endpoint["authorization"]
    assert auth["type"] == "Bearer"
    secrets = {s["metadata"]["name"]: s for s in of_kind(docs, "Secret")}
    assert auth["credentials"]["key"] in secrets[auth["credentials"]["name"]]["data"]


def test_virtual_service_splits_between_the_two_releases():
    canary = render("overlays/canary")
    service = one(canary, "VirtualService")
    services = {one(render("overlays/cpu"), "Service")["metadata"]["name"]: one(render("overlays/cpu"), "Service"),
                one(canary, "Service")["metadata"]["name"]: one(canary, "Service")}
    assert service["spec"]["hosts"] == ["loraplex"] and "loraplex" in services
    routes = {r["name"]: r for r in service["spec"]["http"]}
    split = routes["split"]["route"]
    assert sum(d["weight"] for d in split) == 100
    assert {d["destination"]["host"] for d in split} == set(services) == {"loraplex", "loraplex-canary"}
    for route in service["spec"]["http"]:
        for destination in route["route"]:
            ports = {p["port"] for p in services[destination["destination"]["host"]]["spec"]["ports"]}
            assert destination["destination"]["port"]["number"] in ports
    [pinned] = routes["pinned-to-canary"]["route"]
    assert pinned["destination"]["host"] == "loraplex-canary"


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Metric families a server exports once it has served a request and queued one."""
    metrics = Metrics(CollectorRegistry(), 10, lambda tenant: DEFAULT_SLO)
    metrics.observe(RequestOutcome("r", "acme", "normal", "poet", "1", 200, 10, 5, 0.01, 0.2, 0.6, (0.1,), 0.0,
                                   0.0, 0.0))
    metrics.set_admission_source(lambda: {"acme": AdmissionCounts(1, 1)})
    return {sample.name for family in text_string_to_metric_families(metrics.render().decode())
            for sample in family.samples}


def adapter_rules() -> list[dict]:
    config_map = one(render("prometheus-adapter"), "ConfigMap")
    return yaml.safe_load(config_map["data"]["config.yaml"])["rules"]


def test_adapter_rules_read_exported_series(exported):
    for rule in adapter_rules():
        series = re.match(r"[a-z_:]+", rule["seriesQuery"]).group(0)
        assert series in exported, series
        assert re.fullmatch(rule["name"]["matches"].strip("^$"), series)
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
        assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_metrics_are_served_by_the_adapter_rules(overlay):
    served = {rule["name"]["as"] for rule in adapter_rules()}
    hpa = one(render(f"overlays/{overlay}"), "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"]
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] in served
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
