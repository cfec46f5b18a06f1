"""The offline ``Engine.generate`` API through the real default model: stop conditions,
seeds, ``n``, batches, input validation and ``flush_cache``.

Decoding is slow on CPU, so every request asks for a handful of tokens, and the stop
string / stop token are taken from one greedy reference answer (the ``ref`` fixture).
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0}


def _decode(engine, ids: list[int]) -> str:
    return engine.tokenizer.decode(ids)


# --------------------------------------------------------------------------- stop conditions


def test_eos_stops_generation(engine, chat_prompt, ref):
    ids, meta = ref["output_ids"], ref["meta_info"]
    eos = ids[-1]
    assert eos in engine.scheduler.eos_token_ids
    assert meta["finish_reason"] == {"type": "stop", "matched": eos}
    assert meta["completion_tokens"] == len(ids)
    assert not any(t in engine.scheduler.eos_token_ids for t in ids[:-1])
    assert ref["text"] == _decode(engine, ids[:-1])
    assert "<|im_end|>" not in ref["text"]
    assert "4" in ref["text"]
    assert meta["prompt_tokens"] == len(engine.tokenizer.encode(chat_prompt))


def test_ignore_eos_runs_to_max_new_tokens(engine, chat_prompt, ref):
    n = len(ref["output_ids"]) + 1
    out = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": n, "ignore_eos": True})
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": n}
    assert meta["completion_tokens"] == len(out["output_ids"]) == n
    # the EOS the model emitted was kept as an ordinary token, and decoding went past it
    assert out["output_ids"][: len(ref["output_ids"])] == ref["output_ids"]


def test_stop_string_cuts_text_before_it(engine, chat_prompt, ref):
    ids = ref["output_ids"]
    stop = _decode(engine, ids[1:3]).strip()  # spans two tokens of the greedy answer
    assert stop and stop in ref["text"]
    k = next(k for k in range(1, len(ids) + 1) if stop in _decode(engine, ids[:k]))
    out = engine.generate(
        chat_prompt, {**GREEDY, "max_new_tokens": 16, "stop": ["@@never@@", stop]}
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["output_ids"] == ids[:k]  # stopped on the token completing the stop string
    assert out["text"] == ref["text"][: ref["text"].find(stop)]
    assert stop not in out["text"]


def test_stop_string_may_be_a_special_tokens_text(engine, chat_prompt, ref):
    # Matched against the text with special tokens, as SGLang does, whatever
    # skip_special_tokens says about the response text.
    ids = ref["output_ids"]
    eos_text = engine.tokenizer.decode(ids[-1:], skip_special_tokens=False)
    assert eos_text == "<|im_end|>"
    out = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": len(ids) + 4, "ignore_eos": True,
                                        "stop": [eos_text]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos_text}
    assert out["output_ids"] == ids
    assert out["text"] == ref["text"]


def test_stop_regex_cuts_text_at_the_match(engine, chat_prompt, ref):
    ids, pattern = ref["output_ids"], r"\d"  # the answer holds the number
    k = next(k for k in range(1, len(ids) + 1) if re.search(pattern, _decode(engine, ids[:k])))
    out = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 16, "stop_regex": ["@@never@@", pattern]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert out["output_ids"] == ids[:k]
    assert out["text"] == ref["text"][: re.search(pattern, ref["text"]).start()]
    kept = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 16, "stop_regex": pattern, "no_stop_trim": True})
    assert kept["text"] == _decode(engine, ids[:k])


def test_a_stop_string_before_min_new_tokens_is_kept_in_the_text(engine):
    # " 5, 6, 7, ...": the first "," comes before the minimum and does not stop the request,
    # so the text is cut at the "," that did, not at the first one (streamed text agrees).
    params = {**GREEDY, "max_new_tokens": 12, "min_new_tokens": 4}
    plain = engine.generate("1, 2, 3, 4,", {**params, "min_new_tokens": 0, "max_new_tokens": 8})
    assert plain["text"].startswith(" 5, 6, 7")
    for key, stop, text in (("stop", [","], " 5, 6"), ("stop_regex", [r"\d,"], " 5, ")):
        out = engine.generate("1, 2, 3, 4,", {**params, key: stop})
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        assert len(out["output_ids"]) >= 4 and out["text"] == text, (key, out["text"])
        assert engine.tokenizer.decode(out["output_ids"]).startswith(" 5, 6,")  # stopped at the second


def test_stop_token_ids(engine, chat_prompt, ref):
    ids = ref["output_ids"]
    tok = ids[2]
    assert tok not in ids[:2]
    out = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 16, "stop_token_ids": [tok]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok}
    assert out["output_ids"] == ids[:3]
    assert out["text"] == _decode(engine, ids[:2])  # the stop token is not in the text


def test_max_new_tokens_gives_length(engine, chat_prompt, ref):
    out = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 3})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert out["meta_info"]["completion_tokens"] == 3
    assert out["output_ids"] == ref["output_ids"][:3]
    assert out["text"] == _decode(engine, ref["output_ids"][:3])


def test_max_new_tokens_zero_prefills_and_caches_the_prompt(engine):
    prompt = "Zebra ledger 4417: the quartermaster counted barrels of salted herring twice."
    out = engine.generate(prompt, {"max_new_tokens": 0})
    meta = out["meta_info"]
    assert out["output_ids"] == [] and out["text"] == ""
    assert meta["completion_tokens"] == 0
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    n = meta["prompt_tokens"]
    assert n == len(engine.tokenizer.encode(prompt))
    assert meta["cached_tokens"] < n - 1  # not cached before this test
    again = engine.generate(prompt, {**GREEDY, "max_new_tokens": 1})
    assert again["meta_info"]["cached_tokens"] >= n - 1
    assert again["meta_info"]["completion_tokens"] == 1


def test_min_new_tokens_prevents_early_eos(engine, chat_prompt, ref):
    ids = ref["output_ids"]  # the greedy answer ends with EOS at position len(ids) - 1
    n = len(ids)
    out = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": n, "min_new_tokens": n})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": n}
    assert len(out["output_ids"]) == n
    assert not any(t in engine.scheduler.eos_token_ids for t in out["output_ids"])
    assert out["output_ids"][: n - 1] == ids[: n - 1]


# --------------------------------------------------------------------------- seeds, n, batches

SEED_PROMPT = "Once upon a time, in a small village by the sea,"


def test_same_seed_same_text_different_seed_differs(engine):
    params = {"temperature": 0.8, "max_new_tokens": 4}
    a = engine.generate(SEED_PROMPT, {**params, "seed": 11})
    b = engine.generate(SEED_PROMPT, {**params, "seed": 11})
    c = engine.generate(SEED_PROMPT, {**params, "seed": 12})
    assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
    assert len(a["output_ids"]) == 4 or a["meta_info"]["finish_reason"]["type"] == "stop"
    # 4 tokens at T=0.8 from an open-ended prompt: seeds 11 and 12 give different draws
    assert a["output_ids"] != c["output_ids"]


def test_n_returns_n_results(engine):
    outs = engine.generate(SEED_PROMPT, {"temperature": 0.8, "max_new_tokens": 2, "n": 2})
    assert isinstance(outs, list) and len(outs) == 2
    assert outs[0]["meta_info"]["id"] != outs[1]["meta_info"]["id"]
    for o in outs:
        assert o["meta_info"]["completion_tokens"] == len(o["output_ids"]) == 2
        assert o["meta_info"]["prompt_tokens"] == len(engine.tokenizer.encode(SEED_PROMPT))


def test_batch_returns_results_in_order(engine, chat_prompt, ref):
    prompts = ["Hello", chat_prompt, "The quick brown fox jumps over the"]
    params = [
        {**GREEDY, "max_new_tokens": 1},
        {**GREEDY, "max_new_tokens": 3},
        {**GREEDY, "max_new_tokens": 2},
    ]
    outs = engine.generate(prompts, params)
    assert isinstance(outs, list) and len(outs) == 3
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [
        len(engine.tokenizer.encode(p)) for p in prompts
    ]
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [1, 3, 2]
    assert outs[1]["output_ids"] == ref["output_ids"][:3]
    # a one-element batch is still a batch
    one = engine.generate(["Hello"], {**GREEDY, "max_new_tokens": 1})
    assert isinstance(one, list) and len(one) == 1
    assert one[0]["output_ids"] == outs[0]["output_ids"]


# --------------------------------------------------------------------------- bad input


def _too_long(engine):
    return engine.generate(
        input_ids=[1] * (engine.scheduler.max_context_len + 1),
        sampling_params={"max_new_tokens": 1},
    )


BAD_CALLS = {
    "empty prompt": (lambda e: e.generate("", {"max_new_tokens": 1}), "prompt"),
    "empty input_ids": (
        lambda e: e.generate(input_ids=[], sampling_params={"max_new_tokens": 1}),
        "prompt",
    ),
    "prompt longer than the context": (_too_long, "prompt"),
    "negative max_new_tokens": (
        lambda e: e.generate("Hi", {"max_new_tokens": -1}),
        "max_new_tokens",
    ),
    "temperature < 0": (lambda e: e.generate("Hi", {"temperature": -0.5}), "temperature"),
    "top_p 1.5": (lambda e: e.generate("Hi", {"top_p": 1.5}), "top_p"),
    "unknown sampling key": (lambda e: e.generate("Hi", {"max_new_token": 4}), "max_new_token"),
    "out-of-vocab input id": (
        lambda e: e.generate(
            input_ids=[1, e.worker.model_config.vocab_size], sampling_params={"max_new_tokens": 1}
        ),
        "input_ids",
    ),
    "negative input id": (
        lambda e: e.generate(input_ids=[1, -3], sampling_params={"max_new_tokens": 1}),
        "input_ids",
    ),
    "logprob_start_len below -1": (
        lambda e: e.generate("Hi", {"max_new_tokens": 1}, return_logprob=True, logprob_start_len=-2),
        "logprob_start_len",
    ),
    "top_logprobs_num beyond --max-logprobs": (
        lambda e: e.generate("Hi", {"max_new_tokens": 1}, return_logprob=True, top_logprobs_num=10**6),
        "top_logprobs_num",
    ),
    "non-integer top_logprobs_num": (
        lambda e: e.generate("Hi", {"max_new_tokens": 1}, return_logprob=True, top_logprobs_num=1.5),
        "top_logprobs_num",
    ),
    "bad params in a batch": (
        lambda e: e.generate(["Hi", "Yo"], [{"max_new_tokens": 1}, {"top_p": 0}]),
        "top_p",
    ),
    "input_ids not a list": (lambda e: e.generate(input_ids=5, sampling_params={"max_new_tokens": 1}), "input_ids"),
    "sampling_params not a dict": (lambda e: e.generate("Hi", [1]), "sampling_params"),
    "seed beyond 64 bits": (lambda e: e.generate("Hi", {"max_new_tokens": 1, "seed": 2**70}), "seed"),
    "non-boolean return_logprob": (lambda e: e.generate("Hi", {"max_new_tokens": 1}, return_logprob="yes"), "return_logprob"),
    "stop token id outside the vocabulary": (
        lambda e: e.generate("Hi", {"max_new_tokens": 2, "min_new_tokens": 1, "stop_token_ids": [10**6]}),
        "stop_token_ids",
    ),
    "too long second prompt in a batch": (
        lambda e: e.generate(
            input_ids=[[1, 2], [1] * (e.scheduler.max_context_len + 5)],
            sampling_params={"max_new_tokens": 1},
        ),
        "prompt",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_naming_the_field(engine, case):
    call, field_name = BAD_CALLS[case]
    with pytest.raises(ValueError, match=rf"(?<![A-Za-z_]){field_name}(?![A-Za-z_])"):
        call(engine)
    # nothing was queued (the autouse fixture also checks the KV pool afterwards)
    assert not engine.scheduler.has_work


def test_engine_keeps_working_after_bad_input(engine, chat_prompt, ref):
    for call, _ in BAD_CALLS.values():
        with pytest.raises(ValueError):
            call(engine)
    out = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 2})
    assert out["output_ids"] == ref["output_ids"][:2]
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 2}


# --------------------------------------------------------------------------- flush_cache


def test_flush_cache(engine, chat_prompt, ref):
    n = ref["meta_info"]["prompt_tokens"]  # the reference request left this prompt cached
    warm = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 1})
    assert warm["meta_info"]["cached_tokens"] >= n - 1
    assert engine.flush_cache() is True
    cold = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 1})
    assert cold["meta_info"]["cached_tokens"] == 0
    assert cold["output_ids"] == ref["output_ids"][:1]


def test_flush_cache_refused_while_busy(engine, chat_prompt):
    stream = engine.generate(chat_prompt, {"max_new_tokens": 200, "ignore_eos": True}, stream=True)
    next(stream)  # running
    assert engine.flush_cache() is False
    stream.close()
    assert engine.flush_cache() is True


def test_sglang_engine_arguments(engine, chat_prompt):
    """As SGLang's Engine takes them: logprob options per prompt or None, rid, context_length."""
    outs = engine.generate([chat_prompt, chat_prompt], {**GREEDY, "max_new_tokens": 2}, return_logprob=[True, None],
                           logprob_start_len=None, top_logprobs_num=[2, None], rid="mine")
    assert [o["meta_info"]["id"] for o in outs] == ["mine_0", "mine_1"]
    assert "output_top_logprobs" in outs[0]["meta_info"] and "output_top_logprobs" not in outs[1]["meta_info"]
    assert "input_token_logprobs" in outs[0]["meta_info"] and outs[0]["meta_info"]["input_token_logprobs"] == []
    with pytest.raises(ValueError, match="token_ids_logprob is not supported"):
        engine.generate(chat_prompt, GREEDY, token_ids_logprob=[1, 2])
    # what code written for SGLang's Engine passes at their defaults (RL rollouts: image_data=None)
    from runtime.engine import SGLANG_UNSET

    same = engine.generate(chat_prompt, {**GREEDY, "max_new_tokens": 2}, **SGLANG_UNSET)
    assert same["output_ids"] == outs[0]["output_ids"]
    engine.generate([chat_prompt] * 2, {**GREEDY, "max_new_tokens": 1}, image_data=[None, None])  # a batch's unset
    with pytest.raises(ValueError, match="lora_path is not supported by this engine"):
        engine.generate(chat_prompt, GREEDY, lora_path="adapter")
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_argument'"):
        engine.generate(chat_prompt, GREEDY, no_such_argument=None)
    with pytest.raises(ValueError, match="got 1 values of return_logprob for 2 prompts"):
        engine.generate([chat_prompt, chat_prompt], GREEDY, return_logprob=[True])
    from runtime.config import ServerArgs

    assert ServerArgs.from_kwargs(context_length=64).max_context_len == 64


def test_a_shut_down_engine_says_so(tiny_gqa_llama):
    from runtime.engine import Engine

    eng = Engine(str(tiny_gqa_llama), dtype="float32", max_total_tokens=2000)
    eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})
    eng.shutdown()
    eng.shutdown()  # twice is harmless
    with pytest.raises(RuntimeError, match="has been shut down"):
        eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})


def test_sglang_async_and_info_methods(engine, chat_prompt, ref):
    """SGLang's Engine.async_generate (whole and streamed, at once on one engine),
    get_model_info and get_server_info."""
    import asyncio

    async def both() -> tuple[dict, list[dict]]:
        async def streamed() -> list[dict]:
            stream = await engine.async_generate(chat_prompt, {**GREEDY, "max_new_tokens": 16}, stream=True)
            return [chunk async for chunk in stream]

        return await asyncio.gather(engine.async_generate(chat_prompt, {**GREEDY, "max_new_tokens": 16}), streamed())

    whole, chunks = asyncio.run(both())
    assert whole["output_ids"] == chunks[-1]["output_ids"] == ref["output_ids"] and len(chunks) > 1
    assert engine.get_model_info()["max_context_len"] == engine.scheduler.max_context_len
    info = engine.get_server_info()
    assert info["scheduler"]["kv_held_by_requests"] == 0 and info["dtype"] == engine.args.dtype
    assert info["chunked_prefill_size"] == engine.args.resolved_chunked_prefill_size  # the size in use, not None
