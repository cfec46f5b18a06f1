"""The rest of SGLang's frontend surface, as its programs use it: a failed operation ends
the program without raising (``error()`` says what, ``text()`` keeps what was made), the
program's own exceptions are raised, ``run_batch`` takes argument lists, ``s.copy()``,
``gen(n=...)``, tuples on fork groups, ``var_scope`` streaming, ``flush_cache`` /
``get_server_info``, and clear errors for what a text model cannot take."""

from __future__ import annotations

import re

import pytest

import frontend_lang as sgl

pytestmark = pytest.mark.slow


def test_a_failed_operation_ends_the_program_without_raising(local):
    @sgl.function
    def two(s):
        s += "Count:" + sgl.gen("a", max_tokens=3, ignore_eos=True)
        s += sgl.gen("b", max_tokens=-1)
        s += sgl.gen("c", max_tokens=2)

    state = two.run(temperature=0, backend=local)
    assert isinstance(state.error(), sgl.ProgramError) and re.search(r"gen\('b'\) at .*max_tokens", str(state.error()))
    assert state.text() == "Count:" + state["a"]  # what was made before the failure
    with pytest.raises(KeyError, match="the program failed"):
        state["c"]

    @sgl.function
    def buggy(s):
        s += "Hi"
        return 1 / 0

    with pytest.raises(ZeroDivisionError):  # the program's own code: raised, as SGLang does
        buggy.run(backend=local)


def test_a_streamed_programs_own_exception_is_kept_and_logged(local, caplog):
    @sgl.function
    def buggy(s):
        s += "Hi" + sgl.gen("x", max_tokens=2, ignore_eos=True)
        return {}["nope"]

    state = buggy.run(stream=True, temperature=0, backend=local)
    list(state.text_iter())
    assert isinstance(state.error(), KeyError)
    assert state.text().startswith("Hi") and len(state["x"]) > 0  # what it queued still ran
    assert any("program buggy raised" in r.message for r in caplog.records)


def test_copys_block_raises_its_own_exception(local):
    @sgl.function
    def side(s):
        s += "Q:"
        with s.copy() as t:
            t += sgl.gen("g", max_tokens=-1)
            raise LookupError("the block's own")

    with pytest.raises(LookupError, match="the block's own"):
        side.run(backend=local)


def test_run_batch_takes_argument_lists(local):
    @sgl.function
    def echo(s, word, times):
        s += word * times

    states = echo.run_batch([["ab", 2], ("c", 3)], backend=local)
    assert [st.error() for st in states] == [None, None] and [st.text() for st in states] == ["abab", "ccc"]
    # as in SGLang: the list gives the parameters in order, a bound one keeps its bound value
    assert [st.text() for st in echo.bind(times=1).run_batch([("x", 5)], backend=local)] == ["x"]
    with pytest.raises(TypeError, match="got 3 arguments for parameters word, times"):
        echo.bind(times=1).run_batch([("a", 1, 2)], backend=local)


def test_run_batch_gives_every_dict_key_to_the_program(local):
    """SGLang's rule: a dict is the program's arguments, whatever their names (``n``,
    ``temperature``); the sampling defaults are run_batch's own keywords."""
    @sgl.function
    def story(s, n, temperature="warm"):
        s += f"{n} {temperature}" + sgl.gen("x", max_tokens=2)

    states = story.run_batch([{"n": 5}, {"n": 6, "temperature": "cold"}], backend=local, temperature=0)
    assert [st.error() for st in states] == [None, None]
    assert [st.text()[: -len(st["x"]) or None] for st in states] == ["5 warm", "6 cold"]
    generated = story.run_batch(({"n": k} for k in (1, 2)), backend=local, temperature=0, num_threads=2)
    assert [st.text().split(" ")[0] for st in generated] == ["1", "2"]  # any iterable of them
    with pytest.raises(TypeError, match="got a dict"):
        story.run_batch({"n": 5}, backend=local)
    with pytest.raises(TypeError, match="unexpected keyword argument.*topic.*batch_kwargs"):
        story.run_batch([{"n": 5}], backend=local, topic="x")
    with pytest.raises(ValueError, match="n must be a positive integer"):
        story.run_batch([{"n": 5}], backend=local, n=0)


def test_run_batch_without_a_backend_raises_as_run_does(monkeypatch):
    monkeypatch.setattr("frontend_lang.program._default_backend", None)

    @sgl.function
    def echo(s, word):
        s += word

    with pytest.raises(RuntimeError, match="no backend"):
        echo.run_batch([{"word": "a"}])


def test_run_batch_generator_style_and_the_state_as_sglang_prints_it(local):
    @sgl.function
    def echo(s, word):
        s += sgl.user(word) + sgl.assistant(" " + word)

    states = echo.run_batch([{"word": "a"}, {"word": "b"}], backend=local, generator_style=True)
    assert not isinstance(states, list)
    got = list(states)
    assert [st.messages()[-1] for st in got] == [{"role": "assistant", "content": w} for w in "ab"]  # lstripped
    assert repr(got[0]) == f"ProgramState({got[0].text()})"
    # the text keeps the space: it is what the chat template renders of the turns as written
    assert got[0].text().endswith(" a" + local.role_markers()["assistant"][1])
    early = echo.run_batch([{"word": w} for w in "abcdef"], backend=local, generator_style=True, num_threads=1)
    assert next(early).text() and early.close() is None  # closing it early cancels the rest


def test_copy_is_a_branch_joined_back(local):
    @sgl.function
    def side(s):
        s += "Q: name a colour.\nA:"
        with s.copy() as aside:
            aside += sgl.gen("guess", max_tokens=2, ignore_eos=True)
        s += " Done."

    state = side.run(temperature=0, backend=local)
    assert state.text() == "Q: name a colour.\nA: Done."  # the branch's text stays in the branch
    assert isinstance(state["guess"], list) and len(state["guess"]) == 1


def test_gen_n_keeps_every_sample_and_goes_on_with_the_first(local):
    @sgl.function
    def many(s):
        s += "Pick a number:" + sgl.gen("x", max_tokens=3, n=3, ignore_eos=True, seed=5)

    state = many.run(temperature=1.0, backend=local)
    assert len(state["x"]) == 3 and len(set(state["x"])) > 1
    assert state.text() == "Pick a number:" + state["x"][0]
    assert [m["completion_tokens"] for m in state.get_meta_info("x")] == [3, 3, 3]


def test_fork_groups_take_tuples_and_position_offsets_only_as_none(local):
    @sgl.function
    def branches(s):
        s += "Say"
        forks = s.fork(2, position_ids_offset=None)
        forks += (" one", " two")
        forks.join()
        s["texts"] = [f.text() for f in forks]

    assert branches.run(backend=local)["texts"] == ["Say one", "Say two"]

    @sgl.function
    def offset(s):
        s += "Say"
        s.fork(2, position_ids_offset=[1, 2])

    with pytest.raises(ValueError, match="position_ids_offset is not supported"):
        offset.run(backend=local)


def test_a_var_scope_streams_its_text(local):
    @sgl.function
    def scoped(s):
        with s.var_scope("answer"):
            s += "A:" + sgl.gen("word", max_tokens=3, ignore_eos=True)
        s += " end"

    state = scoped.run(stream=True, temperature=0, backend=local)
    assert "".join(state.text_iter("answer")) == state["answer"] == "A:" + state["word"]


def test_server_helpers_and_what_a_text_model_refuses(local):
    before = sgl.get_default_backend()
    sgl.set_default_backend(local)
    try:
        assert sgl.flush_cache() is True
        info = sgl.get_server_info()
        assert info["model_path"] and "num_running_reqs" in info, sorted(info)
    finally:
        sgl.program._default_backend = before
    with pytest.raises(ValueError, match="images are not supported"):
        sgl.image("cat.png")
    with pytest.raises(ValueError, match="videos are not supported"):
        sgl.video("cat.mp4")
    with pytest.raises(ValueError, match="n must be a positive integer"):
        sgl.gen("x", n=0)
    with pytest.raises(ValueError, match="n > 1"):
        sgl.gen("x", n=2, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert sgl.__version__


# A regex forces the model to write a thought, so the split is known before the run.
THOUGHT, ANSWER = "Two and two make four.", "The answer is 4."
R1_OUTPUT = re.escape(THOUGHT + "</think>" + ANSWER)


@pytest.mark.parametrize("stream", [False, True])
def test_separate_reasoning_moves_the_thought_to_its_own_variable(local, stream):
    @sgl.function
    def think(s):
        s += sgl.user("What is 2 + 2?")
        s += sgl.assistant(sgl.separate_reasoning(sgl.gen("answer", regex=R1_OUTPUT, max_tokens=40),
                                                  model_type="deepseek-r1"))

    state = think.run(temperature=0, stream=stream, backend=local)
    if stream:
        streamed = {name: "".join(state.text_iter(name)) for name in ("answer", "answer_reasoning_content")}
        assert streamed == {"answer": ANSWER, "answer_reasoning_content": THOUGHT}
        assert "".join(state.text_iter()) == state.text()  # the thought is not part of the text
    assert state["answer"] == ANSWER and state["answer_reasoning_content"] == THOUGHT
    assert THOUGHT not in state.text() and ANSWER in state.text()
    assert state.messages()[-1] == {"role": "assistant", "content": ANSWER}


def test_separate_reasoning_streams_the_thought_of_samples_and_scored_gens(local):
    @sgl.function
    def think(s):
        s += "Q:"
        s += sgl.separate_reasoning(sgl.gen("a", regex=R1_OUTPUT, max_tokens=40, return_logprob=True)
                                    + sgl.gen("b", regex=R1_OUTPUT, max_tokens=40, n=2), model_type="deepseek-r1")

    state = think.run(temperature=0, stream=True, backend=local)
    streamed = {name: "".join(state.text_iter(name)) for name in ("a_reasoning_content", "b_reasoning_content")}
    assert streamed == {"a_reasoning_content": THOUGHT, "b_reasoning_content": THOUGHT}
    assert (state["a"], state["b"], state["b_reasoning_content"]) == (ANSWER, [ANSWER, ANSWER], [THOUGHT, THOUGHT])
    assert "".join(state.text_iter()) == state.text() == "Q:" + ANSWER + ANSWER


def test_separate_reasoning_by_qwen3s_rule_and_its_errors(local):
    @sgl.function
    def think(s):
        s += "Q: yes or no?\nA:"
        s += sgl.separate_reasoning(sgl.gen("a", regex=re.escape("<think>hm</think>\n\nYes"), max_tokens=20)
                                    + sgl.gen("b", regex="No", max_tokens=5), model_type="qwen3")

    state = think.run(temperature=0, backend=local)
    assert (state["a"], state["a_reasoning_content"], state["b"], state["b_reasoning_content"]) == ("Yes", "hm", "No", "")
    assert state.text() == "Q: yes or no?\nA:YesNo"
    with pytest.raises(ValueError, match="model_type must be one of deepseek-r1, qwen3"):
        sgl.separate_reasoning(sgl.gen("a"), model_type="gpt-oss")
    with pytest.raises(ValueError, match="needs a name"):
        sgl.separate_reasoning(sgl.gen(), model_type="qwen3")


def test_bind_fixes_arguments_and_run_takes_sglangs_defaults(local):
    @sgl.function
    def say(s, topic, style="plain"):
        s += f"A {style} line about {topic}:" + sgl.gen("line", max_tokens=12, ignore_eos=True)

    assert (say.arg_names, say.arg_defaults) == (["topic", "style"], ["plain"])
    bound = say.bind(style="short")
    state = bound.run(topic="rain", temperature=0, stop_regex=r"\s\w", use_thread=False, backend=local)
    assert state.text().startswith("A short line about rain:")
    alone = say.run(topic="rain", style="short", temperature=0, max_new_tokens=12, backend=local)
    line = alone["line"]
    first_stop = re.search(r"\s\w", line)  # the run-wide stop_regex cut the same greedy line there
    assert first_stop and state["line"] == line[: first_stop.start()]  # (the match trimmed)
    with pytest.raises(TypeError, match="no parameter 'tone'"):
        say.bind(tone="dry")

    @sgl.function
    def outer(s):
        bound(s, topic="snow")  # a bound program called inside another keeps its bound arguments

    assert outer.run(max_new_tokens=2, backend=local).text().startswith("A short line about snow:")


def test_a_runtime_serves_the_program_and_leaves_nothing_behind(local, caplog):
    """sgl.Runtime starts a server of its own: programs on it give the offline engine's
    greedy text, generate / async_generate answer as SGLang's do, shutdown ends every process."""
    import asyncio
    import json

    from tests.proc_utils import pid_alive

    with pytest.raises(TypeError, match="(?s)unknown argument.*mem_fraction_static.*--kv-cache-memory"):  # what to use
        sgl.Runtime(mem_fraction_static=0.8)
    with pytest.raises(ValueError, match="max_total_tokens must be at least 16"):
        sgl.Runtime(max_total_tokens=3)

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=16))

    runtime = sgl.Runtime(dtype="float32", max_total_tokens=20_000, chunked_prefill_size=256, context_length=2048)
    try:
        pids = runtime.endpoint.get_server_info()["process_ids"]
        served = qa.run(question="Name a planet.", temperature=0, backend=runtime)
        assert served.error() is None
        assert served["answer"] == qa.run(question="Name a planet.", temperature=0, backend=local)["answer"]
        out = json.loads(runtime.generate("The capital of France is", {"max_new_tokens": 6, "temperature": 0}))
        assert out["text"] == local.generate("The capital of France is", {"max_new_tokens": 6, "temperature": 0})["text"]

        async def streamed() -> str:
            return "".join([c async for c in runtime.async_generate("The capital of France is",
                                                                     {"max_new_tokens": 6, "temperature": 0})])

        assert asyncio.run(streamed()) == out["text"]
        assert runtime.get_tokenizer().encode("Paris") == local.engine.tokenizer.encode("Paris", add_special_tokens=True)
        refused = json.loads(runtime.generate("Hi", {"max_new_tokens": -1}))  # SGLang's: the error's JSON, no raise
        assert "max_new_tokens" in refused["error"]["message"]
        # SGLang's endpoint arguments: taken; the template name is said to be unused
        endpoint = sgl.RuntimeEndpoint(runtime.url, None, False, "chatml")
        assert qa.run(question="Name a planet.", temperature=0, backend=endpoint)["answer"] == served["answer"]
        assert "chat_template_name='chatml') is not used" in caplog.text
    finally:
        runtime.shutdown()
    runtime.shutdown()  # again: nothing to do
    assert runtime.server.proc.returncode == 0 and "forkserve ready:" in runtime.log, runtime.log
    assert not [name for name, pid in pids.items() if pid_alive(pid)]


def test_cache_prefills_the_fixed_opening_before_the_first_run(local):
    """SGLang's ``prog.cache()``: the text and roles before the first thing that depends on
    an argument or the model are prefilled; the first run then finds them cached."""
    rules = "You are a careful judge. Answer with one number from 1 to 10, nothing else. "

    @sgl.function
    def judged(s, answer):
        s += sgl.system(rules * 2)
        s += sgl.user("Rate this answer: " + answer)
        s += sgl.assistant(sgl.gen("score", max_tokens=3))

    assert sgl.flush_cache(local)
    prefix = judged.cache(local)
    markers = local.role_markers()  # the whole system turn, and the user's up to the argument
    assert prefix.endswith(rules * 2 + markers["system"][1] + markers["user"][0] + "Rate this answer: ")
    state = judged.run(answer="Paris is in France.", temperature=0, backend=local)
    assert state.text().startswith(prefix)
    cached = state.get_meta_info("score")["cached_tokens"]
    assert cached >= len(local.engine.tokenizer.encode(prefix, add_special_tokens=False)) - 1

    @sgl.function
    def by_argument(s, topic):
        s += f"Write about {topic}." + " Use plain words." * 10

    assert by_argument.cache(local) == ""  # the first thing appended depends on the argument
    with pytest.raises(NotImplementedError, match="trace"):
        judged.trace()

    # the text before an argument in one expression, the role forms, a program called inside
    @sgl.function
    def opening(s):
        s += sgl.system(rules)

    @sgl.function
    def mixed(s, question):
        opening(s)
        with s.user():
            s += rules + "Q: " + question + sgl.gen("a", max_tokens=2)

    assert mixed.cache(local).endswith(markers["user"][0] + rules + "Q: ")
    assert mixed.cache(sgl.RuntimeEndpoint.__new__(_NoPrefill)) == ""  # a backend that cannot prefill


class _NoPrefill(sgl.RuntimeEndpoint):  # what cache() asks of a backend that cannot prefill
    can_cache_prefix = False

    def role_markers(self):
        return {"system": ["<s>", "</s>"], "user": ["<u>", "</u>"], "default_system": ""}

    def cache_prefix(self, prompt, program_id=None):
        raise AssertionError("nothing to prefill here")


def test_gen_takes_sglang_positional_order_and_run_takes_n():
    # SGLang's gen(name, max_tokens, min_tokens, n, stop, ...): a program passing them by
    # position must get the same request
    expr = sgl.gen("x", 16, 2, 3, ["\n"])
    assert (expr.sampling["max_new_tokens"], expr.sampling["min_new_tokens"], expr.sampling["n"],
            expr.sampling["stop"]) == (16, 2, 3, ["\n"])
    with pytest.raises(TypeError):  # forkserve's own parameters are keyword-only
        sgl.gen("x", 16, 0, 1, None, None, None, 0.0, 1.0, -1, 0.0, 0.0, 0.0, False, False, -1, 0, False,
                None, None, None, None, None, 1.1)
    as_int = sgl.gen_int("k", 4, 2, "!")  # gen_int(name, max_tokens, n, stop, ...)
    assert (as_int.sampling["max_new_tokens"], as_int.sampling["n"], as_int.sampling["stop"][0]) == (4, 2, "!")
    assert sgl.gen_string("t", 8, temperature=0.5).sampling["temperature"] == 0.5
    with pytest.raises(TypeError):
        sgl.gen_int("k", dtype=str)
    with pytest.raises(AttributeError, match="no backend for other APIs"):
        sgl.OpenAI  # noqa: B018
    with pytest.raises(AttributeError, match="get_default_backend"):
        sgl.global_config  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        sgl.nope  # noqa: B018


def test_run_n_is_every_gens_default_sample_count(local):
    @sgl.function
    def two(s, topic):
        s += f"A word about {topic}:" + sgl.gen("x", max_tokens=2, ignore_eos=True)
        s += " and" + sgl.gen("y", max_tokens=2, ignore_eos=True, n=1)

    state = two.run("cats", n=2, temperature=1.0, backend=local)
    assert isinstance(state["x"], list) and len(state["x"]) == 2  # SGLang's run(n=...)
    assert isinstance(state["y"], str)  # a gen's own n wins
    with pytest.raises(ValueError, match="n must be a positive integer"):
        two.run("cats", n=0, backend=local)
