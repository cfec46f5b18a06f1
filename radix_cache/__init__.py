"""KV slot bookkeeping: the radix prefix cache, the slot allocator and the request-to-token table.

Pure CPU data structures (torch CPU tensors and numpy); importable anywhere.
"""

from radix_cache.radix_tree import MatchResult, RadixCache, TreeNode
from radix_cache.req_to_token import ReqToTokenTable
from radix_cache.slot_allocator import SlotAllocator

__all__ = ["MatchResult", "RadixCache", "ReqToTokenTable", "SlotAllocator", "TreeNode"]
