"""The OpenAI API through the official ``openai`` client, against a real server; greedy
outputs must equal the offline ``Engine``'s for the same prompts."""

from __future__ import annotations

import asyncio
import re

import openai
import pytest

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = ["The capital of France is", "List three colors:", "def fibonacci(n):", "Once upon a time, a fox"]
QUESTIONS = ["Name a planet.", "What is 2 + 2?", "Say hello in French.", "Give me a fruit."]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat_prompt(engine, question: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": question}])


def greedy(engine, prompt: str, n: int) -> dict:
    return engine.generate(prompt, {"max_new_tokens": n, "temperature": 0})


def test_models_lists_the_served_model(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_completions_equal_offline_engine(client, engine):
    resp = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=24, temperature=0)
    assert [c.index for c in resp.choices] == list(range(len(PROMPTS)))
    for prompt, choice in zip(PROMPTS, resp.choices, strict=True):
        ref = greedy(engine, prompt, 24)
        assert choice.text == ref["text"]
        assert choice.finish_reason == ("length" if ref["meta_info"]["finish_reason"]["type"] == "length" else "stop")
    assert resp.usage.prompt_tokens == sum(len(engine.tokenizer.encode(p)) for p in PROMPTS)


def test_chat_equals_offline_engine_stream_and_not(client, engine):
    for q in QUESTIONS[:2]:
        ref = greedy(engine, chat_prompt(engine, q), 32)
        msgs = [{"role": "user", "content": q}]
        resp = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=32, temperature=0)
        assert resp.choices[0].message.content == ref["text"]
        assert resp.choices[0].message.role == "assistant"
        assert resp.usage.completion_tokens == ref["meta_info"]["completion_tokens"]
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=32, temperature=0, stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == ref["text"]
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finishes == [resp.choices[0].finish_reason]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == resp.usage.completion_tokens


def test_continuous_usage_stats_put_usage_so_far_in_every_chunk(client):
    """vLLM's ``stream_options.continuous_usage_stats``: each chunk carries the usage so far;
    the completion count grows to the final usage chunk's."""
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 12
    assert chunks[-1].choices == [] and counts[-2] == 12
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}


def test_continuous_usage_is_each_chunks_own_choice(client, engine):
    """As vLLM counts it: a chunk's usage is its choice's prompt and that choice's tokens so
    far, not every choice's; the last chunk has the totals."""
    prompts = [PROMPTS[0], PROMPTS[3]]
    lengths = [len(engine.tokenizer.encode(p)) for p in prompts]
    assert lengths[0] != lengths[1]
    chunks = list(client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=6, n=2, temperature=1, seed=3, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    seen: dict[int, list[int]] = {}
    for c in chunks[:-1]:
        (choice,) = c.choices
        assert c.usage.prompt_tokens == lengths[choice.index // 2]  # choices 0, 1: prompt 0; 2, 3: prompt 1
        seen.setdefault(choice.index, []).append(c.usage.completion_tokens)
    assert sorted(seen) == [0, 1, 2, 3]
    for counts in seen.values():
        assert counts == sorted(counts) and counts[-1] <= 6
    total = chunks[-1].usage
    assert chunks[-1].choices == [] and total.prompt_tokens == sum(lengths)
    assert total.completion_tokens == sum(counts[-1] for counts in seen.values())


def test_echo_with_logprobs_scores_the_prompt(client, engine):
    """What lm-evaluation-harness sends for log-likelihoods: the prompt's own tokens with
    their logprobs (the first has none), then the completion's, offsets across both."""
    prompt = PROMPTS[0]
    ref = engine.generate(prompt, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0, top_logprobs_num=1)
    want = ref["meta_info"]["input_token_logprobs"]
    scored = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0)
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text == prompt == "".join(lp.tokens)
    assert lp.tokens == [engine.tokenizer.id_to_text(t) for _, t, _ in want]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx([x for x, _, _ in want[1:]], abs=2e-2)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(len(lp.tokens))]
    more = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True, logprobs=1, temperature=0)
    lp_more = more.choices[0].logprobs
    assert lp_more.tokens[: len(want)] == lp.tokens and len(lp_more.tokens) == len(want) + 3
    assert lp_more.text_offset[len(want)] == len(prompt) and more.choices[0].text.startswith(prompt)
    # characters of several byte-level tokens: the offsets still only grow, across both parts
    wide_choice = client.completions.create(model=MODEL, prompt="Café 🦙 and 龘", max_tokens=3, echo=True, logprobs=1,
                                            temperature=0).choices[0]
    wide = wide_choice.logprobs
    assert wide.text_offset == sorted(wide.text_offset) and len(wide.tokens) > 6
    # each token starts at the character of the text its first byte belongs to (oracle: the
    # decoded text of the tokens before it, a partial last character left out)
    ids = engine.tokenizer.encode(wide_choice.text)
    assert len(ids) == len(wide.tokens)
    decode = engine.tokenizer.hf.decode
    assert wide.text_offset == [len(decode(ids[:k]).rstrip("\ufffd")) for k in range(len(ids))]
    assert wide.text_offset[-3] == len("Café 🦙 and 龘")
    # a token with part of a character is named by its bytes, as OpenAI names it
    assert [t for t in wide.tokens if t.startswith("bytes:\\x")] and "\ufffd" not in "".join(wide.tokens)


def test_logprob_bytes_rebuild_characters_split_across_tokens(client):
    """OpenAI's ``bytes`` are each token's own: joined they are the answer's UTF-8, even where
    a character (an emoji, a rare CJK one) spans several tokens. Streamed the same."""
    want = "🎉🐍 and 龘é"
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Emoji, please."}], max_tokens=30, temperature=0,
              logprobs=True, top_logprobs=2, extra_body={"regex": re.escape(want)})
    whole = client.chat.completions.create(**kw).choices[0]
    entries = whole.logprobs.content
    assert whole.message.content == want
    assert b"".join(bytes(e.bytes) for e in entries).decode().removesuffix("<|im_end|>") == want  # + the stop token
    assert all("\ufffd" not in e.token for e in entries) and any(e.token.startswith("bytes:") for e in entries)
    assert all(len({t.token for t in e.top_logprobs}) == len(e.top_logprobs) for e in entries)
    streamed = [e for c in client.chat.completions.create(**kw, stream=True) if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in entries]


def test_a_stop_string_before_min_tokens_stays_in_the_text_streamed_or_not(client):
    kw = dict(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[","], extra_body={"min_tokens": 4})
    whole = client.completions.create(**kw).choices[0]
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kw, stream=True) if c.choices)
    assert whole.finish_reason == "stop" and whole.text == streamed == " 5, 6"


def test_usage_reports_cached_tokens(client):
    msgs = [{"role": "system", "content": "You are a terse assistant. " * 20}, {"role": "user", "content": "Hi"}]
    first = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
    again = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    assert again.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens_details.cached_tokens
    # n > 1: the samples share one prefill, which is no cache hit of the request's own
    fresh = [{"role": "system", "content": "You list rivers of Peru. " * 20}, {"role": "user", "content": "Go"}]
    two = client.chat.completions.create(model=MODEL, messages=fresh, max_tokens=2, n=2, temperature=0)
    assert two.usage.prompt_tokens_details.cached_tokens < two.usage.prompt_tokens // 2
    again = client.chat.completions.create(model=MODEL, messages=fresh, max_tokens=2, n=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= again.usage.prompt_tokens - 1


def test_n_choices_and_max_completion_tokens(client):
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to ten."}], n=3, temperature=0,
        max_completion_tokens=12,
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert len({c.message.content for c in resp.choices}) == 1  # greedy: all the same
    assert 3 <= resp.usage.completion_tokens <= 36
    both = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count to ten."}],
                                          temperature=0, max_tokens=40, max_completion_tokens=5)
    assert both.choices[0].finish_reason == "length" and both.usage.completion_tokens == 5  # the newer field wins


def test_logit_bias_steers_every_route(client, server):
    """OpenAI's logit_bias (token id strings -> [-100, 100]), also SGLang's sampling field:
    +100 makes a token every greedy pick; -100 on the greedy first token moves it."""
    import httpx

    token = 1000  # any ordinary token
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "Say hi."}], temperature=0, max_tokens=4)
    forced = client.chat.completions.create(**chat, logit_bias={str(token): 100}, extra_body={"return_token_ids": True})
    assert forced.choices[0].token_ids == [token] * 4
    first = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=1,
                                      extra_body={"return_token_ids": True}).choices[0].token_ids[0]
    moved = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=1,
                                      logit_bias={str(first): -100}, extra_body={"return_token_ids": True})
    assert moved.choices[0].token_ids[0] != first
    native = httpx.post(server.url + "/generate", timeout=60, json={
        "text": "Hello", "sampling_params": {"max_new_tokens": 3, "temperature": 0, "logit_bias": {str(token): 100}}})
    assert native.json()["output_ids"] == [token] * 3


def test_stop_strings_and_seed(client):
    resp = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[" 7"])
    assert resp.choices[0].finish_reason == "stop"
    assert " 7" not in resp.choices[0].text and resp.choices[0].text.startswith(" 5")
    kw = dict(model=MODEL, prompt="My favourite animal is", max_tokens=16, temperature=1.0, seed=1234)
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_stop_regex_extra_field(client):
    resp = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, extra_body={"stop_regex": [r"\b[6-9]\b"]}
    )
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].text.startswith(" 5") and not any(c in resp.choices[0].text for c in "6789")


def test_extra_sampling_fields(client):
    resp = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=40, temperature=0,
        extra_body={"ignore_eos": True, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 40},
    )
    assert resp.usage.completion_tokens == 40
    assert resp.choices[0].finish_reason == "length"


def test_chat_logprobs_match_offline_engine(client, engine):
    q = QUESTIONS[2]
    ref = engine.generate(
        chat_prompt(engine, q), {"max_new_tokens": 8, "temperature": 0}, return_logprob=True, top_logprobs_num=3
    )
    resp = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": q}], max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=3,
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == ref["meta_info"]["completion_tokens"]
    for got, (lp, _tid, _) in zip(content, ref["meta_info"]["output_token_logprobs"], strict=True):
        assert got.logprob == pytest.approx(lp, abs=1e-3)
        assert len(got.top_logprobs) == 3
        assert got.top_logprobs[0].logprob == pytest.approx(got.logprob, abs=1e-3)  # greedy took the top one


def test_completion_logprobs_shape(client):
    resp = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0, logprobs=2)
    lp = resp.choices[0].logprobs
    assert "".join(lp.tokens) == resp.choices[0].text
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert all(len(t) == 2 for t in lp.top_logprobs)  # greedy: the chosen token is among the top 2



def test_echo_with_logprobs_and_n_scores_the_prompt_once(client, server):
    """n samples share one scoring of the prompt: each sample scored it again (n 128 of an
    8k-token prompt ran for 19 minutes, nothing else served meanwhile)."""
    import httpx

    prompt = "A prompt of its own, long enough to count: " + " ".join(f"word{i}" for i in range(120))
    one = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, echo=True, logprobs=1, temperature=0)
    num_prompt = one.usage.prompt_tokens

    def computed() -> int:
        return httpx.get(server.url + "/get_server_info").json()["scheduler"]["num_prefill_tokens"]

    httpx.post(server.url + "/flush_cache")
    before = computed()
    four = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, echo=True, logprobs=1, temperature=0, n=4)
    assert computed() - before < 2 * num_prompt  # not 4x
    prompt_part = [(c.logprobs.tokens[:num_prompt], c.logprobs.token_logprobs[:num_prompt]) for c in four.choices]
    want = (one.choices[0].logprobs.tokens[:num_prompt], one.choices[0].logprobs.token_logprobs[:num_prompt])
    assert prompt_part[0][0] == want[0] and prompt_part[0][1] == pytest.approx(want[1], abs=2e-2)
    assert all(p == prompt_part[0] for p in prompt_part)

@pytest.mark.parametrize("max_tokens", [0, 4])
def test_echo_with_logprobs_streams_what_it_returns_whole(client, max_tokens):
    """Streamed, the echoed prompt and its scores come with each choice's first chunk; the
    chunks joined are the non-streamed choice (text, tokens, logprobs, offsets)."""
    args = {"model": MODEL, "prompt": ["Café 🦙 is", "The sky"], "max_tokens": max_tokens, "echo": True,
            "logprobs": 2, "temperature": 0}
    whole = client.completions.create(**args).choices
    joined = {i: {"text": "", "tokens": [], "token_logprobs": [], "text_offset": [], "top_logprobs": []} for i in (0, 1)}
    for chunk in client.completions.create(**args, stream=True):
        for c in chunk.choices:
            joined[c.index]["text"] += c.text
            if c.logprobs is not None:
                for key in ("tokens", "token_logprobs", "text_offset", "top_logprobs"):
                    joined[c.index][key] += getattr(c.logprobs, key)
    for i, choice in enumerate(whole):
        got, lp = joined[i], choice.logprobs
        assert got["text"] == choice.text and got["tokens"] == lp.tokens and got["text_offset"] == lp.text_offset
        assert got["token_logprobs"][0] is None and got["token_logprobs"][1:] == pytest.approx(lp.token_logprobs[1:],
                                                                                               abs=1e-3)
        assert [sorted(t or {}) for t in got["top_logprobs"]] == [sorted(t or {}) for t in lp.top_logprobs]


def test_completion_top_logprobs_hold_the_chosen_token(client):
    """OpenAI: "the API will always return the logprob of the sampled token, so there may be
    up to logprobs+1 elements"; with ``logprobs: 0`` only that one."""
    resp = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=2, seed=3,
                                     logprobs=1, echo=True)
    lp = resp.choices[0].logprobs
    for token, value, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
        assert top[token] == pytest.approx(value) and 1 <= len(top) <= 2
    zero = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=3, temperature=0, logprobs=0)
    lp = zero.choices[0].logprobs
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs, strict=True)]


def test_async_client_64_concurrent_streams_match_engine(server, engine):
    refs = {q: greedy(engine, chat_prompt(engine, q), 16)["text"] for q in QUESTIONS}

    async def one(client: openai.AsyncOpenAI, q: str) -> str:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": q}], max_tokens=16, temperature=0, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def main() -> list[str]:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
            return await asyncio.gather(*(one(client, QUESTIONS[i % 4]) for i in range(64)))

    outs = asyncio.run(main())
    assert len(outs) == 64
    for i, text in enumerate(outs):
        assert text == refs[QUESTIONS[i % 4]], f"client {i}"


def test_vllm_prompt_logprobs_against_transformers(server, model_dir):
    """vLLM's ``prompt_logprobs`` (was a 400): per prompt token after the first, its logprob,
    rank and text, then the k most likely tokens there; oracle: transformers' own logits."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM

    body = {"model": MODEL, "prompt": "The capital of France is a city called", "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": 3, "return_token_ids": True}
    choice = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    ids, plp = choice["prompt_token_ids"], choice["prompt_logprobs"]
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        rows = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    assert plp[0] is None and len(plp) == len(ids)
    for p in range(1, len(ids)):
        row, tid, entry = rows[p - 1], ids[p], plp[p]
        top = row.topk(3).indices.tolist()
        assert list(entry)[0] == str(tid) and set(entry) == {str(tid), *map(str, top)}
        assert entry[str(tid)]["logprob"] == pytest.approx(row[tid].item(), abs=1e-3)
        want_rank = int((row >= row[tid]).sum())
        assert abs(entry[str(tid)]["rank"] - want_rank) <= max(1, want_rank // 100), (p, entry, want_rank)
        assert [entry[str(t)]["rank"] for t in top if t != tid] == [r for r, t in enumerate(top, 1) if t != tid]


def test_vllm_prompt_logprobs_on_chat_and_their_limits(server):
    import httpx

    from runtime.model_loader import resolve_model_path
    from runtime.tokenizer import Tokenizer

    def post(path: str, **fields) -> httpx.Response:
        return httpx.post(server.url + path, json={"model": MODEL, "max_tokens": 2, **fields}, timeout=60)

    # beside the choices on chat, as vLLM has it; true is 1; a character over several tokens:
    # "" for its parts, the character with its last (so the texts add up to the prompt's)
    chat = post("/v1/chat/completions", messages=[{"role": "user", "content": "Café 🦙?"}], prompt_logprobs=True,
                return_token_ids=True).json()
    ids, plp = chat["prompt_token_ids"], chat["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids) and all(1 <= len(e) <= 2 for e in plp[1:])
    texts = "".join(plp[p][str(ids[p])]["decoded_token"] for p in range(1, len(ids)))
    tok = Tokenizer(resolve_model_path(None))
    assert texts == tok.decode(ids, False)[len(tok.decode(ids[:1], False)):]
    assert "🦙" in texts
    # refused as vLLM refuses them; streamed, only 0 (and none are sent)
    for fields, words in [({"prompt_logprobs": 21}, "greater than max allowed: 20"),
                          ({"prompt_logprobs": -2}, ">= 0 or -1"),
                          ({"prompt_logprobs": 1, "stream": True}, "not available when 'stream' is true")]:
        resp = post("/v1/completions", prompt="Hi", **fields)
        assert resp.status_code == 400 and words in resp.text and resp.json()["error"]["param"] == "prompt_logprobs"
    streamed = post("/v1/completions", prompt="Hi", prompt_logprobs=0, stream=True)
    assert streamed.status_code == 200 and "prompt_logprobs" not in streamed.text
