"""The routing simulation (``bench_agent/routing_sim``): the gateway's rules, the replicas'
caches and clock on hand-made programs whose hit rates are known, and the traces' call
dependencies on a real workload (with a stand-in tokenizer: no model needed)."""

from __future__ import annotations

import numpy as np

from bench_agent.routing_sim.cluster import SimReplica, simulate
from bench_agent.routing_sim.policies import (
    BLOCK,
    CacheAware,
    CacheAwareConfig,
    PowerOfTwo,
    PrefixIndex,
    RoundRobin,
)
from bench_agent.routing_sim.trace import Call, Program, build_programs
from bench_agent.workloads import get_workload


def _tokens(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 50_000, size=n, dtype=np.int64)


def test_prefix_index_finds_the_latest_replica_with_the_longest_prefix():
    index, shared = PrefixIndex(), _tokens(0, 4 * BLOCK)
    index.insert(np.concatenate([shared, _tokens(1, BLOCK)]), replica=0)
    index.insert(np.concatenate([shared, _tokens(2, 2 * BLOCK)]), replica=1)
    assert index.match(np.concatenate([shared, _tokens(3, BLOCK)])) == (4 * BLOCK, 1)
    assert index.match(np.concatenate([shared, _tokens(1, BLOCK)])) == (5 * BLOCK, 0)
    assert index.match(_tokens(4, 3 * BLOCK)) == (0, None)


def test_cache_aware_follows_the_prefix_unless_out_of_balance():
    policy = CacheAware(CacheAwareConfig(cache_threshold=0.5, balance_abs_threshold=2, balance_rel_threshold=1.5))
    convo = _tokens(0, 8 * BLOCK)
    assert policy.pick(convo, [1, 0, 1]) == 1  # nothing matches: least loaded
    longer = np.concatenate([convo, _tokens(1, BLOCK)])
    assert policy.pick(longer, [0, 2, 0]) == 1  # 8 of 9 blocks match replica 1
    assert policy.pick(longer, [0, 3, 1]) == 0  # 3 - 0 > 2 and 3 > 1.5 * 0: balance first
    assert policy.pick(_tokens(2, 8 * BLOCK), [2, 1, 1]) == 1  # below the threshold: least loaded, first one


def test_round_robin_and_power_of_two():
    rr = RoundRobin()
    assert [rr.pick(_tokens(0, 4), [0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    p2 = PowerOfTwo(seed=1)
    picks = [p2.pick(_tokens(0, 4), [5, 0, 9, 9]) for _ in range(50)]
    assert picks.count(1) > len(picks) / 3  # the idle replica wins every pair it is in
    assert [p2.pick(_tokens(0, 4), [0, 9]) for _ in range(10)] == [0] * 10  # two replicas: the lighter


def _chain(seed: int, turns: int) -> Program:
    """A conversation: each call resends the previous prompt and answer plus a message."""
    calls, history = [], _tokens(seed, 50)
    for t in range(turns):
        answer = _tokens(seed * 100 + t, 10)
        calls.append(Call(history, answer, tuple(range(t))))
        history = np.concatenate([history, answer, _tokens(seed * 100 + 50 + t, 20)])
    return Program(tuple(calls))


def test_one_replica_reuses_each_previous_prompt_and_answer():
    programs = [_chain(s, 3) for s in range(1, 5)]
    result = simulate(programs, RoundRobin(), [SimReplica(10_000)], concurrency=2, decode_weight=1.0)
    # call t reuses the whole call t-1 (its prompt and answer): 60 then 90 tokens of 50, 80, 110
    assert result.prompt_tokens == 4 * (50 + 80 + 110)
    assert result.cached_tokens == 4 * (60 + 90)
    assert result.work == [4 * ((50 + 10) + (80 - 60 + 10) + (110 - 90 + 10))]  # computed prompt + answer


def test_round_robin_loses_the_conversation_and_cache_aware_keeps_it():
    programs = [_chain(s, 3) for s in range(1, 9)]
    rr = simulate(programs, RoundRobin(), [SimReplica(10_000) for _ in range(2)], concurrency=1, decode_weight=1.0)
    assert rr.cached_tokens == 8 * 60  # only the third call finds something: the first call, where it ran
    ca = simulate(programs, CacheAware(), [SimReplica(10_000) for _ in range(2)], concurrency=4, decode_weight=1.0)
    assert ca.cached_tokens == 8 * (60 + 90)
    assert min(ca.work) > 0  # concurrent programs spread over both


def test_a_small_pool_evicts_and_stays_consistent():
    programs = [_chain(s, 4) for s in range(1, 20)]
    small = simulate(programs, RoundRobin(), [SimReplica(300)], concurrency=8, decode_weight=1.0)
    large = simulate(programs, RoundRobin(), [SimReplica(100_000)], concurrency=8, decode_weight=1.0)
    assert small.cached_tokens < large.cached_tokens  # (simulate checks each cache's invariants)


class _CharTokenizer:
    def role_markers(self) -> dict:
        markers = {role: [f"<{role}>", f"</{role}>"] for role in ("system", "user", "assistant")}
        return {**markers, "generation_prompt": "<assistant>", "default_system": ""}

    def batch_encode(self, texts: list[str], special_tokens: bool) -> list[list[int]]:
        return [[ord(c) for c in t] for t in texts]


def test_traces_know_which_calls_wait_for_which():
    tot = get_workload("tree_of_thought")
    (program,) = build_programs(tot, 1, "tiny", 0, _CharTokenizer())
    sizes = tot.sizes("tiny")
    assert len(program.calls) == tot.gen_calls(sizes) == sizes["width"] + 1
    *branches, verdict = program.calls
    assert all(c.deps == () for c in branches)  # the branches start together
    assert verdict.deps == tuple(range(len(branches)))  # the verdict reads every branch
    (chat,) = build_programs(get_workload("multi_turn"), 1, "tiny", 0, _CharTokenizer())
    for i, call in enumerate(chat.calls):
        assert call.deps == tuple(range(i))
        if i:
            previous = chat.calls[i - 1]
            assert call.prompt[: len(previous.prompt)].tolist() == previous.prompt.tolist()
