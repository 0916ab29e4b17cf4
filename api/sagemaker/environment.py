"""What a SageMaker host gives the container: the port to bind and the model artefacts under /opt/ml/model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PORT_ENV = "SAGEMAKER_BIND_TO_PORT"
MODEL_DIR = Path("/opt/ml/model")
ADAPTERS_SUBDIR = "adapters"


def bound_port(environ: Mapping[str, str]) -> int | None:
    """`$SAGEMAKER_BIND_TO_PORT` when set (it overrides --port), else None; ValueError when not a number."""
    value = environ.get(PORT_ENV, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError as e:
        raise ValueError(f"{PORT_ENV} must be a port number, got {value!r}") from e


@dataclass(frozen=True)
class ModelArtifacts:
    """A base model checkpoint (a folder with config.json) and adapter folders, published by name."""

    model_dir: Path | None
    adapters: tuple[tuple[str, Path], ...]


def model_artifacts(root: Path = MODEL_DIR) -> ModelArtifacts:
    """`root` itself when it holds a checkpoint, and each folder `root/adapters/NAME/` as adapter NAME."""
    model_dir = root if (root / "config.json").is_file() else None
    adapters_dir = root / ADAPTERS_SUBDIR
    adapters = ()
    if adapters_dir.is_dir():
        adapters = tuple((p.name, p) for p in sorted(adapters_dir.iterdir())
                         if p.is_dir() and not p.name.startswith("."))
    return ModelArtifacts(model_dir, adapters)
