"""Checks the DSL tests share."""

from __future__ import annotations

import re

import frontend_lang as sgl


def assert_failed(state: sgl.ProgramState, pattern: str) -> None:
    """As in SGLang, a failed operation ends the program without raising: ``run`` returns
    the state and ``error()`` says what failed."""
    assert isinstance(state.error(), sgl.ProgramError) and re.search(pattern, str(state.error())), state.error()
