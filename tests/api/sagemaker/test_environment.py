"""The port and model artefacts a SageMaker host gives the container."""

from __future__ import annotations

import pytest

from api.sagemaker.environment import PORT_ENV, bound_port, model_artifacts


@pytest.mark.parametrize(("environ", "port"), [({}, None), ({PORT_ENV: ""}, None), ({PORT_ENV: "8080"}, 8080),
                                               ({PORT_ENV: " 9000 "}, 9000)])
def test_bound_port(environ, port):
    assert bound_port(environ) == port


def test_bound_port_refuses_garbage():
    with pytest.raises(ValueError, match=PORT_ENV):
        bound_port({PORT_ENV: "http"})


def test_no_artefacts(tmp_path):
    artifacts = model_artifacts(tmp_path / "missing")
    assert artifacts.model_dir is None and artifacts.adapters == ()


def test_checkpoint_and_adapters(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    for name in ("support", "legal", ".hidden"):
        (tmp_path / "adapters" / name).mkdir(parents=True)
    (tmp_path / "adapters" / "README.txt").write_text("not an adapter")
    artifacts = model_artifacts(tmp_path)
    assert artifacts.model_dir == tmp_path
    assert artifacts.adapters == (("legal", tmp_path / "adapters" / "legal"),
                                  ("support", tmp_path / "adapters" / "support"))


def test_adapters_without_a_checkpoint(tmp_path):
    (tmp_path / "adapters" / "support").mkdir(parents=True)
    artifacts = model_artifacts(tmp_path)
    assert artifacts.model_dir is None and [name for name, _ in artifacts.adapters] == ["support"]
