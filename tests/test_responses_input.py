"""Responses input as chat messages (no model): a function_call_output must answer a call
made before it; what the history already holds is not judged again."""

from __future__ import annotations

import pytest

from runtime.server.protocol import ApiError
from runtime.server.responses_input import _check_call_outputs

CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                                                          "function": {"name": "f", "arguments": "{}"}}]}


def _output(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "3"}


def test_an_output_answers_a_call_from_the_history_or_the_input():
    _check_call_outputs([CALL], [_output("c1")])  # the previous response's call
    _check_call_outputs([], [{"role": "user", "content": "hi"}, CALL, _output("c1")])  # both in the input
    _check_call_outputs([_output("gone")], [{"role": "user", "content": "go on"}])  # an old orphan: not judged


def test_an_output_for_no_call_is_a_400():
    with pytest.raises(ApiError, match="no function call with call_id 'nope'"):
        _check_call_outputs([CALL], [_output("nope")])
    with pytest.raises(ApiError, match="'c1'"):  # the call must come before its output
        _check_call_outputs([], [_output("c1"), CALL])
