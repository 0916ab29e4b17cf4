"""Building the demo: a build another process finished meanwhile is kept, not deleted under its server."""

from __future__ import annotations

import pytest

from adapters.demo import assets


def test_a_build_another_process_finished_meanwhile_is_kept(tmp_path, monkeypatch):
    config = assets.DemoConfig(demo="tiny")
    root = tmp_path / config.folder

    def built_here_while_another_process_finishes(staging):
        staging.mkdir(parents=True)
        (staging / "built-here").write_text("x")
        root.mkdir()
        (root / "built-there").write_text("y")
        (root / "COMPLETE").write_text(config.folder + "\n")

    monkeypatch.setattr(assets, "_tiny_steps", lambda: [("one step", built_here_while_another_process_finishes)])
    found = assets.ensure_demo_assets(tmp_path, config)
    assert found.model_dir == root / "model"
    assert sorted(p.name for p in root.iterdir()) == ["COMPLETE", "built-there"]
    assert [p.name for p in tmp_path.iterdir()] == [config.folder], "the staging folder is gone"


def test_a_finished_build_is_used_without_building(tmp_path, monkeypatch):
    config = assets.DemoConfig(demo="tiny")
    (tmp_path / config.folder).mkdir()
    (tmp_path / config.folder / "COMPLETE").write_text(config.folder + "\n")
    monkeypatch.setattr(assets, "_tiny_steps", lambda: pytest.fail("built again"))
    assert assets.ensure_demo_assets(tmp_path, config).model_dir == tmp_path / config.folder / "model"
