from __future__ import annotations

import argparse
import json
import shutil

import pytest

from api.cli.adapters import add_adapters_parser, run_adapters


@pytest.fixture
def cli(tmp_path, demo_assets, capsys):
    """Runs `loraplex adapters ...` against a registry in tmp_path; returns (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="loraplex")
    add_adapters_parser(parser.add_subparsers(dest="command", required=True))
    common = ["--store", str(tmp_path / "blobs"), "--index", str(tmp_path / "index.sqlite"),
              "--base-model", str(demo_assets.model_dir)]

    def run(*argv: str, registry_flags: bool = True):
        args = parser.parse_args(["adapters", *argv, *(common if registry_flags else [])])
        code = run_adapters(args)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture
def adapter(tmp_path, demo_assets):
    copies = []

    def copy(source: str):
        target = tmp_path / "src" / f"{source}-{len(copies)}"
        copies.append(target)
        shutil.copytree(demo_assets.adapter_dirs[source], target)
        return str(target)

    return copy


def test_push_list_show_promote_rollback_delete(cli, adapter):
    code, out, _ = cli("push", adapter("sql-helper"), "--name", "sql", "--description", "writes SQL")
    assert code == 0 and "pushed sql@1" in out and "sql:stable -> sql@1" in out  # a new name serves at once
    code, out, _ = cli("push", adapter("sql-helper"), "--name", "sql")
    assert code == 0 and "sql@1 already has this content" in out
    code, out, _ = cli("push", adapter("support-bot"), "--name", "sql")
    assert code == 0 and "pushed sql@2" in out and "sql:stable -> sql@1" in out  # published, not serving

    code, out, _ = cli("list", "--json")
    [entry] = json.loads(out)
    assert (entry["name"], entry["description"], entry["aliases"]) == ("sql", "writes SQL", {"stable": 1})
    assert [v["version"] for v in entry["versions"]] == [1, 2]
    code, out, _ = cli("list")
    assert code == 0 and out.splitlines()[1].split()[:3] == ["sql", "1,2", "stable=1"]

    code, out, _ = cli("show", "sql@2", "--json")
    assert json.loads(out)["manifest"]["rank"] == 16
    code, out, _ = cli("show", "sql")
    assert code == 0 and out.startswith("sql@1\n") and "rank: 8" in out

    assert cli("promote", "sql@2")[1] == "sql:stable -> sql@2\n"
    assert cli("promote", "sql@1")[1] == "sql:stable -> sql@1\n"
    assert cli("promote", "sql@2", "--alias", "canary")[1] == "sql:canary -> sql@2\n"
    code, _, err = cli("delete", "sql@2")
    assert code == 2 and err.startswith("error: sql@2 is the target of alias canary")
    assert cli("rollback", "sql")[1] == "sql:stable -> sql@2\n"
    assert cli("rollback", "sql", "--alias", "canary")[0] == 2
    assert cli("delete", "sql@1") == (0, "deleted sql@1\n", "")
    code, _, err = cli("show", "sql@1")
    assert code == 2 and err == "error: adapter 'sql@1' not found\n"


def test_invalid_push_prints_every_problem(cli, adapter):
    folder = adapter("sql-helper")
    config_path = f"{folder}/adapter_config.json"
    config = json.loads(open(config_path).read())
    config.update(peft_type="IA3", target_modules=[])
    open(config_path, "w").write(json.dumps(config))
    code, out, err = cli("push", folder, "--name", "Bad")
    lines = err.splitlines()
    assert code == 2 and out == ""
    assert lines[0] == "error: adapter 'Bad' is not valid:"
    assert any("name 'Bad' must match" in line for line in lines)
    assert any("peft_type must be LORA" in line for line in lines)
    assert any("target_modules is empty" in line for line in lines)
    assert all(line.startswith("  - ") for line in lines[1:]) and len(lines) >= 4


@pytest.mark.parametrize("argv,fragment", [
    (["promote", "sql"], "expected NAME@VERSION"),
    (["delete", "../x@1"], "must be NAME@VERSION"),
    (["show", "a/b"], "must match"),
    (["rollback", "nope"], "adapter 'nope' has no alias 'stable'"),
])
def test_bad_references_exit_2(cli, argv, fragment):
    code, _, err = cli(*argv)
    assert code == 2 and err.startswith("error: ") and fragment in err


def test_rejects_an_unsupported_rank_limit(cli):
    with pytest.raises(SystemExit):
        cli("list", "--max-lora-rank", "7")


def test_defaults_use_the_data_home_and_demo_model(cli, adapter, tmp_path, demo_home, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    # The demo build is shared with the session; only the registry goes to the new home.
    (home / "demo-v2").symlink_to(demo_home / "demo-v2")
    monkeypatch.setenv("LORAPLEX_HOME", str(home))
    code, out, _ = cli("push", adapter("poet"), "--name", "poet", "--demo", "tiny", registry_flags=False)
    assert code == 0 and "pushed poet@1" in out
    assert (home / "registry" / "index.sqlite").is_file()
    assert (home / "registry" / "blobs" / "poet" / "1" / "adapter_model.safetensors").is_file()


def test_a_push_never_goes_live_by_accident(cli, adapter, capsys):
    """The canary workflow: a new version is published beside stable, then rolled out, or promoted on purpose."""
    assert cli("push", adapter("sql-helper"), "--name", "x")[0] == 0
    code, out, _ = cli("push", adapter("support-bot"), "--name", "x")
    assert code == 0 and "x:stable -> x@1" in out
    code, out, err = cli("rollout", "x", "--candidate", "x@2", "--percent", "10")
    assert code == 0, err
    assert "10% of x -> x@2" in out and "stable x@1" in out
    assert cli("abort", "x")[0] == 0

    code, out, err = cli("push", adapter("poet"), "--name", "x", "--canary", "25")  # in one step
    assert code == 0, err
    assert "25% of x -> x@3 (canary), stable x@1" in out and "x:stable -> x@1" in out
    assert cli("abort", "x")[0] == 0

    code, out, _ = cli("push", adapter("sql-helper"), "--name", "x", "--promote")
    assert code == 0 and "pushed x@4" in out and "x:stable -> x@4" in out
    with pytest.raises(SystemExit) as refused:  # argparse refuses the pair before anything is pushed
        cli("push", adapter("poet"), "--name", "x", "--promote", "--canary", "5")
    assert refused.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_compose_publishes_an_exact_mixture_with_its_lineage(cli, adapter):
    assert cli("push", adapter("sql-helper"), "--name", "domain")[0] == 0
    assert cli("push", adapter("support-bot"), "--name", "tone")[0] == 0
    code, out, err = cli("compose", "blend", "--from", "domain@1=0.7", "--from", "tone=0.3")
    assert code == 0, err
    assert "mixture: 0.7 x domain@1 + 0.3 x tone@1 (rank 24)" in out and "pushed blend@1" in out
    code, out, _ = cli("show", "blend", "--json")
    manifest = json.loads(out)["manifest"]
    assert manifest["lineage"]["method"] == "cat"
    assert [(p["name"], p["version"], p["weight"]) for p in manifest["lineage"]["components"]] == [
        ("domain", 1, 0.7), ("tone", 1, 0.3)]
    assert manifest["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    # The same mixture again is the same content: nothing new; a changed weight is a new version beside stable.
    assert "already has this content" in cli("compose", "blend", "--from", "domain@1=0.7", "--from", "tone=0.3")[1]
    code, out, _ = cli("compose", "blend", "--from", "domain@1=0.5", "--from", "tone@1=0.5", "--canary", "10")
    assert code == 0 and "pushed blend@2" in out and "10% of blend -> blend@2 (canary)" in out


@pytest.mark.parametrize("parts,problem", [
    (["domain@1=0.5"], "at least two"),
    (["domain@1=0.5", "nothing@1=0.5"], "nothing@1"),
    (["domain@1", "tone@1=0.5"], "REF=WEIGHT"),
    (["poet@1=0.5", "tone@1=0.5"], "rank 80 exceeds max_lora_rank 64"),
])
def test_compose_refusals(cli, adapter, parts, problem):
    for name, source in (("domain", "sql-helper"), ("tone", "support-bot"), ("poet", "poet")):
        assert cli("push", adapter(source), "--name", name)[0] == 0
    code, _, err = cli("compose", "blend", *[arg for part in parts for arg in ("--from", part)])
    assert code == 2 and problem in err
