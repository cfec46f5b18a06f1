"""The DSL against the in-process engine and a real server: the examples give the same
text on both, fork prefills its prefix once, select agrees with transformers, errors name
the program line, run_batch keeps going past a failed program. Streaming:
``test_frontend_streaming.py``; programs that call tools: ``test_frontend_tool_programs.py``."""

from __future__ import annotations

import re
from typing import Literal

import httpx
import pytest
import torch
from pydantic import BaseModel, Field

import frontend_lang as sgl
from examples.json_extraction import DOCUMENT, TOOLS, extract_and_act
from examples.llm_judge import llm_judge
from examples.react_tool import react
from examples.self_critique import self_critique
from examples.tree_of_thought import tree_of_thought
from frontend_lang.ir import DTYPE_REGEX
from tests.dsl_checks import assert_failed

pytestmark = pytest.mark.slow

# Sized to take each path once (a critique round that does not stop, a fork with a select
# per leaf): these run sequential fp32 decodes twice, in process and over HTTP.
EXAMPLES = [
    (self_critique, {"task": "Explain rain to a child.", "max_rounds": 1, "good_enough": 11}),
    (tree_of_thought, {"question": "How can I sleep better?", "width": 2, "depth": 1}),
    (llm_judge, {"question": "What is 2 + 2?", "answer": "4, because two pairs make four.",
                 "dimensions": ["clarity", "accuracy"]}),
    (react, {"question": "How many people live in the capital of Japan?"}),
    (extract_and_act, {"document": DOCUMENT}),
]


@pytest.mark.parametrize(("program", "kwargs"), EXAMPLES, ids=lambda x: getattr(x, "__name__", ""))
def test_examples_same_text_in_process_and_over_http(program, kwargs, local, remote):
    a = program.run(**kwargs, temperature=0, backend=local)
    b = program.run(**kwargs, temperature=0, backend=remote)
    assert a.text() == b.text()
    assert a.ret_value == b.ret_value
    assert a.messages() == b.messages()
    assert len(a.text()) > 200
    if program is extract_and_act:  # the tools' arguments came back typed
        assert all(isinstance(a[name], model) and a[name] == b[name] for name, model in TOOLS.items())


def test_role_text_matches_the_chat_template(local, engine):
    @sgl.function
    def chat(s):
        s += sgl.user("Hello there")
        s += sgl.assistant("Hi!")
        s += sgl.user("Bye")

    state = chat.run(backend=local)
    assert state.text() == engine.tokenizer.hf.apply_chat_template(state.messages(), tokenize=False)
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant", "user"]


def test_fork_prefills_the_shared_prefix_once(local, engine):
    prefix = "Background: " + " ".join(f"fact {i} is about agents." for i in range(70))

    @sgl.function
    def fan_out(s):
        s += prefix
        branches = s.fork(8)
        branches += lambda i: f"\nBranch {i} says:" + sgl.gen("x", max_tokens=4, ignore_eos=True)
        branches.join()

    engine.flush_cache()
    before = engine.scheduler.num_prefill_tokens
    state = fan_out.run(temperature=0, backend=local)
    prefix_len = len(engine.tokenizer.encode(prefix))
    assert prefix_len >= 400
    metas = state.get_meta_info("x")
    assert all(m["cached_tokens"] >= prefix_len - 1 for m in metas), [m["cached_tokens"] for m in metas]
    computed = engine.scheduler.num_prefill_tokens - before
    assert computed < prefix_len + 8 * 20, computed  # the prefix once, plus each branch's own few tokens


def test_nested_forks(local):
    @sgl.function
    def nested(s):
        s += "Colours:"
        outer = s.fork(2)
        outer += lambda i: f" group {i}:"
        inner = [b.fork(2) for b in outer]
        for grp in inner:
            grp += sgl.gen("c", max_tokens=3, ignore_eos=True)
            grp.join()
        return [[b["c"] for b in grp] for grp in inner]

    out = nested.run(temperature=0, backend=local).ret_value
    assert len(out) == 2 and all(len(g) == 2 and all(isinstance(x, str) for x in g) for g in out)


def test_programs_that_fork_from_the_same_text_run_side_by_side(local):
    """Each program's fork pins the shared text's node: several programs then pin the same
    node, and each releases only its own pin (the engine crashed on the second release)."""
    @sgl.function
    def judge(s, x):
        s += "You are a strict judge. Consider the question carefully and think in two ways."
        f = s.fork(2)
        f += sgl.gen("idea", max_tokens=3, ignore_eos=True)
        f.join()
        s += " Answer " + x + ":" + sgl.gen("final", max_tokens=3, ignore_eos=True)

    states = judge.run_batch([{"x": "one"}, {"x": "two"}, {"x": "three"}], temperature=0, backend=local)
    assert [s.error() for s in states] == [None] * 3
    assert all(len(s["idea"]) == 2 and s["final"] for s in states)
    stats = local.between_steps(local.engine.scheduler.stats)
    assert stats["num_pinned_programs"] == 0 and stats["kv_protected"] == 0


def test_join_gathers_only_what_the_branches_set(local):
    # Like SGLang's gather_variable, the parent's own variables are not turned into lists.
    @sgl.function
    def forked(s):
        s += "Pick a colour:" + sgl.gen("first", max_tokens=2, ignore_eos=True)
        s["note"] = "kept"
        branches = s.fork(2)
        branches += lambda i: f" option {i}:" + sgl.gen("c", max_tokens=2, ignore_eos=True)
        branches[1]["note"] = "changed in a branch"
        branches.join()
        again = s.fork(2)
        again += sgl.gen("d", max_tokens=1, ignore_eos=True)
        again.join()

    state = forked.run(temperature=0, backend=local)
    assert isinstance(state["first"], str) and state["first"]
    assert [len(state["c"]), len(state["d"])] == [2, 2] and all(isinstance(x, str) for x in state["c"] + state["d"])
    assert state["note"] == ["kept", "changed in a branch"]  # set again by one branch: every branch's value
    assert isinstance(state.get_meta_info("first"), dict)
    assert isinstance(state["c"][0], str)  # not nested by the second fork


def test_select_with_nothing_before_it(local):
    @sgl.function
    def first(s):
        s += sgl.select("word", ["Yes, certainly.", "No, never."])

    assert first.run(backend=local)["word"] in ("Yes, certainly.", "No, never.")

    @sgl.function
    def one_token_choices(s):  # with nothing before them, single tokens have no logprob to compare
        s += sgl.select("word", ["zzqx", "The", "Hello"])

    assert_failed(one_token_choices.run(backend=local), "with no text before it, .* cannot be scored")

    @sgl.function
    def merged(s):  # "QA" is one token: the choice is all in the prompt's first token
        s += "Q" + sgl.select("a", ["A", "B"])

    assert_failed(merged.run(backend=local), r"the text before it \('Q'\) and choice 'A' are one token")


def test_sglang_program_idioms(local):
    """What ported SGLang programs write: ``forks[i] += ...``, ``s.user(expr)``, dtype by
    name, ``run_batch`` with argument tuples, ``text_iter`` on a run that did not stream."""
    @sgl.function
    def judged(s, topic):
        s.system("You are terse.")
        s.user(f"Two words about {topic}.")
        forks = s.fork(2)
        for i in range(2):
            forks[i] += sgl.assistant(sgl.gen("idea", max_tokens=3, ignore_eos=True))
        forks.join()
        s += sgl.user("How many?") + sgl.assistant(sgl.gen("n", dtype="int", max_tokens=4))

    states = judged.run_batch([("rain",), ("snow",)], temperature=0, backend=local)
    assert [st.error() for st in states] == [None, None]
    for st in states:
        assert len(st["idea"]) == 2 and re.fullmatch(r"[-+]?[0-9]+[ \n]?", st["n"])
        assert [m["role"] for m in st.messages()][:3] == ["system", "user", "user"]
        assert list(st.text_iter()) == [st.text()] and list(st.text_iter("n")) == [st["n"]]


def test_var_scope_captures_the_text_appended_inside(local):
    @sgl.function
    def scoped(s):
        s += "Q: Name a colour.\n"
        with s.var_scope("answer"):
            s += "A:" + sgl.gen("word", max_tokens=3, ignore_eos=True)
        s += "\nDone."

    state = scoped.run(temperature=0, backend=local)
    assert state["answer"] == "A:" + state["word"]
    assert state.text() == "Q: Name a colour.\n" + state["answer"] + "\nDone."


@pytest.mark.parametrize(("prefix", "choices"), [
    ("Q: Is the sun a star? Answer yes or no.\nA:", [" yes", " no", " maybe not"]),
    # the prefix's space merges into the choices' first tokens, which hold parts of characters
    ("Is the sky blue? Answer: ", ["yes", "是", "🎉", "水"]),
])
def test_select_matches_transformers(local, engine, model_dir, prefix, choices):
    from transformers import AutoModelForCausalLM

    @sgl.function
    def pick(s):
        s += prefix + sgl.select("answer", choices)

    state = pick.run(backend=local)
    meta = state.get_meta_info("answer")
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    tok = engine.tokenizer
    expected = []
    for c in choices:
        ids = tok.encode(prefix + c)
        with torch.no_grad():
            logprobs = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        # the choice's tokens: those whose text reaches past the prefix
        scores, offset = [], 0
        for pos in range(1, len(ids)):
            offset = len(tok.decode(ids[: pos + 1], skip_special_tokens=False))
            if offset > len(prefix):
                scores.append(logprobs[pos - 1, ids[pos]].item())
        expected.append(sum(scores) / len(scores))
    assert meta["normalized_prompt_logprobs"] == pytest.approx(expected, abs=1e-3)
    assert state["answer"] == choices[max(range(len(choices)), key=lambda i: expected[i])]
    # SGLang's raw lists too: each choice's prompt logprobs as /generate returns them
    assert [len(x) for x in meta["output_token_logprobs"]] == [0] * len(choices)
    for lps, per in zip(meta["input_token_logprobs"], meta["choice_token_logprobs"], strict=True):
        assert [t[0] for t in lps[-len(per):]] == per and all(len(t) == 3 for t in lps)


def test_errors_name_the_operation_and_line(local, server):
    @sgl.function
    def bad(s):
        s += "Hello" + sgl.gen("x", max_tokens=-5)

    assert_failed(bad.run(backend=local), r"gen\('x'\) at .*test_frontend_lang.py:\d+: .*max_tokens=-5.*max_new_tokens")

    down = sgl.RuntimeEndpoint(server.url)
    down.client = httpx.Client(base_url="http://127.0.0.1:9", timeout=5)  # nothing listens there

    @sgl.function
    def ok(s):
        s += "Hi" + sgl.gen("y", max_tokens=2)

    assert_failed(ok.run(backend=down), r"gen\('y'\) at .*cannot reach")
    with pytest.raises(ValueError, match="one of json_schema and dtype"):
        sgl.gen("z", json_schema={"type": "integer"}, dtype=int)
    with pytest.warns(UserWarning, match="only dtype"):  # SGLang's rule: dtype wins
        assert sgl.gen("z", regex="[a-z]+", dtype=int).sampling["regex"] == DTYPE_REGEX[int]
    with pytest.raises(ValueError, match="not a valid regular expression"):  # at gen(), as SGLang compiles it
        sgl.gen("z", regex="[0-9")


class Pet(BaseModel):
    name: str = Field(max_length=12)
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)


@pytest.mark.parametrize("which", ["local", "remote"])
def test_constrained_gen_and_computed_variables(which, request):
    @sgl.function
    def form(s):
        s += sgl.user("Invent a pet and describe it as JSON.")
        s += sgl.assistant(sgl.gen("pet", json_schema=Pet, max_tokens=60))
        s += sgl.user("How many legs does it have?")
        s += sgl.assistant(sgl.gen("legs", dtype=int, max_tokens=6))
        s += sgl.user("Give me a date.")
        s += sgl.assistant(sgl.gen("date", regex=r"20\d\d-[01]\d-[0-3]\d", max_tokens=12))
        s["pet_obj"] = Pet.model_validate_json(s["pet"])
        s += sgl.user("Is it friendly?") + sgl.assistant(sgl.select("friendly", ["yes", "no"],
                                                                     choices_method=sgl.greedy_token_selection))
        s += sgl.user("How heavy is it, in kilograms?") + sgl.assistant(sgl.gen("weight", dtype=float, max_tokens=8))
        s += sgl.user("Is it awake now?") + sgl.assistant(sgl.gen("awake", dtype=bool, max_tokens=4))
        s += sgl.user("What is its name?") + sgl.assistant(sgl.gen("name", dtype=str, max_tokens=24))

    state = form.run(temperature=0, backend=request.getfixturevalue(which))
    assert isinstance(state["pet_obj"], Pet)
    assert re.fullmatch(r"[-+]?[0-9]+", state["legs"])
    assert re.fullmatch(r"20\d\d-[01]\d-[0-3]\d", state["date"])
    assert state["friendly"] in ("yes", "no")
    assert state.get_meta_info("friendly")["choices_method"] == "greedy_token_selection"
    assert re.fullmatch(r"[-+]?([0-9]+(\.[0-9]+)?|\.[0-9]+)", state["weight"]), state["weight"]  # SGLang's also takes .5
    assert state["awake"] in ("True", "False")
    # the whole quoted string, spaces included (only numbers end at a space)
    assert re.fullmatch(DTYPE_REGEX[str], state["name"]), (state["name"], state.get_meta_info("name")["finish_reason"])


def test_a_str_dtype_holds_spaces(local):
    """Only numbers end at a space (SGLang adds those stops for int and float alone): a
    quoted string runs to its closing quote, spaces and all."""
    @sgl.function
    def quote(s):
        s += sgl.user('Repeat exactly, in double quotes: "I like green apples"')
        s += sgl.assistant(sgl.gen("q", dtype=str, max_tokens=24))

    state = quote.run(temperature=0, backend=local)
    assert re.fullmatch(DTYPE_REGEX[str], state["q"]) and " " in state["q"], state["q"]


def test_unconditional_likelihood_normalized_select(local):
    @sgl.function
    def pick(s):
        s += "Q: What colour is the sky on a clear day?\nA:" + sgl.select(
            "c", [" blue", " green", " purple"], choices_method=sgl.unconditional_likelihood_normalized)

    meta = pick.run(backend=local).get_meta_info("c")
    cond, uncond = meta["choice_token_logprobs"], meta["unconditional_token_logprobs"]
    scores = [sum(c) / len(c) - (sum(u) / len(u) if u else 0.0) for c, u in zip(cond, uncond, strict=True)]
    assert meta["scores"] == pytest.approx(scores)
    assert pick.run(backend=local)["c"] == [" blue", " green", " purple"][max(range(3), key=lambda i: scores[i])]


def test_run_batch_reports_errors_per_program(local):
    @sgl.function
    def maybe(s, count):
        s += f"Count to {count}:" + sgl.gen("out", max_tokens=count, ignore_eos=True)

    states = maybe.run_batch([{"count": 3}, {"count": -1}, {"count": 5}], temperature=0, backend=local,
                             progress_bar=True)
    assert states[0].error() is None and states[2].error() is None
    assert isinstance(states[1].error(), sgl.ProgramError)
    assert states[0].get_meta_info("out")["completion_tokens"] == 3
    assert states[2].get_meta_info("out")["completion_tokens"] == 5
    assert states[1].text() == "Count to -1:"  # the text so far, as SGLang gives it


def test_run_batch_keeps_what_a_program_that_raised_had_made(local):
    @sgl.function
    def raises_after_a_gen(s, fail):
        s += "Say hi:" + sgl.gen("a", max_tokens=2, ignore_eos=True)
        if fail and s["a"] is not None:
            raise RuntimeError("the program's own bug")
        s += "!"

    states = raises_after_a_gen.run_batch([{"fail": False}, {"fail": True}], temperature=0, backend=local)
    assert states[0].error() is None and states[0].text() == "Say hi:" + states[0]["a"] + "!"
    assert isinstance(states[1].error(), RuntimeError)
    assert states[1]["a"] == states[0]["a"] and states[1].text() == "Say hi:" + states[1]["a"]
    with pytest.raises(RuntimeError, match="own bug"):  # run() raises it
        raises_after_a_gen.run(fail=True, temperature=0, backend=local)


def test_program_pins_survive_memory_pressure(model_dir):
    """With pinning, a program's prefix survives other traffic filling the cache."""
    # ~190 context tokens, then three ~425-token documents: more than the pool holds beside
    # the context, so without the pin the context is evicted (it is the least recently used).
    backend = sgl.EngineBackend(model_path=str(model_dir), dtype="float32", max_total_tokens=700)
    context = "Notes: " + " ".join(f"item {i} matters." for i in range(30))
    noise = [f"Unrelated document {k}: " + " ".join(f"word{k}x{i}" for i in range(75)) for k in range(3)]

    @sgl.function
    def two_calls(s):
        s += context + sgl.gen("a", max_tokens=2, ignore_eos=True)
        s.sync()  # the first call is done (and pinned) before the other traffic starts
        for text in noise:  # other traffic between the program's calls
            backend.generate(text, {"max_new_tokens": 1})
        s += "\nAgain:" + sgl.gen("b", max_tokens=2, ignore_eos=True)

    try:
        pinned = two_calls.run(temperature=0, backend=backend)
        backend.flush_cache()
        unpinned = two_calls.run(temperature=0, backend=backend, pin_cache=False)
        context_len = len(backend.engine.tokenizer.encode(context))
        assert pinned.get_meta_info("b")["cached_tokens"] >= context_len
        assert unpinned.get_meta_info("b")["cached_tokens"] < context_len // 2
        assert backend.between_steps(lambda: backend.engine.scheduler.stats())["num_pinned_programs"] == 0
        backend.between_steps(backend.engine.scheduler.check_invariants)
    finally:
        backend.shutdown()


@pytest.mark.parametrize("example", ["self_critique", "tree_of_thought", "llm_judge", "json_extraction"])
def test_examples_a_chat_api_cannot_run_refuse_openai_up_front(example):
    """They need select's prompt logprobs or write inside a turn; over an OpenAI chat API they
    failed part-way (or printed None and exited 0). Refused before any server is reached."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", f"examples.{example}", "--url", "http://127.0.0.1:9", "--openai"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot run with --openai" in done.stderr, done.stderr


@pytest.mark.parametrize("openai", [False, True])
def test_an_example_against_no_server_says_so_in_one_line(openai):
    import subprocess
    import sys

    flags = ["--url", "http://127.0.0.1:9", *(["--openai"] if openai else [])]
    done = subprocess.run([sys.executable, "-m", "examples.react_tool", *flags], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith("react_tool.py: cannot reach http://127.0.0.1:9"), done.stderr
