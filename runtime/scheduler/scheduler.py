"""The scheduler: decides each step's batch, runs it on the worker, applies the results.

The loop (``step``) is: pick a batch (prefill wins when it has work, else decode), run it,
process the results (append tokens, stop checks, hand finished requests' KV to the tree).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from radix_cache import RadixCache, SlotAllocator
from runtime.config import ServerArgs
from runtime.constrained.backend import GrammarBackend
from runtime.executor.worker import BatchResult, ModelWorker
from runtime.scheduler.batch import ScheduledBatch, decode_batch, extend_batch, lower
from runtime.scheduler.cache_manager import CacheManager
from runtime.scheduler.grammar_queue import GrammarQueue
from runtime.scheduler.jump_forward import is_eligible, jump_forward
from runtime.scheduler.policy import order_waiting, shares_uncached_prefix
from runtime.scheduler.prefill_budget import PrefillBudget
from runtime.scheduler.program_pins import ProgramPins
from runtime.scheduler.req import Req
from runtime.scheduler.row_sharing import Hog, call_that_may_yield, yields_to
from runtime.scheduler.scheduler_stats import scheduler_report
from runtime.scheduler.send_back import SendBack, least_progress
from runtime.scheduler.speculation import speculator_for
from runtime.scheduler.step_stats import StepStats
from runtime.scheduler.stop import check_stop, grammar_stop
from runtime.scheduler.waiting_queue import WaitingQueue

logger = logging.getLogger("forkserve")

# Most prefill steps in a row while requests wait to decode.
MAX_PREFILL_STREAK = 4


class Scheduler:
    def __init__(
        self, args: ServerArgs, worker: ModelWorker, decode_tail: Callable[[list[int]], str],
        make_grammar_backend: Callable[[], GrammarBackend] | None = None,
        encode: Callable[[str], list[int]] | None = None,
    ) -> None:
        self.args = args
        self.worker = worker
        self.decode_tail = decode_tail  # token ids -> text with special tokens, for stop strings
        self.encode = encode  # text -> token ids (no special tokens), for jump-forward
        self.jump_forward = args.enable_jump_forward and encode is not None
        self.grammars = GrammarQueue(make_grammar_backend or _no_grammar_backend, args.grammar_compile_timeout)
        self.allocator = SlotAllocator(worker.num_slots)
        self.tree = RadixCache(self.allocator, page_size=args.page_size, disable=args.disable_radix_cache)
        self.cache = CacheManager(self.tree, self.allocator, worker.req_to_token)
        self.waiting = WaitingQueue()
        self.running: list[Req] = []
        self.chunked: Req | None = None  # the request whose prompt is part-way through prefill
        self.chunk_tokens = args.resolved_chunked_prefill_size  # prompt tokens per prefill step (-1: no limit)
        self.jumped: list[Req] = []  # running requests with forced tokens to compute (jump-forward)
        self.max_context_len = worker.max_context_len
        self.vocab_size = worker.model_config.vocab_size
        self.eos_token_ids = worker.eos_token_ids
        self.send_back = SendBack(self.cache, self.waiting)  # retractions and the decode reserve
        self.steps = StepStats()
        self.num_jumped_tokens = 0  # output tokens appended by jump-forward, not sampled
        self.prefill_streak = 0  # prefill steps since the last decode step
        self.kv_peak_in_use = 0  # most slots requests held (own + locked prefixes) in a step since the last flush
        self.pins = ProgramPins(self.tree, self.allocator.capacity, idle_timeout=args.program_pin_timeout)
        self.speculator = speculator_for(args, self.max_context_len)

    # ------------------------------------------------------------------ the loop
    def validate_request(self, req: Req) -> None:
        """Raise ``ValueError`` if ``req`` can never run here (too long for the context or pool,
        or a stop token id outside the vocabulary)."""
        req.params.check_vocab(self.vocab_size)
        prompt_len, max_new = len(req.input_ids), req.params.max_new_tokens
        if prompt_len >= self.max_context_len:
            raise ValueError(f"prompt has {prompt_len} tokens; the context length is {self.max_context_len}")
        if prompt_len + max_new > self.allocator.capacity:
            raise ValueError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new}) = {prompt_len + max_new} "
                f"tokens cannot fit in the KV pool ({self.allocator.capacity} tokens)"
            )

    def add_request(self, req: Req) -> None:
        self.validate_request(req)
        if self.grammars.needs_grammar(req):
            self.grammars.add(req)  # joins the waiting queue once its grammar is compiled
        else:
            self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked or self.jumped or self.grammars)

    @property
    def num_prefill_tokens(self) -> int:
        """Prompt tokens computed (not served from the cache)."""
        return self.steps.prefill_tokens

    @property
    def num_forward_steps(self) -> int:
        return self.steps.prefill_steps + self.steps.decode_steps

    def step(self) -> list[Req]:
        """Run one batch; return the requests that got a new token or finished."""
        started = time.perf_counter()
        failed: list[Req] = []
        self.pins.release_idle()
        if self.grammars:
            ready, failed = self.grammars.take_ready()
            self.waiting.extend(ready)
        # Prefill wins (it grows the decode batch), but not forever: a stream of long
        # prompts would otherwise keep running requests from ever decoding.
        decode_first = bool(self.running) and self.prefill_streak >= MAX_PREFILL_STREAK
        batch = (self._decode_batch() if decode_first else None) or self._prefill_batch() or self._decode_batch()
        if batch is not None:  # a step that decoded every running request ends a streak
            self.prefill_streak = 0 if batch.is_decode or batch.num_mixed_decodes else self.prefill_streak + 1
        if batch is None:
            if self.grammars and not (self.waiting or self.admitted()):
                self.grammars.wait(0.05)  # only compiles are pending
                return failed
            if self.has_work and self.pins.release_oldest():
                return failed + self.step()  # programs' pinned prefixes held the memory: unpin, retry
            if self.has_work:
                # Admission guarantees every request fits an otherwise empty pool, so work
                # with nothing runnable is a scheduler bug: fail loudly instead of spinning.
                raise RuntimeError(
                    f"scheduler stalled: {len(self.waiting)} waiting, chunked={self.chunked is not None}, "
                    f"free slots {self.cache.free_slots}"
                )
            self.check_invariants()
            return failed  # a grammar that timed out with nothing else to run still answers
        forward_start = time.perf_counter()
        result = self.worker.run(lower(batch, self.eos_token_ids, self.vocab_size))
        forward_s = time.perf_counter() - forward_start
        self.kv_peak_in_use = max(self.kv_peak_in_use, self._kv_in_use())
        done = failed + self._process(batch, result)
        drafted = sum(batch.draft_lens) if batch.draft_lens else 0
        if self.speculator is not None and batch.decodes_only:
            self.speculator.observe(len(batch.reqs), drafted, forward_s)
        self.steps.record(batch.decodes_only, len(batch.input_ids) - drafted,
                          0 if batch.decodes_only else batch.num_mixed_decodes, forward_s, time.perf_counter() - started)
        return done

    def check_invariants(self) -> None:
        self.tree.check_invariants(num_held_outside=self.held_slots())

    def abort(self, rid: str, message: str = "aborted by the client") -> Req | None:
        """Drop request ``rid`` wherever it is and free what it holds; its computed KV stays
        in the tree. Returns the request (finished with an ``abort`` reason), or None if it
        is not here (already finished)."""
        req = self.waiting.find(rid)
        if req is not None:
            self.waiting.remove(req)
        else:
            req = self.grammars.remove(rid)
        if req is None:
            req = next((r for r in self.admitted() if r.rid == rid), None)
            if req is None:
                return None
            if req is self.chunked:
                self.chunked = None
            elif req in self.jumped:
                self.jumped.remove(req)
            else:
                self.running.remove(req)
            self.cache.release(req)
        req.finished_reason = {"type": "abort", "message": message}
        req.finished_at = time.perf_counter()
        return req

    def end_program(self, program_id: str) -> int:
        """Release the cache pins of a finished program (see ``program_pins.py``)."""
        return self.pins.end(program_id)

    def flush_cache(self) -> bool:
        """Drop every cached prefix; refused (False) while requests are queued or running."""
        if self.has_work:
            return False
        self.pins.release_all()
        self.tree.reset()
        self.kv_peak_in_use = 0
        return True

    def held_slots(self) -> int:
        """Slots the admitted requests own (outside the tree)."""
        return sum(r.num_owned_slots for r in self.admitted())

    def _kv_in_use(self) -> int:
        """Slots the admitted requests hold: their own plus the cached prefixes they lock."""
        return self.held_slots() + self.tree.protected_size

    def stats(self) -> dict[str, int | float]:
        """Queue lengths, the KV pool's accounting and where the steps' time went."""
        return scheduler_report(self)

    # ------------------------------------------------------------------ prefill
    def _prefill_batch(self) -> ScheduledBatch | None:
        mix = not self.args.disable_mixed_chunk and bool(self.running)
        budget = PrefillBudget.for_step(self.chunk_tokens, self.args.max_running_requests,
                                        len(self.running), mix, self.send_back.decode_reserve(self.running))
        picked: list[tuple[Req, int]] = []
        # Jumped requests first: their forced tokens are a few each, and behind a long
        # prompt's chunks (each taking the whole budget) they would wait for all of them.
        for req in list(self.jumped):  # forced tokens: one extend each, never split
            n = len(req.fill_ids) - req.kv_len
            # The first extend of a step may exceed the budget (a chunk size below the
            # jump's length would otherwise leave it waiting for ever).
            if picked and (budget.exhausted or budget.chunk(n) < n):
                break
            self.jumped.remove(req)
            if not self.cache.grant(req, n):
                self.send_back.for_memory(req)  # memory is short: recompute it later from the tree
                continue
            picked.append((req, n))
            budget.take(n)
        if self.chunked is not None:  # the prompt part-way through its prefill: the rest of the budget
            req, n = self.chunked, budget.chunk(len(self.chunked.fill_ids) - self.chunked.kv_len)
            if n > 0 and self.cache.grant(req, n):  # else it waits (for budget or memory)
                self.chunked = None
                picked.append((req, n))
                budget.take(n)
        admitted = self._admitted_per_group(picked)
        candidates: Iterable[Req] = ()
        # With every row taken a waiting request can only start if a row is yielded to it;
        # when no call could yield one, the order is not worth making.
        if self.waiting and (budget.rows > 0 or self._call_that_may_yield(admitted) is not None):
            candidates = order_waiting(self.waiting, self.args.schedule_policy, self.cache, Counter(admitted))
        yielded = False
        for req in candidates:
            if budget.exhausted_tokens or self.chunked is not None:  # one chunked request at a time
                break
            cached = self.cache.match_len(req)
            if not self.cache.tree.disable and shares_uncached_prefix(req, cached, picked):
                if budget.rows <= 0:
                    break  # not worth a row yielded this step
                continue  # a request in this batch computes the same prefix; reuse it next step
            need = len(req.fill_ids) - cached
            n = budget.chunk(need)
            if not budget.leaves_reserve(self.cache.free_slots, n):
                break
            if budget.rows <= 0:  # it could start but for a row: one may be yielded to it, once a step
                if yielded or not self._yield_row(req, admitted):
                    break
                yielded = True
                budget.rows += 1
            if not self.cache.admit(req):
                break
            if not self.cache.grant(req, len(req.fill_ids) - req.kv_len if n == need else n):
                self.cache.release(req)
                break
            n = req.alloc_len - req.kv_len
            self.waiting.remove(req)
            req.yielded = False
            picked.append((req, n))
            admitted[req.group] += 1
            budget.take(n, self.send_back.expected_decode_tokens(req))
        if not picked:
            return None
        self.waiting.batch_formed()
        batch = self._build_extend_batch(picked)
        if mix:
            self._mix_in_decodes(batch)
        return batch

    def _call_that_may_yield(self, admitted: Counter[str | None]) -> Hog | None:
        """``row_sharing.call_that_may_yield``; none without the radix cache (a yielded
        request's KV would be freed: it would compute it all again)."""
        if self.cache.tree.disable:
            return None
        return call_that_may_yield(self.running, admitted, self.args.max_running_requests)

    def _yield_row(self, first: Req, admitted: Counter[str | None]) -> bool:
        """``first``, the next waiting request in fair order, could start but every row is
        taken: when a call gives one up to it (``runtime/scheduler/row_sharing.py``), that
        call's least advanced running member goes back to the queue (``SendBack``: its KV
        to the tree, so it comes back computing what the tree no longer holds, usually one
        token) and waits behind ``first``, ranked with its call. A request that is waiting
        after being sent back (for memory or a yield) makes no other yield: no churn."""
        if first.is_retracted:  # waiting, so put back
            return False
        hog = self._call_that_may_yield(admitted)
        if hog is None or not yields_to(first, hog, admitted, self.args.max_running_requests):
            return False
        victim = least_progress(r for r in self.running if r.group == hog.group)
        self.running.remove(victim)
        self.send_back.yielding_row(victim)
        logger.debug("request %s yields its row to %s (its call holds %d rows)", victim.rid, first.rid, hog.rows)
        return True

    def _admitted_per_group(self, picked: list[tuple[Req, int]]) -> Counter[str | None]:
        """Each group's admitted members (fair order, ``policy.order_waiting``), with those
        this step picked already (they left the jumped list and the chunked slot); the
        requests alone under ``None``."""
        return Counter(r.group for r in self.admitted() + [r for r, _ in picked])

    def _mix_in_decodes(self, batch: ScheduledBatch) -> None:
        """Append every running request's next token to a prefill batch (as a one-token
        extend), so running requests decode in this step too; unchanged when the pool has
        no slot for each of them (the next decode step makes room)."""
        decodes = self._next_tokens(list(self.running))
        if decodes is not None:
            batch.append_decodes(decodes)

    def _build_extend_batch(self, picked: list[tuple[Req, int]]) -> ScheduledBatch:
        for req, n in picked:
            if req.kv_len + n < len(req.fill_ids):
                # A chunk that is not the last uses the whole budget, so there is only one.
                assert self.chunked is None, "two chunked requests in one batch"
                self.chunked = req
        return extend_batch(picked, self.cache.table)

    # ------------------------------------------------------------------ decode
    def _decode_batch(self) -> ScheduledBatch | None:
        if not self.running:
            return None
        self.send_back.decay()
        while self.cache.free_slots < len(self.running) and self._give_up_memory():
            pass
        batch = self._next_tokens(list(self.running))
        if batch is None:
            raise RuntimeError("KV pool exhausted by a single request; this is a bug: admission checks its size")
        return batch

    def _give_up_memory(self) -> bool:
        """Make KV slots obtainable for the running requests' next tokens, the cheapest loss
        first: the oldest program's pins (cached prefixes no request is using), the request
        part-way through its prefill, the running request with the least progress (one
        always stays), then a request waiting to compute its forced tokens. False when none
        is left; admission guarantees that a lone request fits the pool."""
        if self.pins.release_oldest():
            return True
        if self.chunked is not None:
            req, self.chunked = self.chunked, None
        elif len(self.running) > 1:
            req = least_progress(self.running)
            self.running.remove(req)
        elif self.jumped:
            req = self.jumped.pop()
        else:
            return False
        self.send_back.for_memory(req)  # its KV to the tree: it may be reused when it comes back
        return True

    def _next_tokens(self, reqs: list[Req]) -> ScheduledBatch | None:
        """A decode batch of ``reqs``' next tokens, one new slot each (and one per token of
        the drafts they check, with speculative decoding); None (nothing changed) when the
        pool is short of slots."""
        if self.speculator is not None:
            self.speculator.propose(reqs, self.allocator.available)  # drafts evict no cached prefix
        out_cache_loc = self.cache.grant_one_each(reqs)
        if out_cache_loc is None:
            for req in reqs:
                req.draft = []
            return None
        return decode_batch(reqs, out_cache_loc)

    # ------------------------------------------------------------------ results
    def _process(self, batch: ScheduledBatch, result: BatchResult) -> list[Req]:
        touched, jumped = [], []
        first_decode = len(batch.reqs) - batch.num_mixed_decodes if not batch.is_decode else 0
        for i, req in enumerate(batch.reqs):
            req.kv_len = req.alloc_len
            prefilled = i < first_decode
            if prefilled:
                req.input_token_logprobs.extend(result.input_logprobs[i])
                req.input_top_logprobs.extend(result.input_top_logprobs[i])
                req.input_token_ranks.extend(result.input_ranks[i])
                # Share the prompt now, not at finish: siblings queued behind this request
                # (forks, n > 1, a common system prompt) reuse it from their next step on.
                self.cache.cache_unfinished(req)
                if req is self.chunked:
                    continue
            token = result.next_ids[i]
            if token is None:  # prefill-only request (max_new_tokens == 0)
                req.finished_reason = {"type": "length", "length": 0}
            elif batch.draft_len(i):
                self._take_checked_draft(req, result.draft_picks[i])  # type: ignore[arg-type]
            else:
                req.output_ids.append(token)
                if req.options.return_logprob:
                    req.output_token_logprobs.append((result.output_logprobs[i], token))  # type: ignore[arg-type]
                    req.output_top_logprobs.append(result.output_top_logprobs[i])
                req.finished_reason = self._stop_reason(req)
                if req.grammar is not None and not req.is_finished:
                    req.finished_reason = grammar_stop(req, token)
                    if self.jump_forward and not req.is_finished and self._jump(req):
                        jumped.append(req)
            if req.first_token_at is None:
                req.first_token_at = time.perf_counter()
            if prefilled and not req.is_finished:
                self.running.append(req)
            if req.is_finished:
                req.finished_at = time.perf_counter()
                req.lookup = None
                if req in self.running:
                    self.running.remove(req)
                computed = req.fill_ids[: req.kv_len]
                self.cache.release(req)
                if req.options.program_id is not None:
                    self.pins.pin(req.options.program_id, computed, req.options.namespace)
            touched.append(req)
        for req in jumped:  # its forced tokens are computed by the next prefill step
            self.running.remove(req)
            self.jumped.append(req)
        return touched

    def _stop_reason(self, req: Req) -> dict[str, Any] | None:
        return check_stop(req, self.eos_token_ids, self.max_context_len, self.decode_tail)

    def _take_checked_draft(self, req: Req, picks: list[int]) -> None:
        """Append what a checked draft adds (``NgramSpeculator.take``); keep the KV of the
        tokens fed that the output kept (the decoded token and the draft tokens in the output
        but the last), give back the other slots."""
        assert self.speculator is not None
        last_at = req.alloc_len - len(picks)  # the position of the token decoded
        req.kv_len = last_at + self.speculator.take(req, picks, self._stop_reason)
        self.cache.take_back_unused(req)

    def _jump(self, req: Req) -> bool:
        if not is_eligible(req):
            return False
        # The extend that computes the forced tokens samples one more: leave it room.
        room = min(req.params.max_new_tokens, self.max_context_len - len(req.input_ids)) - len(req.output_ids) - 1
        added = jump_forward(req, self.decode_tail, self.encode, room)  # type: ignore[arg-type]
        self.num_jumped_tokens += added
        return added > 0

    def admitted(self) -> list[Req]:
        """The requests holding KV now: running, jumped and the one part-way through prefill."""
        return self.running + self.jumped + ([self.chunked] if self.chunked is not None else [])


def _no_grammar_backend() -> GrammarBackend:
    raise ValueError("constrained decoding needs a grammar backend, and this scheduler has none")

