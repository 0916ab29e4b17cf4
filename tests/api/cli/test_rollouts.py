from __future__ import annotations

import json

from adapters.index import RegistryIndex
from adapters.rollouts import ArmOutcome, RolloutStore
from tests.api.cli.test_adapters import adapter, cli  # noqa: F401  (fixtures)


def test_rollout_report_promote_abort_and_fallback(cli, adapter, tmp_path):  # noqa: F811
    for source in ("sql-helper", "support-bot", "sql-helper"):
        assert cli("push", adapter(source), "--name", "sql")[0] == 0  # sql@1, sql@2, sql@3 (content differs)
    assert cli("promote", "sql@1")[0] == 0

    code, out, _ = cli("rollout", "sql", "--candidate", "sql@2", "--percent", "10", "--min-requests", "5")
    assert code == 0 and "10% of sql -> sql@2 (canary), stable sql@1" in out
    code, _, err = cli("rollout", "sql", "--candidate", "sql@3", "--percent", "10")
    assert code == 2 and "already has an active rollout" in err
    code, _, err = cli("rollout", "sql", "--candidate", "other@3", "--percent", "10")
    assert code == 2 and "not a version of 'sql'" in err

    with RegistryIndex(tmp_path / "index.sqlite") as index:
        store = RolloutStore(index)
        rollout = store.active()["sql"]
        assert rollout.guard.min_requests == 5
        store.record([ArmOutcome(f"s{i}", rollout.id, "stable", "acme", 200, 0.1 + i / 100, None, 3, 0.0, None, 1.0)
                      for i in range(4)] +
                     [ArmOutcome("c1", rollout.id, "candidate", "acme", 500, None, None, 0, 0.0, None, 1.0)])
    code, out, _ = cli("report", "sql", "--min-samples", "3")
    assert code == 0
    assert "stable     sql@1  4" in out and "candidate  sql@2  1" in out
    assert "error_rate: two-proportion z-test: not enough data (n < 3 per arm)" in out
    code, out, _ = cli("report", "sql", "--json")
    report = json.loads(out)
    assert [a["requests"] for a in report["arms"]] == [4, 1] and report["arms"][1]["error_rate"] == 1.0

    code, out, _ = cli("promote", "sql")
    assert code == 0 and "sql:stable -> sql@2 (rollout 1 promoted)" in out
    code, _, err = cli("abort", "sql")
    assert code == 2 and "no active rollout" in err

    assert cli("rollout", "sql", "--candidate", "sql@3", "--percent", "50", "--sticky")[0] == 0
    code, out, _ = cli("promote", "sql@1")  # a plain promote of stable ends the rollout too
    assert code == 0
    code, out, _ = cli("report", "sql", "--json")
    assert json.loads(out)["rollout"]["state"] == "promoted" and json.loads(out)["rollout"]["policy"] == "ab"

    assert cli("rollout", "sql", "--candidate", "sql@3", "--percent", "5")[0] == 0
    code, out, _ = cli("abort", "sql", "--reason", "looked wrong")
    assert code == 0 and "aborted; sql -> sql@1" in out

    code, out, _ = cli("fallback", "sql", "--previous", "--base")
    assert code == 0 and "previous stable, then base model" in out
    code, out, _ = cli("fallback", "sql")
    assert code == 0 and "nothing (503)" in out
