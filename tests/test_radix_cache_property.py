"""Stateful property test: RadixCache + SlotAllocator against a brute-force reference.

The reference is a dict ``(namespace, prefix tuple) -> slot tuple`` holding every cached
whole-page prefix. Token ids come from a 4-letter alphabet so that prefixes collide (and
nodes split) often, and the pool is small so that inserts have to evict.

Eviction order is not modelled exactly: after the tree evicts, the test checks that what it
kept agrees with the reference, that it dropped no locked prefix, that the number of freed
slots equals the tokens the reference loses, and then drops those prefixes from the
reference. LRU order itself is pinned down by the unit tests.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radix_cache import RadixCache, SlotAllocator

NAMESPACES = st.sampled_from([None, None, None, "other"])
Key = tuple  # (namespace, prefix tuple)


def dump_tree(cache: RadixCache) -> dict[Key, tuple]:
    """Every cached whole-page prefix and its slots, read from the nodes without touching
    access times (match_prefix would refresh them)."""
    out: dict[Key, tuple] = {}
    ps = cache.page_size
    stack = [(ns, root, (), ()) for ns, root in cache._roots.items()]
    while stack:
        ns, node, toks, slots = stack.pop()
        for child in node.children.values():
            ctoks = toks + tuple(child.key.tolist())
            cslots = slots + tuple(child.value.tolist())
            for j in range(len(toks) + ps, len(ctoks) + 1, ps):
                out[(ns, ctoks[:j])] = cslots[:j]
            stack.append((ns, child, ctoks, cslots))
    return out


def path_len(node) -> int:
    n = 0
    while not node.is_root:
        n += len(node)
        node = node.parent
    return n


class RadixMachine(RuleBasedStateMachine):
    PAGE_SIZE = 1
    CAPACITY = 40

    def __init__(self) -> None:
        super().__init__()
        self.allocator = SlotAllocator(self.CAPACITY + 1)
        self.cache = RadixCache(self.allocator, page_size=self.PAGE_SIZE)
        self.ps = self.PAGE_SIZE
        self.ref: dict[Key, tuple] = {}
        self.locks: list[tuple] = []  # (node, namespace, locked prefix tuple)
        self.held: list[torch.Tensor] = []  # slots the test holds outside the tree
        self.seen: list[tuple] = []  # inserted sequences, to build colliding queries from

    # ------------------------------------------------------------------ reference
    def longest(self, ns, tokens) -> int:
        """Length of the longest cached prefix of ``tokens`` in the reference."""
        j = 0
        while j + self.ps <= len(tokens) and (ns, tuple(tokens[: j + self.ps])) in self.ref:
            j += self.ps
        return j

    def ref_slots(self, ns, tokens, j) -> tuple:
        return self.ref[(ns, tuple(tokens[:j]))] if j else ()

    def locked_prefixes(self) -> set[Key]:
        out = set()
        for _, ns, prefix in self.locks:
            for j in range(self.ps, len(prefix) + 1, self.ps):
                out.add((ns, prefix[:j]))
        return out

    def num_held(self) -> int:
        return sum(t.numel() for t in self.held)

    def check_match(self, m, ns, tokens) -> int:
        exp = self.longest(ns, tokens)
        assert m.prefix_len == exp, f"matched {m.prefix_len}, reference has {exp}"
        assert tuple(m.indices.tolist()) == self.ref_slots(ns, tokens, exp)
        assert path_len(m.last_node) == exp  # the node ends exactly at the match
        return exp

    # ------------------------------------------------------------------ helpers
    def draw_tokens(self, data) -> list[int]:
        """Random tokens, half the time extending a cut of an inserted sequence, so that
        queries often end inside an existing edge (splits) or extend a cached path."""
        tokens: list[int] = []
        if self.seen and data.draw(st.booleans(), label="reuse a seen prefix"):
            base = data.draw(st.sampled_from(self.seen), label="seen")
            tokens = list(base[: data.draw(st.integers(0, len(base)), label="cut")])
        tokens += data.draw(st.lists(st.integers(0, 3), max_size=12 - len(tokens)), label="suffix")
        return tokens

    def evict_and_check(self, k: int) -> int:
        available = self.allocator.available
        evictable = self.cache.evictable_size
        freed = self.cache.evict(k)
        after = dump_tree(self.cache)
        assert self.allocator.available == available + freed
        for key, slots in after.items():
            assert self.ref.get(key) == slots, f"eviction changed {key}"
        removed = set(self.ref) - set(after)
        assert freed == self.ps * len(removed)
        assert not removed & self.locked_prefixes(), "a locked prefix was evicted"
        assert freed >= min(k, evictable), "evicted less than asked while more was evictable"
        if k == 0:
            assert freed == 0
        for key in removed:
            del self.ref[key]
        return freed

    def alloc(self, n: int) -> torch.Tensor | None:
        """Allocate like a scheduler: evict the shortfall when the pool is short."""
        slots = self.allocator.alloc(n)
        if slots is None:
            self.evict_and_check(n - self.allocator.available)
            slots = self.allocator.alloc(n)
        return slots

    # ------------------------------------------------------------------ rules
    @rule(data=st.data(), ns=NAMESPACES, reuse_match=st.booleans())
    def insert(self, data, ns, reuse_match):
        """A request finishing: its slots are offered to the tree. With ``reuse_match`` the
        request started from a cache hit (match, lock, allocate the rest), as a scheduler does."""
        tokens = self.draw_tokens(data)
        self.seen = [*self.seen[-15:], tuple(tokens)]
        prefix = torch.empty(0, dtype=torch.int64)
        lock = None
        if reuse_match:
            m = self.cache.match_prefix(tokens, namespace=ns)
            self.check_match(m, ns, tokens)
            self.cache.inc_lock_ref(m.last_node)
            lock = (m.last_node, ns, tuple(tokens[: m.prefix_len]))
            self.locks.append(lock)
            prefix = m.indices
        new = self.alloc(len(tokens) - prefix.numel())
        if new is not None:
            slots = torch.cat([prefix, new])
            expected = self.longest(ns, tokens)
            p = self.cache.insert(tokens, slots, namespace=ns)
            assert p == expected, f"insert returned {p}, reference has {expected} cached"
            assert p >= prefix.numel()
            a = len(tokens) - len(tokens) % self.ps
            base = self.ref_slots(ns, tokens, p)
            for j in range(p + self.ps, a + 1, self.ps):
                self.ref[(ns, tuple(tokens[:j]))] = base + tuple(slots[p:j].tolist())
            # The caller frees its duplicates of the cached part (not the tree's own slots)
            # and the unaligned tail.
            self.allocator.free(torch.cat([slots[prefix.numel() : p], slots[a:]]))
        if lock is not None:
            self.cache.dec_lock_ref(lock[0])
            self.locks.remove(lock)

    @rule(data=st.data(), ns=NAMESPACES)
    def match(self, data, ns):
        tokens = self.draw_tokens(data)
        m = self.cache.match_prefix(tokens, namespace=ns)
        self.check_match(m, ns, tokens)

    @rule(data=st.data(), ns=NAMESPACES)
    def lock(self, data, ns):
        tokens = self.draw_tokens(data)
        m = self.cache.match_prefix(tokens, namespace=ns)
        exp = self.check_match(m, ns, tokens)
        self.cache.inc_lock_ref(m.last_node)
        self.locks.append((m.last_node, ns, tuple(tokens[:exp])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data):
        i = data.draw(st.integers(0, len(self.locks) - 1), label="lock")
        node, _, _ = self.locks.pop(i)
        self.cache.dec_lock_ref(node)

    @rule(k=st.integers(0, 30))
    def evict(self, k):
        self.evict_and_check(k)

    @rule(n=st.integers(1, 6))
    def hold(self, n):
        """A running request takes decode slots that are not in the tree."""
        slots = self.alloc(n)
        if slots is not None:
            self.held.append(slots)

    @precondition(lambda self: self.held)
    @rule()
    def release(self):
        self.allocator.free(self.held.pop(0))

    @rule()
    def reset(self):
        if self.locked_prefixes():  # (a lock on a namespace root protects nothing)
            total = self.cache.total_size
            try:
                self.cache.reset()
            except RuntimeError:
                assert self.cache.total_size == total
            else:
                raise AssertionError("reset succeeded while paths were locked")
        else:
            self.cache.reset()
            self.ref.clear()
            assert self.allocator.available == self.allocator.capacity - self.num_held()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def agrees_with_reference(self):
        self.cache.check_invariants(num_held_outside=self.num_held())
        assert dump_tree(self.cache) == self.ref
        assert self.cache.total_size == self.ps * len(self.ref)
        assert self.cache.protected_size == self.ps * len(self.locked_prefixes())

    def teardown(self):
        for node, _, _ in self.locks:
            self.cache.dec_lock_ref(node)
        self.cache.reset()
        for slots in self.held:
            self.allocator.free(slots)
        assert self.allocator.available == self.allocator.capacity


class PagedRadixMachine(RadixMachine):
    PAGE_SIZE = 2


_settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestRadixCachePage1 = RadixMachine.TestCase
TestRadixCachePage1.settings = _settings
TestRadixCachePage2 = PagedRadixMachine.TestCase
TestRadixCachePage2.settings = _settings
