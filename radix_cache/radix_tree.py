"""A token-level radix tree mapping token prefixes to the KV slots that hold them.

Every edge carries a run of token ids (``key``) and, aligned with it, the KV slot of each of
those tokens (``value``). A path from the root spells a cached prefix; its values, joined,
are the slots of that prefix's K/V. Requests that share a prefix share the slots.

Splitting: a match (or an insert) that ends inside an edge splits it, so that every prefix
a request uses ends exactly at a node that can be locked::

    before: match [a b c x] against            after the split:
                                                    (root)
        (root)                                        |
          |  key=[a b c d e]                          |  key=[a b c]   <- new node, takes the
          |  val=[7 8 9 4 5]                          |  val=[7 8 9]      child's lock_ref
        (leaf)                                      (mid)
                                                      |  key=[d e]
                                                      |  val=[4 5]
                                                   (leaf)

    match_prefix returns slots [7 8 9] and last_node = mid.

Accounting: every cached token is either *evictable* (its node has ``lock_ref == 0``) or
*protected* (some running request holds a lock on the node or a descendant). Locks are
taken on a node and count on every ancestor up to the root, so a locked node's whole path
stays cached. Eviction removes least-recently-used unlocked leaves, and a parent left
without children becomes an evictable leaf in turn. Some locks are also *pins* (a program's
cached conversation, ``runtime/scheduler/program_pins.py``; ``inc_lock_ref(node, pin=True)``):
``pin_ref`` counts them the same way, so ``pinned_size`` is the distinct tokens they keep, a
shared prefix once.

Namespaces (like SGLang's ``extra_key``): each namespace has its own root, so requests in
different namespaces (tenants, LoRA adapters) never share a node.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from radix_cache.slot_allocator import SlotAllocator
from radix_cache.validation import as_index_tensor, as_token_array

_EMPTY_SLOTS = torch.empty(0, dtype=torch.int64)


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "pin_ref", "last_access", "node_id")

    _ids = itertools.count()

    def __init__(self, parent: TreeNode | None, key: np.ndarray, value: torch.Tensor) -> None:
        self.children: dict[Hashable, TreeNode] = {}
        self.parent = parent
        self.key = key
        self.value = value
        self.lock_ref = 0
        self.pin_ref = 0  # how many of the locks through this node are pins
        self.last_access = 0
        self.node_id = next(TreeNode._ids)

    @property
    def is_root(self) -> bool:
        return self.parent is None

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.node_id}, len={len(self.key)}, lock_ref={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult:
    """``indices``: the slots of the matched prefix (int64, may be empty).
    ``last_node``: the node where the match ends; lock it to keep ``indices`` valid."""

    indices: torch.Tensor
    last_node: TreeNode

    @property
    def prefix_len(self) -> int:
        return self.indices.numel()


class RadixCache:
    """The prefix cache. It owns the slots stored in its nodes; everything else belongs to
    whoever allocated it.

    Args:
        allocator: where evicted slots go back to.
        page_size: matches and inserts are whole pages of this many tokens.
        disable: keep the interface but never reuse anything (every match is empty and
            inserted slots go straight back to the allocator).
    """

    def __init__(self, allocator: SlotAllocator, page_size: int = 1, disable: bool = False) -> None:
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
        self.allocator = allocator
        self.page_size = page_size
        self.disable = disable
        self.reset_tree()

    # ------------------------------------------------------------------ state
    def reset_tree(self) -> None:
        self._roots: dict[Hashable, TreeNode] = {}
        self._namespace_of: dict[TreeNode, Hashable] = {}  # root -> its namespace
        self._evictable_leaves: set[TreeNode] = set()
        self._evictable_size = 0
        self._protected_size = 0
        self._pinned_size = 0
        self._clock = itertools.count(1)

    def reset(self) -> None:
        """Drop every cached prefix, giving its slots back to the allocator.

        Refuses (``RuntimeError``) while any path is locked: running requests still read
        those slots.
        """
        if self._protected_size:
            raise RuntimeError(f"cannot reset: {self._protected_size} cached tokens are locked by running requests")
        values = [n.value for n in self._iter_nodes() if not n.is_root]
        if values:
            self.allocator.free(torch.cat(values))
        self.reset_tree()

    @property
    def evictable_size(self) -> int:
        return self._evictable_size

    @property
    def protected_size(self) -> int:
        return self._protected_size

    @property
    def pinned_size(self) -> int:
        """The distinct tokens on pinned paths (``inc_lock_ref(node, pin=True)``)."""
        return self._pinned_size

    @property
    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def aligned_len(self, n: int) -> int:
        """The longest whole-page length not above ``n``."""
        return n - n % self.page_size

    # ------------------------------------------------------------------ match
    def match_prefix(self, token_ids: object, namespace: Hashable = None) -> MatchResult:
        """The slots of the longest cached prefix of ``token_ids`` (whole pages only).

        May: split the node where the match ends, refresh access times along the path.
        Never: frees or allocates slots, changes lock counts or sizes.
        """
        key = as_token_array(token_ids)
        root = self._root(namespace, create=False)
        if self.disable:
            return MatchResult(_EMPTY_SLOTS, root)
        now = next(self._clock)
        node, pos, values = root, 0, []
        node.last_access = now
        end = self.aligned_len(len(key))
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                break
            n = self._common_len(child.key, key[pos:end])
            ends_inside = n < len(child)
            if ends_inside:
                child = self._split(child, n)
            child.last_access = now  # after the split: the unmatched tail was not used
            values.append(child.value)
            node, pos = child, pos + n
            if ends_inside:
                break
        indices = torch.cat(values) if values else _EMPTY_SLOTS
        return MatchResult(indices, node)

    # ------------------------------------------------------------------ insert
    def insert(self, token_ids: object, indices: object, namespace: Hashable = None) -> int:
        """Cache ``indices`` as the slots of ``token_ids``; return the length already cached.

        Only whole pages are inserted. With ``p`` the return value and ``a`` the aligned
        length: the tree takes ownership of ``indices[p:a]``; the caller keeps ``indices[:p]``
        (duplicates of slots the tree already has, unless they are those very slots) and
        ``indices[a:]``. With ``disable=True`` the tree keeps nothing and frees
        ``indices[:a]`` itself, returning 0.
        May: split nodes, add one leaf, refresh access times. Never: evicts or changes locks.
        """
        key = as_token_array(token_ids)
        value = as_index_tensor(indices)
        if len(key) != value.numel():
            raise ValueError(f"token_ids has {len(key)} tokens but indices has {value.numel()} slots")
        end = self.aligned_len(len(key))
        if self.disable:
            self.allocator.free(value[:end])
            return 0
        now = next(self._clock)
        node, pos = self._root(namespace, create=end > 0), 0  # nothing to cache: no root kept
        node.last_access = now
        while pos < end:
            child = node.children.get(self._child_key(key, pos))
            if child is None:
                self._add_leaf(node, key[pos:end], value[pos:end].clone(), now)
                return pos
            n = self._common_len(child.key, key[pos:end])
            if n < len(child):
                child = self._split(child, n)
            child.last_access = now  # after the split: the tail past the fork was not used
            node, pos = child, pos + n
        return pos

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node: TreeNode, pin: bool = False) -> None:
        """Lock ``node`` and its ancestors: none of them can be evicted until unlocked.
        ``pin``: the lock is a program's pin, counted in ``pinned_size`` too."""
        while not node.is_root:
            if node.lock_ref == 0:
                self._evictable_size -= len(node)
                self._protected_size += len(node)
                self._evictable_leaves.discard(node)
            node.lock_ref += 1
            if pin:
                if node.pin_ref == 0:
                    self._pinned_size += len(node)
                node.pin_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: TreeNode, pin: bool = False) -> None:
        """Undo one ``inc_lock_ref(node, pin)``. Unlocking an unlocked (or unpinning an
        unpinned) node raises."""
        while not node.is_root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref on unlocked {node}")
            if pin and node.pin_ref <= 0:
                raise RuntimeError(f"dec_lock_ref(pin=True) on unpinned {node}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable_size += len(node)
                self._protected_size -= len(node)
                if not node.children:
                    self._evictable_leaves.add(node)
            if pin:
                node.pin_ref -= 1
                if node.pin_ref == 0:
                    self._pinned_size -= len(node)
            node = node.parent  # type: ignore[assignment]

    def unpinned_len(self, node: TreeNode) -> int:
        """The tokens a pin on ``node`` would add to ``pinned_size``: its path's up to the
        first pinned node."""
        n = 0
        while not node.is_root and node.pin_ref == 0:
            n += len(node)
            node = node.parent  # type: ignore[assignment]
        return n

    # ------------------------------------------------------------------ evict
    def evict(self, num_tokens: int) -> int:
        """Free least-recently-used unlocked leaves until ``num_tokens`` are freed.

        Frees whole nodes, so it may free more than asked; frees less only when nothing
        evictable is left. ``evict(0)`` is a no-op. Returns the number of slots freed.
        """
        if not isinstance(num_tokens, int) or num_tokens < 0:
            raise ValueError(f"num_tokens must be a non-negative integer, got {num_tokens!r}")
        heap = [(n.last_access, n.node_id, n) for n in self._evictable_leaves]
        heapq.heapify(heap)
        freed, values = 0, []
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = self._remove_leaf(leaf)
            values.append(leaf.value)
            freed += len(leaf)
            if not parent.is_root and parent.lock_ref == 0 and not parent.children:
                heapq.heappush(heap, (parent.last_access, parent.node_id, parent))
        if values:
            self.allocator.free(torch.cat(values))
        return freed

    # ------------------------------------------------------------------ checks
    def check_invariants(self, num_held_outside: int = 0) -> None:
        """Raise ``AssertionError`` if the bookkeeping is inconsistent.

        Checks the tree's own structure and sizes and, for the whole pool,
        ``available + evictable + protected + num_held_outside == capacity`` where
        ``num_held_outside`` counts slots owned by running requests and not in the tree.
        """
        evictable = protected = pinned = 0
        leaves: set[TreeNode] = set()
        values = []
        for node in self._iter_nodes():
            for ck, child in node.children.items():
                assert child.parent is node, f"{child} has the wrong parent"
                assert ck == self._child_key(child.key, 0), f"{child} is filed under the wrong key"
                assert len(child.key) == child.value.numel() > 0, f"{child} has key/value length mismatch"
                assert len(child.key) % self.page_size == 0, f"{child} is not page aligned"
                assert child.lock_ref <= node.lock_ref or node.is_root, f"{child} locked more than its parent"
                assert child.pin_ref <= node.pin_ref or node.is_root, f"{child} pinned more than its parent"
            if node.is_root:
                continue
            assert node.lock_ref >= 0, f"{node} has a negative lock_ref"
            assert 0 <= node.pin_ref <= node.lock_ref, f"{node} has pins that are not locks"
            pinned += len(node) if node.pin_ref else 0
            values.append(node.value)
            if node.lock_ref:
                protected += len(node)
            else:
                evictable += len(node)
                if not node.children:
                    leaves.add(node)
        assert evictable == self._evictable_size, f"evictable_size {self._evictable_size} != actual {evictable}"
        assert protected == self._protected_size, f"protected_size {self._protected_size} != actual {protected}"
        assert leaves == self._evictable_leaves, "the evictable-leaf set is stale"
        assert pinned == self._pinned_size, f"pinned_size {self._pinned_size} != actual {pinned}"
        if values:
            slots = torch.cat(values)
            assert torch.unique(slots).numel() == slots.numel(), "a KV slot is cached twice"
            assert not bool(self.allocator.is_free(slots).any()), "a cached KV slot is also free"
        total = self.allocator.available + evictable + protected + num_held_outside
        assert total == self.allocator.capacity, (
            f"KV slot leak: available {self.allocator.available} + evictable {evictable} + "
            f"protected {protected} + held by requests {num_held_outside} = {total} "
            f"!= capacity {self.allocator.capacity}"
        )

    # ------------------------------------------------------------------ internals
    def _root(self, namespace: Hashable, create: bool = True) -> TreeNode:
        """The namespace's root; a namespace with nothing cached has none kept (a lookup gets
        an empty stand-in), so one-off namespaces (a fresh ``cache_salt`` per request) do not
        pile up."""
        root = self._roots.get(namespace)
        if root is None:
            root = TreeNode(None, np.empty(0, np.int64), _EMPTY_SLOTS)
            if create:
                self._roots[namespace] = root
                self._namespace_of[root] = namespace
        return root

    def _child_key(self, key: np.ndarray, pos: int) -> Hashable:
        if self.page_size == 1:
            return int(key[pos])
        return tuple(key[pos : pos + self.page_size].tolist())

    def _common_len(self, a: np.ndarray, b: np.ndarray) -> int:
        """Length of the common prefix of ``a`` and ``b``, rounded down to whole pages."""
        n = min(len(a), len(b))
        diff = np.flatnonzero(a[:n] != b[:n])
        common = int(diff[0]) if diff.size else n
        return self.aligned_len(common)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child``'s edge after ``n`` tokens; return the new node holding the first part."""
        parent = child.parent
        assert parent is not None and 0 < n < len(child)
        mid = TreeNode(parent, child.key[:n], child.value[:n])
        mid.lock_ref, mid.pin_ref = child.lock_ref, child.pin_ref
        mid.last_access = child.last_access
        parent.children[self._child_key(child.key, 0)] = mid
        child.parent, child.key, child.value = mid, child.key[n:], child.value[n:]
        mid.children[self._child_key(child.key, 0)] = child
        return mid

    def _add_leaf(self, parent: TreeNode, key: np.ndarray, value: torch.Tensor, now: int) -> None:
        leaf = TreeNode(parent, key, value)
        leaf.last_access = now
        parent.children[self._child_key(key, 0)] = leaf
        self._evictable_leaves.discard(parent)
        self._evictable_leaves.add(leaf)
        self._evictable_size += len(leaf)

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        parent = leaf.parent
        assert parent is not None and not leaf.children and leaf.lock_ref == 0
        del parent.children[self._child_key(leaf.key, 0)]
        self._evictable_leaves.discard(leaf)
        self._evictable_size -= len(leaf)
        if not parent.is_root and parent.lock_ref == 0 and not parent.children:
            self._evictable_leaves.add(parent)
        elif parent.is_root and not parent.children and parent in self._namespace_of:  # an emptied namespace
            del self._roots[self._namespace_of.pop(parent)]
        return parent

    def _iter_nodes(self) -> Iterator[TreeNode]:
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
