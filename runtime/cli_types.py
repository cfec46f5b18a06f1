"""argparse ``type=`` checks shared by the subcommands, so a nonsense value is refused by
the parser, naming its flag, before anything loads."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _number(kind: Callable[[str], float], text: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def int_at_least(minimum: int) -> Callable[[str], int]:
    """A check for an integer >= ``minimum``."""
    def check(text: str) -> int:
        value = int(_number(int, text))
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return check


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _number(float, text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    value = _number(float, text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value
