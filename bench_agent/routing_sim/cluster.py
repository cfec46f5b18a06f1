"""N simulated replicas behind a routing policy, replaying programs' calls.

Each replica keeps a ``RadixCache`` over a pool of ``pool_tokens`` KV slots and is driven
the way forkserve's scheduler drives it: match the prompt (all but its last token), lock
the match, allocate slots for the rest and the answer (evicting least recently used
tokens when short), and when the call ends insert prompt and answer and unlock. A call
that cannot get its slots even after eviction is computed without being cached.

Time: each replica computes its calls' work at one unit per second, shared equally
between the calls it has in flight (processor sharing, a simple stand-in for batching).
A call's work is the prompt tokens it had to compute plus ``decode_weight`` per answer
token. A program's calls start as soon as the calls they depend on end; ``concurrency``
programs run at once and the next starts when one ends. The router sees only what the
gateway sees: what it sent where, and how many calls each replica has in flight.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from bench_agent.routing_sim.policies import Policy
from bench_agent.routing_sim.trace import Call, Program
from radix_cache import RadixCache, SlotAllocator


@dataclass
class _Running:
    call: Call
    program: int
    index: int
    cached: int
    slots: torch.Tensor | None
    node: object


class SimReplica:
    def __init__(self, pool_tokens: int, speed: float = 1.0) -> None:
        self.allocator = SlotAllocator(pool_tokens + 1)  # slot 0 is the padding slot
        self.cache = RadixCache(self.allocator)
        self.speed = speed
        self.clock = 0.0  # real time of the last update
        self.virtual = 0.0  # work each in-flight call has received so far
        self.finishes: list[tuple[float, int]] = []  # (virtual finish, id)
        self.running: dict[int, _Running] = {}
        self.work = 0.0
        self.not_cached = 0

    def advance(self, now: float) -> None:
        if self.finishes:
            self.virtual += (now - self.clock) * self.speed / len(self.finishes)
        self.clock = now

    def next_finish(self) -> float:
        if not self.finishes:
            return math.inf
        return self.clock + (self.finishes[0][0] - self.virtual) * len(self.finishes) / self.speed

    def start(self, rid: int, run: _Running, decode_weight: float) -> None:
        call = run.call
        match = self.cache.match_prefix(call.prompt[:-1])
        run.cached, run.node = match.prefix_len, match.last_node
        self.cache.inc_lock_ref(match.last_node)
        need = len(call.prompt) + len(call.output) - run.cached
        if need > self.allocator.available:
            self.cache.evict(need - self.allocator.available)
        new = self.allocator.alloc(need)
        if new is None:
            self.not_cached += 1
        else:
            run.slots = torch.cat([match.indices, new])
        work = len(call.prompt) - run.cached + decode_weight * len(call.output)
        self.work += work
        self.running[rid] = run
        heapq.heappush(self.finishes, (self.virtual + max(work, 1e-6), rid))

    def pop_finished(self) -> list[_Running]:
        done = []
        while self.finishes and self.finishes[0][0] <= self.virtual + 1e-9:
            _, rid = heapq.heappop(self.finishes)
            run = self.running.pop(rid)
            if run.slots is not None:
                full = np.concatenate([run.call.prompt, run.call.output])
                already = self.cache.insert(full, run.slots)
                self.allocator.free(run.slots[run.cached:already])
            self.cache.dec_lock_ref(run.node)  # type: ignore[arg-type]
            done.append(run)
        return done


@dataclass
class SimResult:
    policy: str
    replicas: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    elapsed: float = 0.0
    work: list[float] = field(default_factory=list)
    not_cached: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / max(1, self.prompt_tokens)

    @property
    def max_over_mean_load(self) -> float:
        mean = sum(self.work) / len(self.work)
        return max(self.work) / mean if mean else 1.0


def simulate(programs: list[Program], policy: Policy, replicas: list[SimReplica], concurrency: int,
             decode_weight: float) -> SimResult:
    result = SimResult(policy.name, len(replicas))
    in_flight = [0] * len(replicas)
    done: dict[int, set[int]] = {}
    started: dict[int, set[int]] = {}
    next_program, open_programs, rid, now = 0, 0, 0, 0.0

    def route_ready(p: int) -> None:
        nonlocal rid
        for i, call in enumerate(programs[p].calls):
            if i not in started[p] and all(d in done[p] for d in call.deps):
                started[p].add(i)
                r = policy.pick(call.prompt, in_flight)
                replicas[r].advance(now)
                run = _Running(call, p, i, 0, None, None)
                replicas[r].start(rid, run, decode_weight)
                in_flight[r] += 1
                result.prompt_tokens += len(call.prompt)
                result.cached_tokens += run.cached
                rid += 1

    def open_next() -> None:
        nonlocal next_program, open_programs
        while open_programs < concurrency and next_program < len(programs):
            done[next_program], started[next_program] = set(), set()
            open_programs += 1
            next_program += 1
            route_ready(next_program - 1)

    open_next()
    while open_programs:
        r = min(range(len(replicas)), key=lambda k: replicas[k].next_finish())
        now = replicas[r].next_finish()
        replicas[r].advance(now)
        for run in replicas[r].pop_finished():
            in_flight[r] -= 1
            done[run.program].add(run.index)
            if len(done[run.program]) == len(programs[run.program].calls):
                open_programs -= 1
                del done[run.program], started[run.program]
            else:
                route_ready(run.program)
        open_next()
    result.elapsed = now
    result.work = [rep.work for rep in replicas]
    result.not_cached = sum(rep.not_cached for rep in replicas)
    for rep in replicas:
        rep.cache.check_invariants()
    return result
