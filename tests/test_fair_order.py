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


def _req(group: str | None, retracted: bool = False, yielded: bool = False) -> Req:
    req = Req(f"r{next(_clock)}", [1, 2, 3], SamplingParams(), group=group)
    req.created_at = float(next(_clock))  # arrival order, strictly increasing
    req.is_retracted = retracted or yielded
    req.yielded = yielded
    return req


def _cache(disable: bool = False):
    """What ``order_waiting`` reads of a cache manager: nothing matches."""
    return SimpleNamespace(tree=SimpleNamespace(disable=disable), match_len=lambda r: 0)


def _brute_force(queue: list[Req], running: Counter[str]) -> list[Req]:
    """``queue`` in the queue's order (put back, the most recent first, then arrivals).
    Requests retracted for memory first, in that order; then everything else by (running
    members of its group + members of its group counted before it, place), counting the
    retracted, then those that yielded a row (the longest waiting first), then arrivals; a
    request alone ranks 0."""
    front = [r for r in queue if r.is_retracted and not r.yielded]
    rest = [r for r in reversed(queue) if r.yielded] + [r for r in queue if not r.is_retracted]
    before: Counter[str] = Counter()
    rank = {}
    for r in front + rest:
        if r.group is not None:
            rank[r] = running[r.group] + before[r.group]
            before[r.group] += 1
    return front + sorted(rest, key=lambda r: (rank.get(r, 0), rest.index(r)))


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
    members=st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.sampled_from(["new", "retracted", "yielded"])),
                     max_size=40),
    running=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 8)),
    policy=st.sampled_from(["fcfs", "lpm", "long"]),
)
def test_order_matches_the_brute_force_order(members, running, policy):
    # retracted requests wait at the front, most recently retracted first
    reqs = [_req(g, retracted=state == "retracted", yielded=state == "yielded") for g, state in members]
    queue = _queue(reqs)
    in_queue_order = list(queue)
    want = _brute_force(in_queue_order, Counter(running))
    cache = _cache(disable=policy == "long")
    got = list(order_waiting(queue, "lpm" if policy == "long" else policy, cache, Counter(running)))
    assert got == want


@pytest.mark.slow
def test_a_request_behind_a_large_n_starts_at_once(tiny_gqa_llama):
    """With 2 rows, a call of 6 samples holds both; a request that comes next starts in the
    next step (a sample yields it its row), not after all 6, and the call's samples that
    had not started come after it."""
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
        assert started["later"] == 1 < started["s2"] < started["s3"], started
        assert sched.send_back.num_rows_yielded == 1
        sched.check_invariants()
    finally:
        eng.shutdown()


@given(ops=st.lists(st.tuples(st.sampled_from(["append", "put_back", "remove", "batch", "back_again"]), st.sampled_from(["a", None]),
                              st.integers(0, 30)), max_size=60))
def test_the_queue_keeps_its_order_groups_and_ids_as_a_list_would(ops):
    """A model: a list with put-back requests in front (most recent first), arrivals after;
    each request's count of prefill batches formed while it waited, kept over its waits."""
    queue, front, arrived, gone = WaitingQueue(), [], [], []
    passed: dict[str, int] = {}
    for op, group, k in ops:
        present = front + arrived
        if op == "remove" and present:
            req = present[k % len(present)]
            queue.remove(req)
            (front if req in front else arrived).remove(req)
            gone.append(req)
        elif op == "batch":
            queue.batch_formed()
            for r in present:
                passed[r.rid] = passed.get(r.rid, 0) + 1
        elif op == "back_again" and gone:  # a request taken out earlier, retracted later
            req = gone.pop(k % len(gone))
            queue.put_back(req)
            front.insert(0, req)
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
        assert all(queue.passed_over(r) == passed.get(r.rid, 0) for r in front + arrived)


def test_a_request_that_yielded_its_row_ranks_with_its_call_and_one_retracted_for_memory_goes_first():
    """A member of a call that yielded its row to a later request counts in its call's
    rank (put first, it would take its row straight back); one retracted because memory was
    short still goes first (it waited already, and newcomers could evict its KV)."""
    loner, yielded, retracted = _req(None), _req("n64", yielded=True), _req("n64", retracted=True)
    for policy in ("fcfs", "lpm"):
        assert list(order_waiting(_queue([loner, yielded]), policy, _cache(), Counter(n64=62))) == [loner, yielded]
        assert list(order_waiting(_queue([loner, yielded]), policy, _cache(), Counter())) == [yielded, loner]
        assert list(order_waiting(_queue([loner, retracted]), policy, _cache(), Counter(n64=62))) == [retracted, loner]


def test_of_a_calls_requests_that_yielded_rows_the_longest_waiting_goes_first():
    """The least advanced member yields, so the one that came back last would be sent back
    again while an older one waited on."""
    older, newer = _req("n64", yielded=True), _req("n64", yielded=True)
    queue = WaitingQueue()
    queue.put_back(older)
    queue.put_back(newer)
    for policy in ("fcfs", "lpm"):
        assert list(order_waiting(queue, policy, _cache(), Counter(n64=60))) == [older, newer]


def _run_to_end(sched, step: int = 0) -> dict[str, tuple[int, int]]:
    """Step until idle; each request's (first step it got a token, step it finished)."""
    seen: dict[str, tuple[int, int]] = {}
    while sched.has_work:
        step += 1
        for req in sched.step():
            first = seen.get(req.rid, (step, step))[0]
            seen[req.rid] = (first, step)
    return seen


@pytest.mark.slow
def test_a_later_call_gets_a_row_from_a_call_holding_them_all(tiny_gqa_llama):
    """4 rows, all held by one call's 4 samples of 40 tokens: a request that comes next
    used to wait ~40 steps for a row. The call's least advanced sample yields its row (its
    KV goes to the tree) and resumes after; every output is the one it gets unhindered."""
    from runtime.engine import Engine

    params = SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=0)
    short = SamplingParams(max_new_tokens=3, ignore_eos=True, temperature=0)

    def reqs() -> tuple[list[Req], Req]:
        return [Req(f"s{i}", [10 + i, 20, 30], params, group="s0") for i in range(4)], Req("later", [40, 50], short)

    outputs = {}
    for rows in (8, 4):  # 8: nobody waits (the oracle); 4: the later request waits for a row
        eng = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=2000, max_running_requests=rows)
        try:
            sched = eng.scheduler
            call, later = reqs()
            for req in call:
                sched.add_request(req)
            for _ in range(3):  # prefill, then two decode steps
                sched.step()
            sched.add_request(later)
            steps = _run_to_end(sched, 3)
            outputs[rows] = {r.rid: list(r.output_ids) for r in [*call, later]}
            if rows == 4:
                assert steps["later"][1] <= 3 + 5, steps  # started at once, done in its 3 tokens
                assert sched.send_back.num_rows_yielded == 1 and sched.send_back.num_retractions == 0
            sched.check_invariants()
        finally:
            eng.shutdown()
    assert outputs[4] == outputs[8]


def _bare_scheduler(running: list[Req], max_running: int):
    """A scheduler with only what deciding whether a row yields reads."""
    from runtime.scheduler.scheduler import Scheduler

    sched = Scheduler.__new__(Scheduler)
    sched.args = SimpleNamespace(max_running_requests=max_running)
    sched.cache = SimpleNamespace(tree=SimpleNamespace(disable=False))
    sched.running, sched.jumped, sched.chunked = running, [], None
    sched.yielded = []
    sched.send_back = SimpleNamespace(yielding_row=sched.yielded.append)
    return sched


def _yields(sched, first: Req) -> bool:
    return sched._yield_row(first, Counter(r.group for r in sched.admitted()))


def test_rows_are_not_taken_from_a_call_holding_at_most_one_more():
    """Two calls of 2 rows each and a third sample of one of them waiting: nothing yields
    (moving a row between them would only churn); nor for a request put back already, nor
    without the radix cache (the victim would compute all its tokens again)."""
    sched = _bare_scheduler([_req("a"), _req("a"), _req("b"), _req("b")], max_running=4)
    for first in (_req("a"), _req("b"), _req(None, retracted=True)):
        assert not _yields(sched, first)
    assert _yields(_bare_scheduler([_req("a")] * 3 + [_req("b")], max_running=4), _req(None))
    sched.cache.tree.disable = True
    assert not _yields(sched, _req(None))


def test_a_call_of_a_fair_size_keeps_its_rows():
    """64 rows held by 16 programs' 4 forks each, and a request alone waiting: a fork
    yielding would only slow a program down (its fair share is 64 / 17 rows, and it holds
    less than twice that); nor do calls of 2 give rows to more calls of 2. One call holding
    all 64 rows yields one to the same request, its least advanced member."""
    loner = _req(None)
    assert not _yields(_bare_scheduler([_req(f"program{p}") for p in range(16) for _ in range(4)], 64), loner)
    assert not _yields(_bare_scheduler([_req(f"pair{p}") for p in range(32) for _ in range(2)], 64), _req("pair32"))
    hog = [_req("n64") for _ in range(64)]
    hog[5].output_ids = []
    for r in hog[:5] + hog[6:]:
        r.output_ids = [7]
    sched = _bare_scheduler(list(hog), 64)
    assert _yields(sched, loner) and sched.yielded == [hog[5]]
    assert len(sched.running) == 63


@pytest.mark.slow
def test_no_row_is_yielded_to_a_request_the_memory_reserve_keeps_waiting(tiny_gqa_llama):
    """A row yielded to a request that then cannot start for memory was lost for nothing:
    the call decoded a row short, and its member's KV, freed to the tree, could be evicted
    for the newcomer. The yield is decided only once the request passes every other check."""
    from runtime.engine import Engine

    eng = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=200, max_running_requests=4)
    try:
        sched = eng.scheduler
        params = SamplingParams(max_new_tokens=40, ignore_eos=True, temperature=0)
        for i in range(4):
            sched.add_request(Req(f"s{i}", [10 + i, 20, 30], params, group="s0"))
        for _ in range(3):
            sched.step()
        # 100 prompt tokens: under the pool, but not beside the 4 samples' decode reserve
        sched.add_request(Req("later", list(range(100, 200)), SamplingParams(max_new_tokens=3, temperature=0)))
        sched.step()
        assert sched.send_back.num_rows_yielded == 0 and len(sched.running) == 4
        done = _run_to_end(sched)
        assert set(done) >= {"later"} and sched.send_back.num_retractions == 0
        sched.check_invariants()
    finally:
        eng.shutdown()
