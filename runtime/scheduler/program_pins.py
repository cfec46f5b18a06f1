"""Program-aware caching: keep a running program's conversation in the radix cache.

An agent program calls the server many times; between its calls, other traffic may push
its prefix out of an LRU cache, and the next call recomputes it. While a program runs,
each of its finished requests pins the tree node its tokens end at (a lock, as a running
request holds), so the program's prefixes cannot be evicted. A newer pin on a descendant
replaces the pin on its ancestor (the lock covers the whole path). ``end`` releases them.

Pins are a priority, never a reason to fail: a pin that would take the pinned tokens (the
distinct tokens on the pinned paths: a system prompt many programs share counts once) past
``max_fraction`` of the pool is not taken, and when the scheduler cannot admit work,
or the running requests need slots for their next tokens, the oldest program's pins are
dropped (``release_oldest``; for the latter, before a running request is sent back to the
queue). A program that has ended pins nothing more: a request of it that was still running
(its client was interrupted, and ended the program without waiting) finishes unpinned. A
program none of whose requests has finished for ``idle_timeout`` seconds loses its pins
(``release_idle``): its client may have died without ending it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

from radix_cache import RadixCache, TreeNode

_REMEMBERED_ENDS = 65_536


class ProgramPins:
    def __init__(self, tree: RadixCache, capacity: int, max_fraction: float = 0.5, idle_timeout: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tree = tree
        self.max_locked = int(capacity * max_fraction)
        self.idle_timeout = idle_timeout  # 0: never
        self.clock = clock
        self.last_pinned: OrderedDict[str, float] = OrderedDict()  # program -> when, least recent first
        # program -> its pinned nodes, each with the tokens on its path; oldest program first.
        # Programs that share a prefix may pin the same node: each holds its own lock on it.
        self.pins: dict[str, dict[TreeNode, int]] = {}
        # the programs ended most recently (ids are unique per run; a bounded memory of them)
        self.ended: OrderedDict[str, None] = OrderedDict()

    @property
    def pinned_tokens(self) -> int:
        """The distinct tokens the pins keep (every path from a pinned node to the root),
        counted by the tree (``pin_ref``, which a split copies as it copies locks)."""
        return self.tree.pinned_size

    @property
    def num_pinned_nodes(self) -> int:
        return sum(len(nodes) for nodes in self.pins.values())

    def pin(self, program_id: str, token_ids: Sequence[int], namespace: Hashable = None) -> bool:
        """Pin the cached prefix of ``token_ids`` for ``program_id``; False if not pinned."""
        if self.tree.disable or not token_ids or program_id in self.ended:
            return False
        if self.idle_timeout:
            self.last_pinned[program_id] = self.clock()
            self.last_pinned.move_to_end(program_id)
        match = self.tree.match_prefix(token_ids, namespace)
        node, length = match.last_node, match.prefix_len
        if node.is_root:
            return False
        nodes = self.pins.setdefault(program_id, {})
        if node in nodes:
            return True
        ancestors = _ancestors(node)
        replaced = [n for n in nodes if n in ancestors]  # on the new path: still kept by it
        # The cap counts pinned tokens only (not requests' own transient locks), each once.
        if self.tree.pinned_size + self.tree.unpinned_len(node) > self.max_locked:
            if not nodes:
                del self.pins[program_id]
            return False
        self.tree.inc_lock_ref(node, pin=True)
        for old in replaced:
            self.tree.dec_lock_ref(old, pin=True)
            nodes.pop(old)
        nodes[node] = length
        return True

    def end(self, program_id: str) -> int:
        """Release every pin of ``program_id``; returns how many nodes were released."""
        self.ended[program_id] = None
        if len(self.ended) > _REMEMBERED_ENDS:
            self.ended.popitem(last=False)
        return self._release(program_id)

    def release_oldest(self) -> bool:
        """Drop the oldest program's pins (memory is short); it runs on, and may pin again."""
        if not self.pins:
            return False
        self._release(next(iter(self.pins)))
        return True

    def release_idle(self) -> int:
        """Drop the pins of programs idle past ``idle_timeout``; returns how many programs."""
        if not self.idle_timeout:
            return 0
        oldest = self.clock() - self.idle_timeout
        released = 0
        while self.last_pinned and next(iter(self.last_pinned.values())) < oldest:
            program_id, _ = self.last_pinned.popitem(last=False)
            released += self._release(program_id) > 0
        return released

    def _release(self, program_id: str) -> int:
        self.last_pinned.pop(program_id, None)
        nodes = self.pins.pop(program_id, {})
        for node in nodes:
            self.tree.dec_lock_ref(node, pin=True)
        return len(nodes)

    def release_all(self) -> None:
        while self.release_oldest():
            pass


def _ancestors(node: TreeNode) -> set[TreeNode]:
    out = set()
    parent = node.parent
    while parent is not None:
        out.add(parent)
        parent = parent.parent
    return out
