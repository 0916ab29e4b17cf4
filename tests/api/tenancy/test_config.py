from __future__ import annotations

import copy

import pytest

from api.observability.slo import DEFAULT_SLO, LatencyTarget
from api.tenancy.config import ConfigError, TenancyConfig, load_tenancy_config, parse_tenancy_config

H1, H2, H3 = ("sha256:" + c * 64 for c in "abc")

FULL_EXAMPLE = f"""
machine_cost_per_hour: 1.20
admin_key_hashes: ["{H3}"]
admission: {{max_running: 8, max_queued: 64}}
priority_classes:
  premium: {{weight: 4, slo: {{ttft: {{seconds: 0.25, percentile: 99}}, availability: 99.5}}}}
  standard: {{weight: 1}}
pricing:
  default: {{prompt: 0.50, completion: 1.50}}
  models: {{"loraplex/tiny-llama": {{prompt: 0.2, completion: 0.6}}, "sql-helper": {{prompt: 1.0, completion: 3.0}}}}
tenants:
  - name: acme
    key_hashes: ["{H1}"]
    adapters: ["sql-*", "support-bot"]
    priority: premium
    limits: {{requests_per_minute: 60, tokens_per_minute: 20000, max_concurrent: 4, tokens_per_day: 1000000,
              tokens_per_month: 20000000, max_tokens: 512}}
    pricing: {{models: {{"sql-helper": {{prompt: 0.8, completion: 2.4}}}}}}
    slo: {{e2e: {{seconds: 5}}}}
  - name: hobby
    key_hashes: ["{H2}"]
    base_model: false
    adapters: ["*"]
"""


def _valid() -> dict:
    return {
        "priority_classes": {"standard": {"weight": 1}, "premium": {"weight": 4}},
        "tenants": [
            {"name": "acme", "key_hashes": [H1], "priority": "premium"},
            {"name": "hobby", "key_hashes": [H2]},
        ],
    }


@pytest.fixture
def full(tmp_path) -> TenancyConfig:
    path = tmp_path / "tenants.yaml"
    path.write_text(FULL_EXAMPLE)
    return load_tenancy_config(path)


def test_full_example_loads(full):
    assert full.auth_required
    assert full.machine_cost_per_hour == 1.20
    assert full.admin_key_hashes == [H3]
    assert (full.admission.max_running, full.admission.max_queued) == (8, 64)
    acme = full.tenant("acme")
    assert acme.limits.max_tokens == 512 and acme.limits.tokens_per_month == 20_000_000
    assert full.tenant("hobby").limits.requests_per_minute is None
    assert full.weight_of("acme") == 4 and full.weight_of("hobby") == 1
    assert full.pricing.models["loraplex/tiny-llama"].completion == 0.6
    with pytest.raises(KeyError):
        full.tenant("nobody")


def test_slo_layers_tenant_over_class_over_server(full):
    acme = full.slo_for("acme")
    assert acme.e2e == LatencyTarget(seconds=5)  # tenant
    assert acme.ttft == LatencyTarget(seconds=0.25, percentile=99)  # class
    assert acme.availability == 99.5  # class
    assert acme.tpot == DEFAULT_SLO.tpot  # server default
    assert full.slo_for("hobby") == DEFAULT_SLO


@pytest.mark.parametrize(("tenant", "adapter", "allowed"), [
    ("acme", None, True),
    ("acme", "sql-helper", True),
    ("acme", "sql-", True),
    ("acme", "support-bot", True),
    ("acme", "support-bot-2", False),
    ("acme", "SQL-helper", False),
    ("acme", "my-sql-helper", False),
    ("hobby", None, False),
    ("hobby", "anything", True),
])
def test_may_use(full, tenant, adapter, allowed):
    assert full.may_use(tenant, adapter) is allowed


def test_open_default():
    config = TenancyConfig.open_default()
    assert not config.auth_required
    assert [t.name for t in config.tenants] == ["default"]
    tenant = config.tenant("default")
    assert tenant.key_hashes == [] and tenant.priority == "standard"
    assert tenant.limits.model_dump() == dict.fromkeys(tenant.limits.model_dump())
    assert config.may_use("default", None) and config.may_use("default", "any-adapter")
    assert config.slo_for("default") == DEFAULT_SLO
    assert config.admin_key_hashes == []


def test_adapters_default_to_none():
    config = parse_tenancy_config({"tenants": [{"name": "a"}]})
    assert config.may_use("a", None) and not config.may_use("a", "x")


def _set(path: str, value):
    def mutate(d: dict) -> None:
        *parents, last = path.split("/")
        node = d
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return mutate


BAD_CASES = [
    ("non-positive limit", _set("tenants/1/limits", {"requests_per_minute": 0}),
     "tenants[1].limits.requests_per_minute: Input should be greater than 0"),
    ("unknown limit", _set("tenants/0/limits", {"rpm": 5}), "tenants[0].limits.rpm: Extra inputs are not permitted"),
    ("unknown top-level key", _set("tenantz", []), "tenantz: Extra inputs are not permitted"),
    ("bad tenant name", _set("tenants/0/name", "Acme Corp"), "tenants[0].name: String should match pattern"),
    ("duplicate tenant", _set("tenants/1/name", "acme"),
     "tenants[1].name: duplicate tenant 'acme' (first at tenants[0])"),
    ("undefined class", _set("tenants/0/priority", "gold"),
     "tenants[0].priority: priority class 'gold' is not defined (defined: premium, standard)"),
    ("default class missing", _set("priority_classes", {"premium": {"weight": 2}}),
     "tenants[1].priority: priority class 'standard' is not defined (defined: premium)"),
    ("shared key hash", _set("tenants/1/key_hashes", [H1]),
     "tenants[1].key_hashes[0]: key hash already belongs to tenant 'acme'"),
    ("malformed key hash", _set("tenants/0/key_hashes", ["sha256:" + "A" * 64]),
     "tenants[0].key_hashes[0]: must be 'sha256:' followed by 64 lowercase hex digits"),
    ("plaintext key", _set("admin_key_hashes", ["lpx-secret"]), "admin_key_hashes[0]: must be 'sha256:'"),
    ("negative price", _set("pricing", {"default": {"prompt": -0.1, "completion": 1}}),
     "pricing.default.prompt: Input should be greater than or equal to 0"),
    ("negative model price", _set("tenants/0/pricing", {"models": {"org/m": {"prompt": 1, "completion": -2}}}),
     "tenants[0].pricing.models['org/m'].completion: Input should be greater than or equal to 0"),
    ("empty adapter glob", _set("tenants/0/adapters", ["sql-*", " "]),
     "tenants[0].adapters[1]: String should have at least 1 character"),
    ("zero weight", _set("priority_classes/premium/weight", 0),
     "priority_classes.premium.weight: Input should be greater than 0"),
    ("reserved class name", _set("priority_classes/batch", {"weight": 1}),
     "priority_classes.batch: the name is reserved for batch lines"),
    ("bad batch discount", _set("pricing", {"batch_discount": 1.5}),
     "pricing.batch_discount: Input should be less than or equal to 1"),
    ("bad class name", _set("priority_classes/Gold", {"weight": 1}),
     "priority_classes.Gold (name): String should match"),
    ("bad slo", _set("tenants/0/slo", {"ttft": {"seconds": 1, "percentile": 100}}),
     "tenants[0].slo.ttft.percentile: Input should be less than 100"),
    ("zero running slots", _set("admission", {"max_running": 0}),
     "admission.max_running: Input should be greater than 0"),
    ("no tenants", _set("tenants", []), "tenants: List should have at least 1 item"),
    ("negative machine cost", _set("machine_cost_per_hour", -1), "machine_cost_per_hour: Input should be greater"),
]


@pytest.mark.parametrize(("mutate", "expected"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_each_bad_case_is_named_with_its_location(mutate, expected):
    data = copy.deepcopy(_valid())
    mutate(data)
    with pytest.raises(ConfigError) as e:
        parse_tenancy_config(data)
    assert len(e.value.problems) == 1, e.value.problems
    assert e.value.problems[0].startswith(expected), e.value.problems[0]


def test_valid_base_case_is_valid():
    assert [t.name for t in parse_tenancy_config(_valid()).tenants] == ["acme", "hobby"]


def test_all_problems_reported_together():
    data = _valid()
    data["tenants"][0]["limits"] = {"requests_per_minute": -1, "max_tokens": 0}
    data["tenants"][1].update(name="acme", priority="gold", key_hashes=[H1, "nope"])
    data["pricing"] = {"default": {"prompt": -1, "completion": 0}}
    with pytest.raises(ConfigError) as e:
        parse_tenancy_config(data)
    problems = e.value.problems
    expected_locations = [
        "tenants[0].limits.requests_per_minute:", "tenants[0].limits.max_tokens:", "tenants[1].key_hashes[1]:",
        "pricing.default.prompt:", "tenants[1].name: duplicate", "tenants[1].priority: priority class 'gold'",
        "tenants[1].key_hashes[0]: key hash already belongs",
    ]
    assert len(problems) == len(expected_locations), problems
    for location in expected_locations:
        assert any(p.startswith(location) for p in problems), (location, problems)
    assert str(e.value).splitlines() == problems


@pytest.mark.parametrize(("text", "expected"), [
    ("tenants: [\n  {name: a}\n", "tenants.yaml:3:1: YAML syntax error:"),
    ("tenants:\n  - name: a\n   bad: indent\n", "tenants.yaml:3:"),
    ("- just\n- a list\n", "(top level): expected a mapping, got list"),
    ("", "tenants: Field required"),
])
def test_file_level_problems(tmp_path, text, expected):
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_tenancy_config(path)
    assert len(e.value.problems) == 1
    assert e.value.problems[0].startswith(expected) or e.value.problems[0].startswith(f"{tmp_path}/{expected}"), \
        e.value.problems


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_tenancy_config(tmp_path / "absent.yaml")
