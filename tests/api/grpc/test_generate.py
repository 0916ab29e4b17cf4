from __future__ import annotations

from api.grpc.generate import HERE, generated_text


def test_the_committed_generated_code_is_current():
    """`python -m api.grpc.generate` after a change to inference.proto."""
    for name, text in generated_text().items():
        assert (HERE / name).read_text() == text, name
