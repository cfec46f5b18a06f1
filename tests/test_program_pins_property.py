"""Stateful property test: program pins over a real RadixCache, against a brute-force model.

Programs pin prefixes that often coincide (a 3-letter alphabet, short sequences), so two
programs regularly pin the same node, one pins a descendant of another's node, and nodes
split under pins. The model is each program's set of pinned prefixes; after every step the
tree's locks must be exactly those pins (protected tokens = the union of pinned paths), and
the pinned-token count that union too (a prefix several programs pin counts once).
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radix_cache import RadixCache, SlotAllocator
from runtime.scheduler.program_pins import ProgramPins

PROGRAMS = st.sampled_from(["a", "b", "c"])
TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=8)


def path(node) -> tuple[int, ...]:
    out: list[int] = []
    while not node.is_root:
        out[:0] = node.key.tolist()
        node = node.parent
    return tuple(out)


class PinsMachine(RuleBasedStateMachine):
    CAPACITY = 200

    def __init__(self) -> None:
        super().__init__()
        self.allocator = SlotAllocator(self.CAPACITY + 1)
        self.tree = RadixCache(self.allocator, page_size=1)
        self.pins = ProgramPins(self.tree, self.CAPACITY, max_fraction=0.06)  # 12 tokens: the cap is met often
        self.model: dict[str, set[tuple[int, ...]]] = {}  # program -> pinned prefixes
        self.runs: dict[str, int] = {}  # each name's ended runs: a run's id is the name and this count

    def _id(self, program: str) -> str:
        return f"{program}{self.runs.get(program, 0)}"

    @rule(tokens=TOKENS)
    def cache(self, tokens: list[int]) -> None:
        """A request finishes: its tokens go into the tree (as the scheduler hands them over)."""
        slots = self.allocator.alloc(len(tokens))
        if slots is None:
            self.tree.evict(len(tokens))
            slots = self.allocator.alloc(len(tokens))
            if slots is None:
                return
        kept = self.tree.insert(tokens, slots)
        self.allocator.free(slots[:kept])  # the tree already had those tokens' slots

    @rule(program=PROGRAMS, tokens=TOKENS)
    def pin(self, program: str, tokens: list[int]) -> None:
        program = self._id(program)
        match = self.tree.match_prefix(tokens)
        prefix = tuple(tokens[: match.prefix_len])
        after = self._union() | {prefix[:j] for j in range(1, len(prefix) + 1)}
        mine = self.model.get(program, set())
        replaced = {p for p in mine if len(p) < len(prefix) and prefix[: len(p)] == p}
        pinned = self.pins.pin(program, tokens)
        assert pinned == (bool(prefix) and (prefix in mine or len(after) <= self.pins.max_locked))
        if pinned and prefix not in mine:
            self.model[program] = (mine - replaced) | {prefix}

    @rule(program=PROGRAMS)
    def end(self, program: str) -> None:
        assert self.pins.end(self._id(program)) == len(self.model.pop(self._id(program), set()))
        self.runs[program] = self.runs.get(program, 0) + 1

    @rule(program=PROGRAMS, tokens=TOKENS)
    def pin_after_the_end(self, program: str, tokens: list[int]) -> None:
        """A request of a program that has ended finishes (its client did not wait for it)."""
        if self.runs.get(program):
            assert not self.pins.pin(f"{program}{self.runs[program] - 1}", tokens)

    @rule()
    def release_oldest(self) -> None:
        oldest = next(iter(self.pins.pins), None)
        assert self.pins.release_oldest() == (oldest is not None)
        if oldest is not None:
            self.model.pop(oldest, None)

    @rule(k=st.integers(0, 30))
    def evict(self, k: int) -> None:
        self.tree.evict(k)

    def _union(self) -> set[tuple[int, ...]]:
        """Every token of a pinned path, each as the prefix that ends at it."""
        return {prefix[:j] for prefixes in self.model.values() for prefix in prefixes for j in range(1, len(prefix) + 1)}

    @invariant()
    def pins_are_the_models_and_the_trees_locks(self) -> None:
        got = {p: {path(n) for n in nodes} for p, nodes in self.pins.pins.items()}
        assert got == {p: prefixes for p, prefixes in self.model.items() if prefixes}
        for nodes in self.pins.pins.values():
            assert all(length == len(path(n)) for n, length in nodes.items())
        union = self._union()
        assert self.pins.pinned_tokens == len(union)
        assert self.tree.protected_size == len(union), "every pinned path locked, nothing else"
        for prefixes in self.model.values():  # pinned prefixes are still cached
            for prefix in prefixes:
                assert self.tree.match_prefix(list(prefix)).prefix_len == len(prefix)
        self.tree.check_invariants()


PinsMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestProgramPins = PinsMachine.TestCase


def test_two_programs_pinning_one_node_each_release_their_own_lock():
    allocator = SlotAllocator(65)
    tree = RadixCache(allocator, page_size=1)
    tree.insert([1, 2, 3], allocator.alloc(3))
    pins = ProgramPins(tree, 64)
    assert pins.pin("a", [1, 2, 3]) and pins.pin("b", [1, 2, 3])
    assert pins.pinned_tokens == 3 and tree.protected_size == 3  # one shared prefix: kept once, counted once
    assert pins.end("a") == 1 and tree.protected_size == 3  # b's lock holds
    assert pins.end("b") == 1 and tree.protected_size == 0 and pins.pinned_tokens == 0
    assert torch.equal(tree.match_prefix([1, 2, 3]).indices, tree.match_prefix([1, 2, 3, 4]).indices)


def test_programs_sharing_a_system_prompt_count_it_once_against_the_cap():
    """Ten agent programs on one 40-token system prompt pin 10 * 42 tokens if each counts the
    shared path (past a cap of 64: most were refused); kept once, it counts once."""
    allocator = SlotAllocator(257)
    tree = RadixCache(allocator, page_size=1)
    system, other = list(range(100, 140)), list(range(200, 210))
    for ids in [system + [k, k] for k in range(10)] + [other]:
        slots = allocator.alloc(len(ids))
        allocator.free(slots[: tree.insert(ids, slots)])  # the tree already had those tokens' slots
    pins = ProgramPins(tree, 128)  # cap: 64 tokens
    assert all(pins.pin(f"p{k}", system + [k, k]) for k in range(10))
    assert pins.pinned_tokens == 40 + 10 * 2 == tree.protected_size
    assert not pins.pin("p10", other)  # 60 + 10 would pass the cap


def test_a_program_idle_past_the_timeout_loses_its_pins_and_may_pin_again():
    """A client that died without ending its program: its pins go once no request of it has
    finished for the timeout; an active one keeps them."""
    now = [0.0]
    allocator = SlotAllocator(65)
    tree = RadixCache(allocator, page_size=1)
    tree.insert([1, 2, 3, 4], allocator.alloc(4))
    pins = ProgramPins(tree, 64, idle_timeout=10.0, clock=lambda: now[0])
    assert pins.pin("dead", [1, 2]) and pins.pin("alive", [1, 2, 3])
    now[0] = 8.0
    assert pins.pin("alive", [1, 2, 3, 4])
    now[0] = 10.5
    assert pins.release_idle() == 1 and set(pins.pins) == {"alive"}
    assert tree.protected_size == 4 and pins.pinned_tokens == 4
    assert pins.pin("dead", [1, 2]) and set(pins.pins) == {"alive", "dead"}  # not ended: it may come back
    now[0] = 30.0
    assert pins.release_idle() == 2 and tree.protected_size == 0 and pins.pinned_tokens == 0
    assert ProgramPins(tree, 64).release_idle() == 0  # no timeout: never
