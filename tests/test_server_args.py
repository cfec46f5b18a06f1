"""``ServerArgs``/``HttpArgs`` refuse wrong types and values with a ValueError naming the
field, and the ``forkserve`` commands turn bad flags into one line, not a traceback."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from runtime.config import ServerArgs
from runtime.ipc import free_tcp_port
from runtime.serve_args import HttpArgs
from tests.proc_utils import pid_alive


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"page_size": "4"}, "page_size"),
        ({"max_running_requests": None}, "max_running_requests"),
        ({"max_total_tokens": 100.5}, "max_total_tokens"),
        ({"model_path": 5}, "model_path"),
        ({"kv_cache_memory": math.nan}, "kv_cache_memory"),
        ({"kv_cache_memory": math.inf}, "kv_cache_memory"),
        ({"disable_radix_cache": "no"}, "disable_radix_cache"),
        ({"tp_size": True}, "tp_size"),
        ({"chunked_prefill_size": 1.5}, "chunked_prefill_size"),
        ({"num_threads": 0}, "num_threads"),
        ({"max_total_tokens": 15}, "max_total_tokens"),
        ({"dtype": "fp32"}, "dtype"),
        ({"dtype": "half"}, "dtype"),
    ],
)
def test_server_args_refuse_wrong_types_and_values(kwargs, field_name):
    with pytest.raises(ValueError, match=rf"^{field_name} "):
        ServerArgs(**kwargs)


def test_dtype_takes_sglang_and_vllm_names():
    """``--dtype float`` is float32 on both; ``half`` / ``float16`` say why not (argparse's
    'invalid choice' did not)."""
    assert ServerArgs(dtype="float").dtype == "float32"
    with pytest.raises(ValueError, match="float16 .*not supported.*bfloat16"):
        ServerArgs(dtype="float16")


def test_the_prefill_chunk_default_follows_dtype_and_device():
    """256 prompt tokens per step for float32 on a CPU (a 512-token float32 step is ~1 s on
    a 2-core AVX2 machine), 512 for bfloat16 and on CUDA; a given size, or -1, is kept."""
    assert ServerArgs(device="cpu", dtype="float32").resolved_chunked_prefill_size == 256
    assert ServerArgs(device="cpu", dtype="bfloat16").resolved_chunked_prefill_size == 512
    assert ServerArgs(device="cuda", dtype="float32").resolved_chunked_prefill_size == 512
    assert ServerArgs(device="cpu", dtype="float32", chunked_prefill_size=1024).resolved_chunked_prefill_size == 1024
    assert ServerArgs(device="cpu", dtype="float32", chunked_prefill_size=-1).resolved_chunked_prefill_size == -1
    with pytest.raises(ValueError, match="chunked_prefill_size"):
        ServerArgs(chunked_prefill_size=0)


def test_http_args_refuse_a_non_positive_startup_timeout():
    with pytest.raises(ValueError, match="startup_timeout"):
        HttpArgs(startup_timeout=0)
    assert ServerArgs(kv_cache_memory=2, max_total_tokens=None).kv_cache_memory == 2  # an int is a number


def _forkserve(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *argv], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["generate", "--page-size", "0", "hi"], 2, "--page-size must be at least 1"),
        (["generate", "--num-threads", "-3", "hi"], 2, "--num-threads must be at least 1"),
        (["generate", "--model-path", "/nonexistent/model", "hi"], 1, "/nonexistent/model"),
        (["generate", "--kv-cache-memory", "1e-9", "hi"], 1, "--kv-cache-memory 1e-09 GiB holds 0 tokens"),
        (["generate", "--temperature", "-1", "hi"], 2, "--temperature must be a number"),
        (["generate", ""], 2, "a prompt is empty"),  # before the model loads
        (["generate", "-", "-"], 2, "given more than once"),  # stdin would be read for both
        (["serve", "--startup-timeout", "0"], 2, "--startup-timeout must be positive"),
        (["serve", "--grammar-compile-timeout", "-1"], 2, "--grammar-compile-timeout must be positive"),
        (["serve", "--log-stats-interval", "0"], 2, "--log-stats-interval must be positive"),
        (["serve", "--kv-cache-memory", "1e-9"], 1, "--kv-cache-memory 1e-09 GiB holds 0 tokens"),
        (["capacity", "--usable-fraction", "3"], 2, "argument --usable-fraction: must be in (0, 1]"),
        (["capacity", "--concurrent-programs", "0"], 2, "argument --concurrent-programs: must be at least 1"),
        (["capacity", "--device-memory", "0"], 2, "argument --device-memory: must be a positive number"),
        (["capacity", "--shared-prefix-tokens", "-1"], 2, "argument --shared-prefix-tokens: must be at least 0"),
        (["capacity", "--context-tokens", "100", "--shared-prefix-tokens", "100"], 2,
         "--context-tokens must exceed --shared-prefix-tokens"),
        (["capacity", "--max-total-tokens", "3"], 2, "argument --max-total-tokens: must be at least 16, got 3"),
        (["capacity", "--max-total-tokens", "0"], 2, "argument --max-total-tokens: must be at least 16, got 0"),
        (["serve", "--max-total-tokens", "0"], 2, "--max-total-tokens must be at least 16"),
        (["serve", "--response-store", "/nonexistent/dir/r.sqlite"], 1, "--response-store /nonexistent/dir"),
        (["bench", "--concurrency", "0"], 2, "must be at least 1"),
        (["bench", "--request-rate", "0"], 2, "argument --request-rate: must be a positive number"),
        (["serve", "--api-key", ""], 2, "--api-key is empty"),
        (["serve", "--served-model-name", ""], 2, "--served-model-name is empty"),
        (["serve", "--served-model-name", "smol", "/tmp"], 2, "took '/tmp', a model path, as a name"),
        (["serve", "--served-model-name", "smol", "./no/such/model"], 2, "a model path, as a name"),
        (["generate", "--kv-cache-memory", "100000", "hi"], 1, "more than the"),  # before allocating it
        (["capacity", "--model-path", "/nonexistent/model"], 1, "/nonexistent/model"),
        (["serve", "--model-path", "/m", "/other"], 2, "the model is given twice"),
    ],
)
def test_bad_flags_are_one_line_errors(argv, code, words, capsys):
    """Exit 1: the command as a process (it loads a model or starts a server). Exit 2, refused
    before anything loads: in this process, ~0.5 s less each (the command line as a process
    is checked by the exit-1 cases and the tests below)."""
    if code == 1:
        done = _forkserve(*argv)
        returncode, stderr = done.returncode, done.stderr
    else:
        from runtime.cli import main

        try:
            returncode = main(argv)
        except SystemExit as exit_:  # argparse's own refusals
            returncode = exit_.code
        stderr = capsys.readouterr().err
        assert "model loaded" not in stderr
    assert returncode == code, stderr
    assert words in stderr and "Traceback" not in stderr, stderr


def test_errors_name_flags_not_words_or_paths():
    from runtime.arg_fields import field_names, fields_as_flags
    from runtime.serve_args import DataParallelArgs

    names = field_names(ServerArgs, HttpArgs, DataParallelArgs)
    assert fields_as_flags("kv_cache_memory 1 GiB holds 0 tokens; raise max_total_tokens.", names) == (
        "--kv-cache-memory 1 GiB holds 0 tokens; raise --max-total-tokens.")
    assert fields_as_flags("device 'cuda' was asked for, but torch finds no CUDA device", names) == (
        "--device 'cuda' was asked for, but torch finds no CUDA device")
    path = "model path '/srv/port/device/max_total_tokens.d' is neither a folder nor a file"
    assert fields_as_flags(path, names) == path


def test_version():
    from importlib.metadata import version

    done = _forkserve("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"forkserve {version('forkserve')}"


def test_a_child_exits_when_its_parent_dies_even_while_blocked(tmp_path):
    """``ipc.exit_with_parent``: the grandchild blocks in a sleep (as a rank blocks joining
    its process group); killing its parent must end it within seconds, not leave an orphan,
    and not leave the socket file of the endpoint it bound either."""
    endpoint = f"ipc://{tmp_path}/rank-1"
    script = textwrap.dedent(f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import os, time, zmq; from runtime import ipc; "
            "ipc.exit_with_parent(os.getppid(), 0.1, endpoints=['{endpoint}']); "
            "ipc.bind(zmq.Context(), zmq.PULL, '{endpoint}'); time.sleep(600)"])
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    grandchild = int(parent.stdout.readline())
    socket_file = tmp_path / "rank-1"
    deadline = time.monotonic() + 30
    while not socket_file.exists() and time.monotonic() < deadline:  # the watch thread runs before the bind
        time.sleep(0.1)
    assert socket_file.exists()
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while pid_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = pid_alive(grandchild)
    if alive:
        os.kill(grandchild, signal.SIGKILL)
    assert not alive
    assert not socket_file.exists()


def test_sglang_and_vllm_flag_names_are_aliases():
    """Flags as SGLang's and vLLM's users type them set the same fields."""
    from runtime.cli import build_parser

    ns = build_parser().parse_args(["serve", "--model", "/m", "--context-length", "64", "--max-num-seqs", "3",
                                    "--tensor-parallel-size", "2", "--data-parallel-size", "2"])
    assert (ns.model_path, ns.max_context_len, ns.max_running_requests, ns.tp_size, ns.dp_size) == ("/m", 64, 3, 2, 2)
    assert build_parser().parse_args(["serve", "--max-model-len", "128"]).max_context_len == 128


def _report_sigint_ignored(out: Any) -> None:
    out.put(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)


def test_the_servers_children_ignore_ctrl_c_from_their_start():
    """A terminal's Ctrl-C reaches the whole process group: a child still importing torch
    printed a KeyboardInterrupt traceback. Started inside ``children_ignore_sigint``, it
    ignores SIGINT from its first instruction; the parent's own handler comes back."""
    import multiprocessing

    from runtime import ipc

    before = signal.getsignal(signal.SIGINT)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    with ipc.children_ignore_sigint():
        child = ctx.Process(target=_report_sigint_ignored, args=(out,))
        child.start()
    try:
        assert out.get(timeout=120) is True
    finally:
        child.join(30)
    assert signal.getsignal(signal.SIGINT) is before


def test_an_unknown_flag_gets_its_commands_usage_and_the_name_it_has_here():
    """``forkserve serve --mem-fraction-static 0.8`` (SGLang's flag): serve's usage, not the
    top level's, and what to give instead."""
    done = _forkserve("serve", "--mem-fraction-static", "0.8", "--bogus")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "usage: forkserve serve" in done.stderr and "unrecognized arguments: --mem-fraction-static" in done.stderr
    assert "--mem-fraction-static: give the KV pool in GiB with --kv-cache-memory" in done.stderr


def test_a_broken_model_folder_or_template_is_one_line_before_anything_starts(tmp_path):
    from runtime.model_loader import resolve_model_path

    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / "config.json").write_text("{bad")
    (bad_json / "model.safetensors").symlink_to(resolve_model_path(None) / "model.safetensors")
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).symlink_to(resolve_model_path(None) / name)
    template = tmp_path / "bad.jinja"
    template.write_text("{% for m in messages %}{{ m.content }")
    not_gguf = tmp_path / "fake.gguf"
    not_gguf.write_bytes(b"not a model")
    for argv, words in [
        (["serve", "--model-path", str(bad_json), "--port", "30197"], "config.json is not valid JSON"),
        (["serve", "--model-path", str(no_tokenizer), "--port", "30197"], "tokenizer"),
        (["serve", "--chat-template", str(template), "--port", "30197"], "not a valid Jinja template: unexpected '}'"),
        (["capacity", "--model-path", str(not_gguf)], "is not a GGUF file"),
    ]:
        done = _forkserve(*argv)
        assert done.returncode == 1 and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "dequantizing" not in done.stderr, done.stderr


def test_ctrl_c_in_generate_is_one_line_and_exit_130():
    """Ctrl-C while generating (here: counting to 2,000, which takes a while)."""
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "generate", "--max-new-tokens", "4000",
                             "Count from 1 to 2000: 1, 2, 3, 4,"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    line = ""
    while "model loaded" not in line and time.monotonic() < deadline:
        line = proc.stderr.readline()
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "forkserve: interrupted" in err and "Traceback" not in err, err


def test_ctrl_c_while_the_command_line_is_built_is_one_line_and_exit_130(monkeypatch, capsys):
    """The first ~0.3 s of a command that is not built in imports the registered subcommands."""
    from runtime import cli

    def interrupted(sub):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_add_registered_commands", interrupted)
    assert cli.main(["capacity"]) == 130
    assert capsys.readouterr().err == "forkserve: interrupted\n"


def test_ctrl_c_before_serve_is_ready_says_so_and_exits_130():
    """While the model loads (the ready line, and with it 'shut down' and exit 0, come later)."""
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--port", str(free_tcp_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "forkserve ready" not in out, out
    # 130, or death by SIGINT (what a shell shows as 130 too): CPython ends so, after the
    # handler has run, when the interrupt landed in code an extension module ran through
    # PyRun_String; a clean clone's first run (slow imports) ended so once.
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err)
    assert "forkserve: interrupted before the server was ready" in err, err
    assert "Traceback" not in err, err


def test_foreign_flag_hints_cover_vllm_spellings_and_never_a_flag_of_ours():
    import argparse

    from runtime.cli import build_parser
    from runtime.cli_foreign_flags import FOREIGN_FLAGS, hints

    assert hints(["--trust_remote_code", "--enforce-eager=1", "--bogus"]) == [
        f"  --trust-remote-code: {FOREIGN_FLAGS['--trust-remote-code']}",
        f"  --enforce-eager: {FOREIGN_FLAGS['--enforce-eager']}",
    ]
    parser = build_parser()
    serve = next(action.choices["serve"] for action in parser._actions  # noqa: SLF001
                 if isinstance(action, argparse._SubParsersAction))
    ours = {opt for a in serve._actions for opt in a.option_strings}  # noqa: SLF001
    assert not ours & set(FOREIGN_FLAGS), "a hint names a flag serve takes"


def test_engine_keywords_of_other_servers_get_the_same_hints():
    from runtime.cli_foreign_flags import FOREIGN_FLAGS
    from runtime.config import ServerArgs

    with pytest.raises(TypeError) as err:
        ServerArgs.from_kwargs(mem_fraction_static=0.8, no_such_thing=1)
    assert "unknown server argument(s): mem_fraction_static, no_such_thing" in str(err.value)
    assert FOREIGN_FLAGS["--mem-fraction-static"] in str(err.value)
    with pytest.raises(TypeError) as err:
        ServerArgs.from_kwargs(no_such_thing=1)
    assert str(err.value) == "unknown server argument(s): no_such_thing"


def test_generate_reads_a_prompt_from_standard_input():
    done = subprocess.run([sys.executable, "-m", "runtime.cli", "generate", "-", "--max-new-tokens", "2", "--json"],
                          input="The capital of France is", capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    import json

    assert json.loads(done.stdout.splitlines()[0])["meta_info"]["prompt_tokens"] >= 5  # not the one token of '-'


@pytest.mark.slow
def test_generate_prints_one_answer_alone_and_several_under_their_prompts(engine):
    """One prompt: its answer and nothing else on stdout, as `$(forkserve generate ...)` and
    pipes want it (a '### prompt' heading came first); several: each under its prompt."""
    prompts = ["The capital of France is", "Two plus two is"]
    want = [o["text"] for o in engine.generate(prompts, {"max_new_tokens": 4, "temperature": 0})]
    flags = ["--dtype", "float32", "--max-new-tokens", "4", "--temperature", "0"]
    one = subprocess.run([sys.executable, "-m", "runtime.cli", "generate", prompts[0], *flags],
                         capture_output=True, text=True, timeout=180)
    assert one.returncode == 0, one.stderr
    assert one.stdout == want[0] + "\n"
    both = subprocess.run([sys.executable, "-m", "runtime.cli", "generate", *prompts, *flags],
                          capture_output=True, text=True, timeout=180)
    assert both.returncode == 0, both.stderr
    assert both.stdout == "".join(f"### {p}\n{w}\n" for p, w in zip(prompts, want, strict=True))



def test_the_start_up_line_names_the_settings_that_change_what_to_expect():
    from runtime.server.launch import describe_engine

    info = {"dtype": "bfloat16", "device": "cpu", "attention_backend": "cpu", "attention_kernel": None,
            "num_threads": 2, "max_total_tokens": 46603, "max_context_len": 8192, "chunked_prefill_size": 512, "gemm": "F.linear",
            "elementwise": None}
    plain = describe_engine(info, ServerArgs())
    assert plain == ("bfloat16 on cpu, attention backend cpu, 2 compute threads, KV pool 46,603 tokens, "
                     "context 8,192 tokens, prefill chunks of 512 tokens, F.linear")
    assert ", prefill steps of any size, " in describe_engine({**info, "chunked_prefill_size": -1}, ServerArgs())
    assert ", KV pool 46,603 tokens, weights 0.75 GiB, context " in describe_engine(
        {**info, "weight_bytes": 3 * 2**28}, ServerArgs())
    both = describe_engine(info, ServerArgs(tp_size=2, disable_radix_cache=True))
    assert "on cpu, tensor parallel over 2," in both and both.endswith(", radix cache off (no prefix reuse)")


def test_a_built_in_command_does_not_import_the_registered_ones():
    """``forkserve serve`` and ``generate`` start ~0.3 s sooner without importing the
    commands other packages register (``bench``, ``capacity``), which ``--help`` still lists."""
    code = textwrap.dedent("""
        import contextlib, sys
        from runtime import cli
        with contextlib.redirect_stdout(None), contextlib.suppress(SystemExit):
            cli.main(["serve", "--help"])
        print(sorted(m for m in ("bench_agent.cli", "runtime.capacity_cli") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
    listed = _forkserve("--help")
    assert listed.returncode == 0 and "bench" in listed.stdout and "capacity" in listed.stdout, listed.stdout


@pytest.mark.parametrize(("argv", "first", "second"), [
    (["serve", "--max-model-len", "1024", "--context-length", "2048"], "--max-model-len", "--context-length"),
    (["serve", "--tp", "2", "--tensor-parallel-size=1"], "--tp", "--tensor-parallel-size"),
    (["generate", "Hi", "--context-length", "64", "--max-model-len", "64"], "--context-length", "--max-model-len"),
    (["serve", "--max-model", "1024", "--context-length", "2048"], "--max-model", "--context-length"),  # abbreviated
])
def test_two_spellings_of_one_setting_are_refused(argv, first, second, capsys):
    """argparse keeps the last of an option's aliases silently (a context of 2,048 where the
    first flag said 1,024); as the model given both ways, a clear error instead."""
    from runtime.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert f"{first} and {second} set the same thing" in capsys.readouterr().err


def test_an_option_repeated_in_one_spelling_is_left_to_argparse():
    from runtime.cli import build_parser, one_setting_spelled_twice

    generate = build_parser(registered=False).commands["generate"]
    assert one_setting_spelled_twice(generate, ["Hi", "--stop", "a", "--stop", "b", "--max-new-tokens", "3"]) is None
    assert one_setting_spelled_twice(generate, ["--max-model-len", "32", "--", "--context-length"]) is None  # a value
