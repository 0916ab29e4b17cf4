"""`loraplex batches list|show|cancel` over a batch store, and the progress bar."""

from __future__ import annotations

import json

import pytest

from api.batch.store import BatchStore, LineResult
from api.cli.batches import progress_bar
from api.cli.main import main


@pytest.mark.parametrize(("finished", "total", "width", "bar"), [
    (0, 10, 10, "[..........]  0/10   0%"),
    (3, 10, 10, "[###.......]  3/10  30%"),
    (10, 10, 10, "[##########] 10/10 100%"),
    (0, 0, 4, "[....] 0/0   0%"),
])
def test_progress_bar(finished, total, width, bar):
    assert progress_bar(finished, total, width) == bar


@pytest.fixture
def store_path(tmp_path):
    path = tmp_path / "batches.sqlite"
    store = BatchStore(path)
    for batch_id, tenant in (("batch_a", "acme"), ("batch_b", "globex")):
        store.add_batch({"id": batch_id, "tenant": tenant, "endpoint": "/v1/completions", "input_file_id": "file-x",
                         "completion_window": "24h", "status": "validating", "created_at": 1, "expires_at": 99})
        store.start(batch_id, [(n, f"c{n}", {"prompt": "p"}) for n in range(1, 5)], reserved_tokens=40)
    store.finish_line("batch_a", 1, LineResult("done", 200, "r1", {}))
    store.finish_line("batch_a", 2, LineResult("failed", 400, "r2", {}))
    store.close()
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out = capsys.readouterr()
    return exited.value.code, out.out, out.err


def test_list_shows_progress_newest_first(store_path, capsys):
    code, out, _ = run(capsys, "batches", "list", "--store", str(store_path))
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["batch_b", "batch_a"]
    assert "2/4  50%" in out.splitlines()[1] and "failed 1" in out.splitlines()[1]
    code, out, _ = run(capsys, "batches", "list", "--store", str(store_path), "--tenant", "acme", "--json")
    assert [b["id"] for b in json.loads(out)] == ["batch_a"]
    assert json.loads(out)[0]["request_counts"] == {"total": 4, "completed": 1, "failed": 1}


def test_show_and_cancel(store_path, capsys):
    code, out, _ = run(capsys, "batches", "show", "batch_a", "--store", str(store_path))
    assert code == 0 and "in_progress" in out and "input_file_id: file-x" in out
    assert run(capsys, "batches", "cancel", "batch_a", "--store", str(store_path))[:2] == (0, "batch_a cancelling\n")
    code, out, _ = run(capsys, "batches", "show", "batch_a", "--store", str(store_path), "--json")
    assert json.loads(out)["status"] == "cancelling" and json.loads(out)["cancelling_at"]
    code, _, err = run(capsys, "batches", "cancel", "batch_a", "--store", str(store_path))
    assert code == 1 and "only a validating or running batch" in err
    code, _, err = run(capsys, "batches", "show", "batch_zz", "--store", str(store_path))
    assert code == 1 and "no batch batch_zz" in err
