"""Command-line flags generated from typed configs, so help text and defaults have one source."""

from __future__ import annotations

import argparse
import typing

from pydantic import BaseModel


def add_config_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], skip: set[str]) -> None:
    """One `--field-name` flag per field of `model`, its help the field's description."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        annotation = _without_none(field.annotation)
        shown = "" if "default" in (field.description or "") else " (default: %(default)s)"
        kwargs: dict = {"dest": name, "default": field.default, "help": f"{field.description}{shown}"}
        if typing.get_origin(annotation) is typing.Literal:
            kwargs["choices"] = typing.get_args(annotation)
        elif annotation in (int, float):
            kwargs["type"] = annotation
        elif annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        parser.add_argument(flag, **kwargs)


def _without_none(annotation: object) -> object:
    """`int | None` -> int: an optional number is still typed on the command line."""
    args = typing.get_args(annotation)
    if type(None) in args and len(args) == 2:
        return next(a for a in args if a is not type(None))
    return annotation


Config = typing.TypeVar("Config", bound=BaseModel)


def config_from_args(config_cls: type[Config], args: argparse.Namespace, **extra: object) -> Config:
    values = {name: getattr(args, name) for name in config_cls.model_fields if hasattr(args, name)}
    return config_cls(**{**values, **extra})
