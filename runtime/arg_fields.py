"""Flag dataclasses: fields that are also command-line flags.

Every field carries its ``--help`` text in ``metadata["help"]``; ``add_cli_args`` turns the
fields into argparse flags (``disable_radix_cache`` becomes ``--disable-radix-cache``) and
``cli_flags`` turns a value back into flags, so the CLI and the Python API can never drift
apart. ``ServerArgs`` (runtime/config.py) and the serve command's ``HttpArgs`` and
``DataParallelArgs`` (runtime/serve_args.py) are built from these pieces.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from dataclasses import field
from typing import Any


def flag_field(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field that is also a flag: its help text, and ``choices`` or ``aliases``
    where given, in ``metadata``."""
    return field(default=default, metadata={"help": help, **extra})


def check_types(args: Any) -> None:
    """``ValueError`` naming the field unless each field holds its annotated type (``int``
    excludes ``bool``; ``float`` takes an ``int`` and must be finite) and, where it lists
    ``choices`` (its flag's), one of them, so that a wrong ``Engine(...)`` keyword fails here
    rather than deep inside a process."""
    for f in dataclasses.fields(args):
        value, kind = getattr(args, f.name), str(f.type)
        if value is None and kind.endswith("| None"):
            continue
        base = kind.removesuffix(" | None")
        ok = {
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
            "tuple[str, ...]": isinstance(value, tuple) and bool(value) and all(isinstance(v, str) for v in value),
        }[base]
        if not ok:
            what = {"float": "a finite number", "int": "an integer", "bool": "True or False", "str": "a string",
                    "tuple[str, ...]": "one or more strings"}[base]
            raise ValueError(f"{f.name} must be {what}{' or None' if base != kind else ''}, got {value!r}")
        choices = f.metadata.get("choices")
        if choices is not None and value is not None and value not in choices:
            raise ValueError(f"{f.name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def add_cli_args(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one ``--flag`` per dataclass field, with its type, default, choices and help."""
    for f in dataclasses.fields(cls):
        flags = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", [])]
        meta = f.metadata
        default = f.default
        if f.type in (bool, "bool"):
            if default:  # on by default: --flag / --no-flag
                parser.add_argument(*flags, action=argparse.BooleanOptionalAction, default=True, help=meta["help"])
            else:
                parser.add_argument(*flags, action="store_true", help=meta["help"])
            continue
        kind = _cli_type(f.type)
        kw: dict[str, Any] = {"type": kind, "default": default, "help": meta["help"]}
        if "choices" in meta:
            kw["choices"] = meta["choices"]
        if str(f.type).startswith("tuple"):  # one or more values: --flag a b
            kw["nargs"] = "+"
        parser.add_argument(*flags, dest=f.name, **kw)


def _cli_type(annotation: Any) -> type:
    text = str(annotation)
    if "int" in text:
        return int
    if "float" in text:
        return float
    return str


def args_from_namespace(ns: argparse.Namespace, cls: type, as_flags: bool = True) -> Any:
    """``cls`` from parsed flags; a ``ValueError`` names the flags (``--kv-cache-memory``),
    or with ``as_flags`` false the fields (``kv_cache_memory``), as keyword arguments name them."""
    def value(f: dataclasses.Field) -> Any:
        got = getattr(ns, f.name)
        return tuple(got) if isinstance(got, list) else got  # nargs: a list

    try:
        return cls(**{f.name: value(f) for f in dataclasses.fields(cls)})
    except ValueError as err:
        if not as_flags:
            raise
        raise ValueError(fields_as_flags(str(err), field_names(cls))) from err


def field_names(*classes: type) -> list[str]:
    """The field names of these flag dataclasses, for ``fields_as_flags``."""
    return [f.name for cls in classes for f in dataclasses.fields(cls)]


def fields_as_flags(message: str, names: list[str]) -> str:
    """``message`` with the fields it names (of ``names``) written as flags, for errors the
    command line prints. A one-word name (``device``, ``port``) counts only as the message's
    first word, where the checks name their field, so a sentence or a path that holds the
    word stays as it is."""
    for name in sorted(names, key=len, reverse=True):
        where = rf"(?<![\w/.-]){name}(?![\w/-])" if "_" in name else rf"^{name}(?![\w/-])"
        message = re.sub(where, "--" + name.replace("_", "-"), message)
    return message


def cli_flags(args: Any) -> list[str]:
    """The command-line flags that rebuild ``args`` (a flag dataclass), for the
    fields that differ from their defaults: the inverse of ``add_cli_args``."""
    out: list[str] = []
    for f in dataclasses.fields(args):
        value, flag = getattr(args, f.name), "--" + f.name.replace("_", "-")
        if value == f.default:
            continue
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, tuple):
            out += [flag, *map(str, value)]
        elif value is not None:
            out += [flag, str(value)]
    return out
