"""Liveness and readiness: the answers of /health, /ready and SageMaker's /ping, decided in one place."""

from __future__ import annotations

from api.errors import OpenAIError
from api.lifecycle import Lifecycle
from engine.types import EngineClient


def liveness(engine: EngineClient) -> dict[str, str]:
    """Alive: the process answers and the engine has not died; 503 otherwise."""
    if not engine.is_alive():
        raise OpenAIError(503, "The engine is not running.", code="engine_dead")
    return {"status": "ok"}


def readiness(lifecycle: Lifecycle, engine: EngineClient) -> dict[str, str]:
    """Ready for traffic: engine started and model loaded, not draining; 503 otherwise."""
    if lifecycle.draining:
        raise OpenAIError(503, "The server is draining.", code="draining")
    if not lifecycle.ready or not engine.is_alive():
        raise OpenAIError(503, "The server is starting.", code="not_ready")
    return {"status": "ready", "model": engine.model_id}
