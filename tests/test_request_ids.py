"""Request ids from a client's ``rid`` and the aborts kept for requests still arriving (no
model, no server; the live checks are in test_server_native.py and test_server_native_aborts.py)."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from runtime.server.protocol import ApiError
from runtime.server.request_ids import ArrivingRequests, request_ids


def test_a_rid_names_its_requests_and_keeps_the_clients_id():
    assert request_ids(None, [2]) is None
    assert request_ids("a", [1]) == [("a", "a")]
    assert request_ids("a", [2, 1]) == [("a_0", "a"), ("a_1", "a"), ("a_2", "a")]
    assert request_ids(["p", "q"], [2, 1]) == [("p_0", "p"), ("p_1", "p"), ("q", "q")]  # one per prompt
    assert request_ids(["x", "y", "z"], [2, 1]) == [("x", "x"), ("y", "y"), ("z", "z")]  # one per request
    with pytest.raises(ApiError, match="got 2 rids for 3 prompts"):
        request_ids(["x", "y"], [1, 1, 1])


class _Request:  # what ArrivingRequests reads of an HTTP request: its per-request state
    def __init__(self) -> None:
        self.state = SimpleNamespace()


def test_an_abort_is_kept_only_for_requests_arriving_when_it_came():
    arrivals = ArrivingRequests()
    early, other = _Request(), _Request()
    arrivals.arrive(early)
    arrivals.arrive(other)
    arrivals.abort("job", abort_all=False)
    late = _Request()
    arrivals.arrive(late)  # sent after the abort: not aborted by it
    assert arrivals.submitted(early) == {"job"} and arrivals.submitted(late) == set()
    arrivals.abort("", abort_all=False)  # no rid: nothing
    arrivals.abort(None, abort_all=True)
    assert arrivals.submitted(other) == {"job", None}
    arrivals.abort("job", abort_all=False)  # submitted ones are the scheduler client's business
    assert early.state.aborts == {"job"}


def test_a_request_that_never_submits_leaves_with_its_handler():
    arrivals = ArrivingRequests()
    arrivals.arrive(_Request())
    gc.collect()
    assert len(arrivals._open) == 0  # noqa: SLF001
