"""The queue of requests waiting for their grammar: taking one out by id, and a compile
cancelled only when no request waits for it any more (a stand-in cache records it)."""

from __future__ import annotations

from concurrent.futures import Future

from runtime.sampling.params import SamplingParams
from runtime.scheduler.grammar_queue import GrammarQueue
from runtime.scheduler.req import Req


class _Cache:
    def __init__(self) -> None:
        self.futures: dict[object, Future] = {}
        self.cancelled: list[object] = []

    def get(self, spec: object) -> Future:
        return self.futures.setdefault(spec, Future())

    def cancel_unstarted(self, spec: object, fut: Future) -> None:
        self.cancelled.append(spec)


def test_a_shared_compile_is_cancelled_when_its_last_request_leaves():
    queue = GrammarQueue(lambda: None, timeout_s=30)
    queue._cache = cache = _Cache()  # type: ignore[assignment]
    same = [Req(f"r{i}", [1], SamplingParams(regex="a+")) for i in range(3)]
    other = Req("x", [1], SamplingParams(regex="b+"))
    for req in [*same, other]:
        queue.add(req)
    assert len(queue) == 4
    assert queue.remove("r1") is same[1] and queue.remove("r1") is None
    assert queue.remove("r0") is same[0] and not cache.cancelled  # r2 still waits for it
    assert queue.remove("r2") is same[2] and len(cache.cancelled) == 1
    assert queue.remove("x") is other and len(cache.cancelled) == 2 and len(queue) == 0
