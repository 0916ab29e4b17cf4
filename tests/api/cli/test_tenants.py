from __future__ import annotations

import argparse
import json
import os
import stat
from datetime import datetime, timezone

import pytest
import yaml

from api.cli.tenants import add_tenant_parsers, run_tenant_command
from api.observability.outcome import RequestOutcome
from api.tenancy.config import load_tenancy_config
from api.tenancy.keys import KeyRing, Principal, hash_key
from api.tenancy.ledger import UsageLedger

EXISTING = hash_key("lpx-existing")
CONFIG = f"""# comments are lost on rewrite
pricing:
  default: {{prompt: 0.5, completion: 1.5}}
tenants:
  - name: acme
    key_hashes: ["{EXISTING}"]
    adapters: ["*"]
  - name: hobby
"""


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="loraplex")
    add_tenant_parsers(parser.add_subparsers(dest="command", required=True))
    return run_tenant_command(parser.parse_args(argv))


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text(CONFIG)
    path.chmod(0o640)
    return path


@pytest.mark.parametrize("tenant", ["acme", "hobby"])
def test_keys_create_stores_only_the_hash_and_the_printed_key_authenticates(config_path, capsys, tenant):
    assert run(["keys", "create", "--tenant", tenant, "--config", str(config_path)]) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    assert out == key + "\n" and key.startswith("lpx-")
    assert "cannot be shown again" in err
    text = config_path.read_text()
    assert key not in text and hash_key(key) in text
    ring = KeyRing(load_tenancy_config(config_path))
    assert ring.authenticate(key) == Principal(tenant, False)
    assert ring.authenticate("lpx-existing") == Principal("acme", False)
    assert stat.S_IMODE(config_path.stat().st_mode) == 0o640
    assert os.listdir(config_path.parent) == ["tenants.yaml"]


def test_keys_create_keeps_the_rest_of_the_file(config_path, capsys):
    before = yaml.safe_load(config_path.read_text())
    run(["keys", "create", "--tenant", "hobby", "--config", str(config_path)])
    after = yaml.safe_load(config_path.read_text())
    key = capsys.readouterr().out.strip()
    before["tenants"][1]["key_hashes"] = [hash_key(key)]
    assert after == before


@pytest.mark.parametrize(("flag", "principal"), [
    ("--admin", Principal(None, True, reads_metrics=True)),
    ("--metrics", Principal(None, False, reads_metrics=True)),
])
def test_keys_create_admin_and_metrics(config_path, capsys, flag, principal):
    assert run(["keys", "create", flag, "--config", str(config_path)]) == 0
    key = capsys.readouterr().out.strip()
    assert KeyRing(load_tenancy_config(config_path)).authenticate(key) == principal


def test_two_keys_for_one_tenant_both_work(config_path, capsys):
    run(["keys", "create", "--tenant", "hobby", "--config", str(config_path)])
    run(["keys", "create", "--tenant", "hobby", "--config", str(config_path)])
    first, second = capsys.readouterr().out.split()
    ring = KeyRing(load_tenancy_config(config_path))
    assert first != second
    assert ring.authenticate(first) == ring.authenticate(second) == Principal("hobby", False)


@pytest.mark.parametrize(("text", "argv", "code", "message"), [
    (CONFIG, ["--tenant", "nobody"], 2, "unknown tenant 'nobody'"),
    ("tenants: [{name: acme, limits: {rpm: 1}}]\n", ["--tenant", "acme"], 2, "tenants[0].limits.rpm"),
    ("tenants: [\n", ["--tenant", "acme"], 2, "YAML syntax error"),
])
def test_keys_create_errors_leave_the_file_alone(tmp_path, capsys, text, argv, code, message):
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    assert run(["keys", "create", *argv, "--config", str(path)]) == code
    out, err = capsys.readouterr()
    assert out == "" and message in err
    assert path.read_text() == text


def test_keys_create_needs_tenant_or_admin(config_path):
    with pytest.raises(SystemExit) as e:
        run(["keys", "create", "--config", str(config_path)])
    assert e.value.code == 2


def test_keys_create_missing_file(tmp_path, capsys):
    assert run(["keys", "create", "--admin", "--config", str(tmp_path / "absent.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


NOW = datetime(2025, 3, 14, 12, 0, tzinfo=timezone.utc).timestamp()


def _outcome(request_id, tenant, model, version, prompt, completion, price, cost, at):
    return RequestOutcome(request_id, tenant, "standard", model, version, 200, prompt, completion, 0.0, 0.1,
                          0.2, (), price, cost, at)


def _fill(url) -> None:
    old = datetime(2020, 1, 1, tzinfo=timezone.utc).timestamp()
    recent = datetime.now(timezone.utc).timestamp() - 60
    with UsageLedger(url) as ledger:
        ledger.record(_outcome("1", "acme", "sql-helper", "2", 100, 50, 0.000125, 0.00002, recent), "stop")
        ledger.record(_outcome("2", "acme", "sql-helper", "2", 300, 150, 0.000375, 0.00006, recent), "stop")
        ledger.record(_outcome("3", "hobby", "tiny-llama", "", 10, 5, 0.0, 0.000001, old), "length")


@pytest.fixture
def ledger_path(tmp_path):
    path = tmp_path / "usage.sqlite"
    _fill(path)
    return path


@pytest.fixture
def ledger_url(database_url):
    """The same rows on every ledger backend."""
    _fill(database_url)
    return database_url


def test_usage_table(ledger_url, capsys):
    assert run(["usage", "--ledger", ledger_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["TENANT", "MODEL", "VERSION", "REQUESTS", "PROMPT", "TOKENS", "COMPLETION",
                                "TOKENS", "PRICE", "USD", "COST", "USD"]
    assert lines[1].split() == ["acme", "sql-helper", "2", "2", "400", "200", "0.000500", "0.000080"]
    assert lines[2].split() == ["hobby", "tiny-llama", "-", "1", "10", "5", "0.000000", "0.000001"]
    assert lines[3].split() == ["TOTAL", "3", "410", "205", "0.000500", "0.000081"]
    assert len({len(line) for line in lines[:3]}) == 1  # aligned columns


@pytest.mark.parametrize(("flags", "tenants"), [
    ([], ["acme", "hobby"]),
    (["--tenant", "hobby"], ["hobby"]),
    (["--model", "sql-helper"], ["acme"]),
    (["--since", "7d"], ["acme"]),
    (["--until", "2021-01-01"], ["hobby"]),
    (["--tenant", "nobody"], []),
])
def test_usage_json_filters(ledger_url, capsys, flags, tenants):
    assert run(["usage", "--ledger", ledger_url, "--json", *flags]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["tenant"] for r in rows] == tenants
    assert all({"requests", "prompt_tokens", "completion_tokens", "price_usd", "cost_usd"} <= set(r) for r in rows)


def test_usage_with_nothing_matching_says_so(ledger_path, capsys):
    assert run(["usage", "--ledger", str(ledger_path), "--tenant", "nobody"]) == 0
    assert "no usage recorded" in capsys.readouterr().out


def test_usage_default_ledger_is_under_loraplex_home(ledger_path, monkeypatch, capsys):
    monkeypatch.setenv("LORAPLEX_HOME", str(ledger_path.parent))
    assert run(["usage", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["usage", "--ledger", "{tmp}/absent.sqlite"], 1, "no usage ledger"),
    (["usage", "--ledger", "{ledger}", "--since", "last tuesday"], 2, "is not unix seconds, ISO 8601"),
])
def test_usage_errors(ledger_path, tmp_path, capsys, argv, code, message):
    argv = [a.format(tmp=tmp_path, ledger=ledger_path) for a in argv]
    assert run(argv) == code
    assert message in capsys.readouterr().err
