from api.observability.drift import DriftConfig, DriftMonitor, DriftSample, WindowState
from api.observability.drift_store import DriftStore
from api.server import running


def sample(prompt: int, mean: float | None = -1.5) -> DriftSample:
    return DriftSample(prompt, 2, mean, "stop", (3, 4))


def test_save_and_load_round_trip(tmp_path):
    states = {("poet", "2"): WindowState([sample(1), sample(2, None)], [sample(3)], True),
              ("base", ""): WindowState([sample(4)], [], False)}
    store = DriftStore(tmp_path / "drift.sqlite")
    store.save(states)
    store.save(states)  # replaces, does not add
    store.close()
    assert DriftStore(tmp_path / "drift.sqlite").load() == states


def test_restore_keeps_reference_and_latest_window():
    saved = {("m", "1"): WindowState([sample(p) for p in range(5)], [sample(p) for p in range(10, 16)], False),
             ("m", "2"): WindowState([sample(p) for p in range(5)], [], True)}
    monitor = DriftMonitor(DriftConfig(drift_reference_requests=3, drift_window_requests=4))
    monitor.restore(saved)
    state = monitor.export()
    assert [s.prompt_tokens for s in state[("m", "1")].reference] == [0, 1, 2]
    assert [s.prompt_tokens for s in state[("m", "1")].current] == [12, 13, 14, 15]
    assert len(state[("m", "2")].reference) == 5  # a pinned reference is kept whole
    monitor.record("m", "1", sample(99))
    assert [s.prompt_tokens for s in monitor.export()[("m", "1")].current] == [13, 14, 15, 99]


def test_windows_survive_a_server_restart(make_fake_server):
    first = make_fake_server()
    for prompt in (5, 5, 50):
        first.drift.record("poet", "1", sample(prompt))
    before = first.drift.export()
    running.close(first)
    second = make_fake_server()
    assert second.drift.export() == before
    running.close(second)
