"""What the scheduler reports to ``/get_server_info`` and ``/metrics``.

Queue lengths, the KV pool's accounting (the terms of the pool's invariant: free + evictable
+ protected + held by requests = capacity) and where the steps' time went (``step_*``, see
``step_stats.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.scheduler.scheduler import Scheduler


def scheduler_report(sched: Scheduler) -> dict[str, int | float]:
    """One snapshot of ``sched``'s queues, KV pool and step totals."""
    return {
        "num_running_reqs": len(sched.admitted()),
        "num_waiting_reqs": len(sched.waiting) + len(sched.grammars),
        "num_grammar_queue_reqs": len(sched.grammars),
        "num_waiting_tokens": sum(len(r.input_ids) + len(r.output_ids) for r in sched.waiting),
        "kv_capacity": sched.allocator.capacity,
        "kv_free": sched.allocator.available,
        "kv_evictable": sched.tree.evictable_size,
        "kv_protected": sched.tree.protected_size,
        "kv_held_by_requests": sched.held_slots(),
        "kv_peak_in_use": sched.kv_peak_in_use,
        "num_retractions": sched.send_back.num_retractions,
        "num_rows_yielded": sched.send_back.num_rows_yielded,
        "num_pinned_programs": len(sched.pins.pins),
        "num_prefill_tokens": sched.num_prefill_tokens,
        "num_forward_steps": sched.num_forward_steps,
        "num_jumped_tokens": sched.num_jumped_tokens,
        **{f"step_{k}": v for k, v in sched.steps.as_dict().items()},
        **(sched.speculator.stats() if sched.speculator is not None else {}),
    }
