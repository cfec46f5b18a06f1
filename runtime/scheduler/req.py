"""One generation request as the scheduler tracks it, including which KV slots it owns.

Positions of a running request's row in the request-to-token table::

    0 .......... cache_protected_len ........... kv_len ...... alloc_len
    | tree's slots (locked via last_node) | own slots, KV computed | own, granted this step |

``kv_len`` advances to ``alloc_len`` when the step's forward has run. The slots in
``[cache_protected_len, alloc_len)`` belong to the request until it hands them to the tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.incremental_text import IncrementalText
from runtime.request_options import RequestOptions
from runtime.sampling.params import SamplingParams
from runtime.sampling.seed_stream import SeedStream

if TYPE_CHECKING:
    from concurrent.futures import Future

    from radix_cache import TreeNode
    from runtime.constrained.backend import Grammar, GrammarMatcher
    from runtime.scheduler.ngram_lookup import NgramLookup


@dataclass(eq=False)
class Req:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    options: RequestOptions = field(default_factory=RequestOptions)
    group: str | None = None  # the call it came in with others (n samples, a batch); None: alone

    output_ids: list[int] = field(default_factory=list)
    finished_reason: dict[str, Any] | None = None
    stop_text: IncrementalText | None = None  # the output's text for unbounded stop regexes (stop.py)
    decode_context: tuple[int, ...] = ()  # the prompt's last tokens if it ends inside a character (incremental_text.py)
    generator: SeedStream | None = None  # a seeded request's own numbers
    error: str | None = None  # the request failed alone (e.g. its grammar did not compile)
    error_param: str | None = None  # the request field the error is about, when there is one

    # constrained decoding: the compile in flight, then this request's own matcher
    grammar_future: Future[Grammar] | None = None
    grammar: GrammarMatcher | None = None

    # speculative decoding: the lookup over this request's tokens (made on its first draft),
    # and the guessed tokens the current step checks after its last token
    lookup: NgramLookup | None = None
    draft: list[int] = field(default_factory=list)

    # KV ownership (see the module docstring)
    row: int | None = None
    last_node: TreeNode | None = None
    cache_protected_len: int = 0
    kv_len: int = 0
    alloc_len: int = 0
    cached_tokens: int = 0  # prompt tokens served from the cache at first admission
    is_retracted: bool = False  # sent back to the queue at least once (cached_tokens stay those of its first admission)
    yielded: bool = False  # waiting after giving its row to another call (Scheduler._yield_row)
    num_passed_over: int = 0  # prefill batches formed while it waited, until it last left the queue (WaitingQueue.passed_over)

    # logprobs: [logprob, token_id] pairs (text is added by the detokenizer)
    input_token_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    input_token_ranks: list[int | None] = field(default_factory=list)  # 1: the most likely (vLLM's prompt_logprobs)
    output_token_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)

    created_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self.generator = SeedStream(self.params.seed)

    @property
    def fill_ids(self) -> list[int]:
        """Tokens whose KV the request needs before it can sample its next token."""
        return self.input_ids + self.output_ids

    @property
    def is_finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def num_owned_slots(self) -> int:
        return self.alloc_len - self.cache_protected_len

    @property
    def wants_input_logprobs(self) -> bool:
        """Whether this prefill computes prompt logprobs: asked for, and not yet complete (a
        request with output tokens has had its whole prompt computed; one retracted before
        that starts its prompt logprobs over)."""
        opts = self.options
        return opts.return_logprob and 0 <= opts.logprob_start_len < len(self.input_ids) and not self.output_ids

    @property
    def max_reusable_prefix(self) -> int:
        """The longest cached prefix this request may use: its last token must be computed
        to get logits, and prompt logprobs need the logits from ``logprob_start_len`` on."""
        limit = len(self.fill_ids) - 1
        if self.wants_input_logprobs:
            limit = min(limit, self.options.logprob_start_len)
        return limit
