"""Fairness between calls: the many requests of one call (``n`` samples, a batch of prompts)
must not hold every later request until they are all done. Checked against a brute-force
order (sort by rank, then arrival) and on an engine."""

from __future__ import annotations

import itertools
from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.sampling.params import SamplingParams
from runtime.scheduler.policy import LPM_MAX_QUEUE, order_waiting
from runtime.scheduler.req import Req
from runtime.scheduler.waiting_queue import WaitingQueue

_clock = itertools.count()


def _req(group: str | None, retracted: bool = False) -> Req:
    req = Req(f"r{next(_clock)}", [1, 2, 3], SamplingParams(), group=group)
    req.created_at = float(next(_clock))  # arrival order, strictly increasing
    req.is_retracted = retracted
    return req


def _cache(disable: bool = False):
    """What ``order_waiting`` reads of a cache manager: nothing matches."""
    return SimpleNamespace(tree=SimpleNamespace(disable=disable), match_len=lambda r: 0)


def _brute_force(queue: list[Req], running: Counter[str]) -> list[Req]:
    """Retracted first (queue order), then everything else by (running members of its group
    + members of its group before it in the queue, place in the queue); a request alone
    ranks 0."""
    before: Counter[str] = Counter()
    rank = {}
    for r in queue:
        if r.group is not None:
            rank[r] = running[r.group] + before[r.group]
            before[r.group] += 1
    rest = sorted((r for r in queue if not r.is_retracted), key=lambda r: (rank.get(r, 0), queue.index(r)))
    return [r for r in queue if r.is_retracted] + rest


def _queue(reqs: list[Req]) -> WaitingQueue:
    queue = WaitingQueue()
    for r in reqs:
        if r.is_retracted:
            queue.put_back(r)
        else:
            queue.append(r)
    return queue


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_a_later_request_goes_ahead_of_the_rest_of_a_call_that_fills_the_batch(policy):
    big = [_req("n128") for _ in range(10)]
    loner = _req(None)
    forks = [_req("forks") for _ in range(3)]
    order = list(order_waiting(_queue(big + [loner] + forks), policy, _cache(), Counter(n128=64)))
    assert order == [loner, *forks, *big]


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_calls_with_nothing_running_take_turns(policy):
    a, b = [_req("a") for _ in range(3)], [_req("b") for _ in range(3)]
    order = list(order_waiting(_queue(a + b), policy, _cache(), Counter()))
    assert order == [a[0], b[0], a[1], b[1], a[2], b[2]]


def test_taking_requests_out_while_the_order_is_made():
    reqs = [_req("a") for _ in range(LPM_MAX_QUEUE)] + [_req(None), _req("b")]
    queue = _queue(reqs)
    taken = []
    for req in order_waiting(queue, "lpm", _cache(), Counter(a=2)):  # past LPM_MAX_QUEUE: made as taken
        queue.remove(req)
        taken.append(req)
    assert taken == _brute_force(reqs, Counter(a=2)) and not queue and not queue.arrived_by_group()


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_a_request_that_joins_late_goes_by_when_it_joined(policy):
    """A request whose grammar compiled late joins the queue after requests created later:
    it goes by its place in the queue under both policies."""
    late_grammar = _req(None)
    queue = [_req(None), _req("g"), _req("g")]
    order = list(order_waiting(_queue([*queue, late_grammar]), policy, _cache(), Counter()))
    assert order == [queue[0], queue[1], late_grammar, queue[2]]


@given(
    members=st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.booleans()), max_size=40),
    running=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 8)),
    policy=st.sampled_from(["fcfs", "lpm", "long"]),
)
def test_order_matches_the_brute_force_order(members, running, policy):
    # retracted requests wait at the front, most recently retracted first
    reqs = [_req(g, retracted) for g, retracted in members]
    queue = _queue(reqs)
    in_queue_order = list(queue)
    want = _brute_force(in_queue_order, Counter(running))
    cache = _cache(disable=policy == "long")
    got = list(order_waiting(queue, "lpm" if policy == "long" else policy, cache, Counter(running)))
    assert got == want


@pytest.mark.slow
def test_a_request_behind_a_large_n_starts_when_rows_free(tiny_gqa_llama):
    """With 2 rows, a call of 6 samples holds both; a request that comes next starts as
    soon as they free, beside the call's third sample, not after all 6 (a call with nothing
    running and a request alone take turns)."""
    from runtime.engine import Engine

    eng = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=2000, max_running_requests=2)
    try:
        sched = eng.scheduler
        params = SamplingParams(max_new_tokens=3, ignore_eos=True)
        call = [Req(f"s{i}", [10 + i, 20, 30], params, group="s0") for i in range(6)]
        for req in call:
            sched.add_request(req)
        sched.step()  # the first two samples are admitted
        later = Req("later", [40, 50, 60], params)
        sched.add_request(later)
        started: dict[str, int] = {}
        step = 1
        while sched.has_work:
            for req in sched.step():
                started.setdefault(req.rid, step)
            step += 1
        assert started["later"] == started["s2"] < started["s3"], started
        sched.check_invariants()
    finally:
        eng.shutdown()


@given(ops=st.lists(st.tuples(st.sampled_from(["append", "put_back", "remove"]), st.sampled_from(["a", None]),
                              st.integers(0, 30)), max_size=60))
def test_the_queue_keeps_its_order_groups_and_ids_as_a_list_would(ops):
    """A model: a list with put-back requests in front (most recent first), arrivals after."""
    queue, front, arrived = WaitingQueue(), [], []
    for op, group, k in ops:
        present = front + arrived
        if op == "remove" and present:
            req = present[k % len(present)]
            queue.remove(req)
            (front if req in front else arrived).remove(req)
        elif op == "put_back":
            req = _req(group, retracted=True)
            queue.put_back(req)
            front.insert(0, req)
        elif op == "append":
            req = _req(group)
            queue.append(req)
            arrived.append(req)
        assert list(queue) == front + arrived and len(queue) == len(front) + len(arrived)
        assert all(queue.find(r.rid) is r and r in queue for r in front + arrived)
        by_group = {g: list(members) for g, members in queue.arrived_by_group().items()}
        assert by_group == {g: [r for r in arrived if r.group == g] for g in {r.group for r in arrived}}
