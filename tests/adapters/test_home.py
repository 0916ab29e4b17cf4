from __future__ import annotations

from pathlib import Path

import pytest

from adapters.home import data_home, demo_home


@pytest.mark.parametrize(("env", "data", "demo"), [
    ({}, Path.home() / ".local" / "share" / "loraplex", Path.home() / ".local" / "share" / "loraplex"),
    ({"LORAPLEX_HOME": "/data"}, Path("/data"), Path("/data")),
    ({"LORAPLEX_HOME": "/data", "LORAPLEX_DEMO_HOME": "/opt/demo"}, Path("/data"), Path("/opt/demo")),
    ({"LORAPLEX_DEMO_HOME": "/opt/demo"}, Path.home() / ".local" / "share" / "loraplex", Path("/opt/demo")),
])
def test_demo_home_defaults_to_the_data_home(monkeypatch, env, data, demo):
    for name in ("LORAPLEX_HOME", "LORAPLEX_DEMO_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (data_home(), demo_home()) == (data, demo)
