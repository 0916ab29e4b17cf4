"""`LoraplexConfig`: one default per setting, and problems across sections refused at build."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.config import FLAG_SECTIONS, LoraplexConfig
from api.tenancy.config import TenancyConfig
from engine.cluster.config import ClusterConfig
from engine.config import EngineConfig


def tenancy_with(max_running: int | None) -> TenancyConfig:
    return TenancyConfig.model_validate({"tenants": [{"name": "t"}], "admission": {"max_running": max_running}})


@pytest.mark.parametrize(("max_num_seqs", "cluster", "file_max_running", "size"), [
    (64, ClusterConfig(), None, 64),  # the engine's batch size
    (16, ClusterConfig(), None, 16),
    (16, ClusterConfig(replicas=3), None, 48),  # times the replicas
    (16, ClusterConfig(replicas=2, autoscale=True, max_replicas=5), None, 80),  # times the most there may be
    (16, ClusterConfig(replicas=0, autoscale=True, min_replicas=0, max_replicas=1), None, 16),  # scales from zero
    (64, ClusterConfig(replicas=3), 8, 8),  # the tenants file wins when it sets a size
])
def test_admission_size_has_one_default(max_num_seqs, cluster, file_max_running, size):
    config = LoraplexConfig(engine=EngineConfig(model="m", max_loras=4, max_cpu_loras=8,
                                                          max_num_seqs=max_num_seqs), cluster=cluster,
                            tenancy=tenancy_with(file_max_running))
    assert config.admission_size == size


def _names(n: int) -> tuple[str, ...]:
    return tuple(f"a{i}" for i in range(n))


@pytest.mark.parametrize(("pins", "targets", "ok"), [
    ((), {}, True),
    (_names(7), {}, True),
    (_names(8), {}, False),
    (_names(4), {name: 2 for name in _names(3)}, True),  # a pin that is also a target is held once
    (_names(4), {name: 2 for name in ("x", "y", "z", "w")}, False),
])
def test_held_adapters_must_leave_room_in_the_cpu_tier(pins, targets, ok):
    def make() -> LoraplexConfig:
        return LoraplexConfig(engine=EngineConfig(model="m", max_loras=1, max_cpu_loras=8), pins=pins,
                              cluster=ClusterConfig(replicas=2, adapter_replicas=targets))
    if ok:
        assert make().pins == pins
    else:
        with pytest.raises(ValidationError, match="leave no room in max_cpu_loras 8"):
            make()


def test_every_flag_names_one_setting():
    names = [name for cls in FLAG_SECTIONS.values() for name in cls.model_fields]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    assert set(FLAG_SECTIONS) <= set(LoraplexConfig.model_fields)
