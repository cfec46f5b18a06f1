"""Per-request sampling parameters, SGLang's names and defaults, validated on the way in."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.sampling.stop_regex import check_pattern

if TYPE_CHECKING:
    import torch


class InvalidField(ValueError):
    """Bad user input in one named field; the HTTP layer turns it into a 400 with ``param=field``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # pickle / copy with both arguments
        return InvalidField, (self.field, str(self))


def _logit_bias(value: Any) -> Any:
    """A logit bias with integer token ids (JSON's keys are strings: "50256"); empty is none.
    A key that is no token id is left for ``validate`` to name; one id given twice (``"5"``
    and ``" 5"``) is an error."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and re.fullmatch(r"\s*[0-9]+\s*", key, re.ASCII) else key
        if token in out:
            raise InvalidField("logit_bias", f"logit_bias gives token {token} more than once")
        out[token] = bias
    return out or None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_logprob_options(logprob_start_len: Any, top_logprobs_num: Any, most: int, capped: bool) -> None:
    """The logprob options of a request (``Engine.generate`` and ``/generate`` share this):
    ``top_logprobs_num`` up to ``most``, the server's cap where ``capped`` (``--max-logprobs``),
    else the vocabulary."""
    if not _is_int(logprob_start_len) or logprob_start_len < -1:
        raise InvalidField("logprob_start_len", f"logprob_start_len must be an integer >= -1, got {logprob_start_len!r}")
    if not _is_int(top_logprobs_num) or not 0 <= top_logprobs_num <= most:
        why = "--max-logprobs, the Engine's max_logprobs: -1 lifts it" if capped else "the vocabulary"
        raise InvalidField(
            "top_logprobs_num", f"top_logprobs_num must be an integer in [0, {most}] ({why}), got {top_logprobs_num!r}"
        )


# Finite bounds keep float32 sampling finite: a temperature past ~1e38 (or a repetition
# penalty near 0) turns logits into inf and the probabilities into NaN. Within them every
# value behaves as its formula says; beyond 1e4 sampling is uniform over the allowed tokens
# for any real model's logits anyway.
MAX_TEMPERATURE = 1e4
REPETITION_PENALTY_RANGE = (0.01, 100.0)
MAX_N = 128  # OpenAI's limit on completions per request
TOP_K_ALL = 2**31 - 1  # a top_k past any vocabulary's size is off (a tensor could not hold 2**63)
BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
               "include_stop_str_in_output")
# SGLang's sampling fields this engine does not implement: accepted at their neutral value
# (what SGLang's own clients send when the feature is off), anything else is refused.
SGLANG_NEUTRAL_ONLY = ("structural_tag", "custom_params")
LOGIT_BIAS_RANGE = 100.0  # OpenAI's: each bias in [-100, 100]
SGLANG_ALIASES = {"sampling_seed": "seed"}


_INT_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "seed", "n", "stream_interval")


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # added to the logits of these token ids before sampling (OpenAI's logit_bias; keys
    # may come as strings, as JSON objects have them); the reported logprobs are the model's
    logit_bias: dict[int, float] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False  # SGLang's: the output stays whole (the stop token, the whole token that held a stop string)
    include_stop_str_in_output: bool = False  # vLLM's: the text ends with the stop string (or the stop token's text)
    seed: int | None = None
    n: int = 1
    stream_interval: int | None = None  # streamed: tokens per update (None: --stream-interval)
    # constrained decoding, at most one (checked by runtime/constrained/spec.py)
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    # not a client's field: max_new_tokens is the default because the request left it out
    # (SGLang then lets it run to the context instead of refusing it; request_builder.py)
    max_new_tokens_unset: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, on_unknown: Callable[[str], None] | None = None) -> SamplingParams:
        """Parameters from SGLang-named fields. A name that is no field of SGLang's nor ours
        is an error, or, with ``on_unknown``, reported to it and ignored (the HTTP API's rule)."""
        if d is not None and not isinstance(d, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(d).__name__}")
        d = dict(d or {})
        for name in SGLANG_NEUTRAL_ONLY:
            if d.pop(name, None) not in (None, {}):
                raise InvalidField(name, f"sampling parameter {name!r} is not supported by this server")
        for alias, name in SGLANG_ALIASES.items():
            if alias in d:
                value = d.pop(alias)
                if d.get(name) is not None and value is not None and d[name] != value:
                    raise InvalidField(alias, f"{alias} and {name} name the same parameter; give one")
                d[name] = value if d.get(name) is None else d[name]
        names = {f.name for f in dataclasses.fields(cls)} - {"max_new_tokens_unset"}
        unknown = sorted(set(d) - names)
        if unknown and on_unknown is None:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        for name in unknown:
            on_unknown(name)  # type: ignore[misc]
            del d[name]
        # JSON clients send null for "use the default".
        d = {k: v for k, v in d.items() if v is not None or k in ("seed", "regex", "json_schema", "ebnf")}
        if "logit_bias" in d:
            d["logit_bias"] = _logit_bias(d["logit_bias"])
        if isinstance(d.get("json_schema"), dict):  # a schema object is as good as its JSON text
            d["json_schema"] = json.dumps(d["json_schema"])
        for name in ("stop", "stop_regex"):
            if isinstance(d.get(name), str):
                d[name] = [d[name]]
        for name in _INT_FIELDS:  # 2.0 from a client that computed it: the integer it means
            if isinstance(d.get(name), float) and d[name].is_integer():
                d[name] = int(d[name])
        top_k = d.get("top_k")
        if type(top_k) is int and (top_k == 0 or top_k > TOP_K_ALL):  # vLLM's "off"; more than any vocabulary
            d["top_k"] = -1
        params = cls(**d, max_new_tokens_unset="max_new_tokens" not in d)
        params.validate()
        return params

    def validate(self) -> None:
        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                raise InvalidField(name, f"{name} {what}, got {getattr(self, name)!r}")

        def is_num(x: Any) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        need(_is_int(self.max_new_tokens) and self.max_new_tokens >= 0, "max_new_tokens", "must be an integer >= 0")
        need(_is_int(self.min_new_tokens) and self.min_new_tokens >= 0, "min_new_tokens", "must be an integer >= 0")
        need(self.min_new_tokens <= self.max_new_tokens, "min_new_tokens", "must not exceed max_new_tokens")
        need(is_num(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE, "temperature",
             f"must be a number in [0, {MAX_TEMPERATURE:g}]")
        need(is_num(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        need(_is_int(self.top_k) and (self.top_k == -1 or self.top_k >= 1), "top_k", "must be -1 or 0 (off) or >= 1")
        need(is_num(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        need(is_num(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2, "frequency_penalty", "must be in [-2, 2]")
        need(is_num(self.presence_penalty) and -2 <= self.presence_penalty <= 2, "presence_penalty", "must be in [-2, 2]")
        low, high = REPETITION_PENALTY_RANGE
        need(is_num(self.repetition_penalty) and low <= self.repetition_penalty <= high, "repetition_penalty",
             f"must be in [{low:g}, {high:g}] (1 = no penalty)")
        need(isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop), "stop", "must be a string or a list of non-empty strings")
        need(isinstance(self.stop_token_ids, list) and all(_is_int(t) and t >= 0 for t in self.stop_token_ids), "stop_token_ids", "must be a list of token ids")
        need(isinstance(self.stop_regex, list) and all(isinstance(s, str) and s for s in self.stop_regex), "stop_regex",
             "must be a regular expression or a list of them")
        for pattern in self.stop_regex:
            problem = check_pattern(pattern)
            if problem:
                raise InvalidField("stop_regex", f"stop_regex {pattern!r} {problem}")
        need(self.seed is None or (_is_int(self.seed) and -(2**63) <= self.seed < 2**64), "seed",
             "must be an integer in [-2**63, 2**64)")
        need(_is_int(self.n) and 1 <= self.n <= MAX_N, "n", f"must be an integer in [1, {MAX_N}]")
        need(self.stream_interval is None or (_is_int(self.stream_interval) and self.stream_interval >= 1),
             "stream_interval", "must be an integer >= 1")
        need(self.logit_bias is None or isinstance(self.logit_bias, dict), "logit_bias",
             f"must map token ids to numbers in [-{LOGIT_BIAS_RANGE:g}, {LOGIT_BIAS_RANGE:g}]")
        for t, b in (self.logit_bias or {}).items():  # the entry at fault, named
            if not (_is_int(t) and t >= 0):
                raise InvalidField("logit_bias", f"logit_bias keys must be token ids (integers >= 0), got {t!r}")
            if not (is_num(b) and abs(b) <= LOGIT_BIAS_RANGE):
                raise InvalidField("logit_bias", f"logit_bias[{t}] must be a number in [-{LOGIT_BIAS_RANGE:g}, "
                                                 f"{LOGIT_BIAS_RANGE:g}], got {b!r}")
        for name in ("regex", "json_schema", "ebnf"):
            need(getattr(self, name) is None or (isinstance(getattr(self, name), str) and getattr(self, name) != ""),
                 name, "must be a non-empty string")
        for name in BOOL_FIELDS:
            need(isinstance(getattr(self, name), bool), name, "must be true or false")

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids must exist in the model's vocabulary (the sampler indexes logits by them)."""
        for name, ids in (("stop_token_ids", self.stop_token_ids), ("logit_bias", self.logit_bias or ())):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise InvalidField(name, f"{name}: token ids must be in [0, {vocab_size}) (the vocabulary), got {bad[:5]!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1

    @functools.cached_property
    def logit_bias_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``logit_bias`` as (token ids, biases), made once (the sampler adds them each step)."""
        import torch

        bias = self.logit_bias or {}
        return torch.tensor(list(bias), dtype=torch.long), torch.tensor(list(bias.values()), dtype=torch.float32)

    @property
    def has_penalties(self) -> bool:
        """Penalties or a logit bias: the sampler changes the logits row on the host."""
        return (self.frequency_penalty != 0 or self.presence_penalty != 0 or self.repetition_penalty != 1
                or bool(self.logit_bias))
