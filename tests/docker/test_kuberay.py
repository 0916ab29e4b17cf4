"""docker/kuberay/rayservice.yaml validated offline: its pod templates against the Kubernetes JSON schemas, its
Serve application built by loraplex's own builder from its args, and its loraplex container's flags parsed by
loraplex's own parser and checked against the application they attach to."""

from __future__ import annotations

import importlib

import kubernetes_validate
import pytest
import yaml

from api.cli.flags import config_from_args
from api.cli.main import build_parser
from engine.cluster.config import ClusterConfig
from engine.config import EngineConfig
from tests.docker.paths import DOCKER

MANIFEST = DOCKER / "kuberay" / "rayservice.yaml"


@pytest.fixture(scope="module")
def service() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


@pytest.fixture(scope="module")
def serve_config(service) -> dict:
    return yaml.safe_load(service["spec"]["serveConfigV2"])


@pytest.fixture(scope="module")
def application(serve_config) -> dict:
    (app,) = serve_config["applications"]
    return app


def _pod_templates(service) -> dict[str, dict]:
    cluster = service["spec"]["rayClusterConfig"]
    return {"head": cluster["headGroupSpec"]["template"],
            **{g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}}


def _container(service, name: str) -> dict:
    head = _pod_templates(service)["head"]["spec"]["containers"]
    return next(c for c in head if c["name"] == name)


def test_it_is_a_rayservice_on_the_installed_ray(service):
    import ray

    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    assert service["spec"]["rayClusterConfig"]["rayVersion"] == ray.__version__


def test_pod_templates_are_valid_pod_specs(service):
    version = kubernetes_validate.utils.latest_version()
    for group, template in _pod_templates(service).items():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": group}, "spec": template["spec"]}
        kubernetes_validate.validate(pod, version, strict=True)
        mounted = {m["name"] for c in template["spec"]["containers"] for m in c.get("volumeMounts", [])}
        assert mounted <= {v["name"] for v in template["spec"]["volumes"]}, group


def test_the_application_builds_from_its_args(application):
    from engine.cluster.deploy import APP_NAME, DEPLOYMENT_NAME

    module, _, attr = application["import_path"].partition(":")
    built = getattr(importlib.import_module(module), attr)(application["args"])
    assert application["name"] == APP_NAME
    assert built._bound_deployment.name == DEPLOYMENT_NAME
    config = built._bound_deployment._deployment_config
    assert config.autoscaling_config.max_replicas == application["args"]["cluster"]["max_replicas"]
    assert "AdapterAffinityRouter" in config.request_router_config.request_router_class


def test_the_server_container_attaches_to_that_application(service, application):
    container = _container(service, "loraplex")
    args = build_parser().parse_args(container["args"])
    cluster = config_from_args(ClusterConfig, args)
    assert cluster.attach and cluster.ray_address == "127.0.0.1:6379"
    assert cluster.max_replicas == application["args"]["cluster"]["max_replicas"]
    engine = config_from_args(EngineConfig, args, model=args.model)
    # What the server checks requests against must be what the replicas run.
    for field, value in application["args"]["engine"].items():
        if field in ("model", "max_model_len", "max_num_seqs", "max_loras", "max_cpu_loras"):
            assert getattr(engine, field) == value, field
    assert args.store_uri == application["args"]["registry"]["store_uri"]
    assert container["ports"][0]["containerPort"] == 8000


def test_every_image_is_loraplex(service):
    images = {c["image"] for t in _pod_templates(service).values() for c in t["spec"]["containers"]}
    assert images == {"loraplex:cpu"}
