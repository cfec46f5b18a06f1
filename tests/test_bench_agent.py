"""The agent benchmark suite at tiny sizes: every workload on every driver runs without
errors and makes the calls it should; the metrics are present and sane (hit rate 0 with
the radix cache off, > 0 with it on); the drivers agree with each other on the text."""

from __future__ import annotations

import json

import pytest

import frontend_lang as sgl
from bench_agent.cli import main as bench_main
from bench_agent.drivers import kv_probe_for_engine, kv_probe_for_url
from bench_agent.drivers.openai_chat import OpenAIChatBackend
from bench_agent.metrics import summarise
from bench_agent.runner import run_workload
from bench_agent.workloads import NAMES, get_workload
from tests.dsl_checks import CountingEndpoint, pinned_programs, wait_until_idle
from tests.tool_call_ids import same_ids

pytestmark = pytest.mark.slow

N = 2  # programs per run


def run_tiny(name, backend, probe=None, concurrency=N, n=N, **kw):
    workload = get_workload(name)
    result = run_workload(workload, backend, workload.program_args(n, 0, "tiny"), concurrency=concurrency,
                          kv_probe=probe, progress=False, **kw)
    return workload, result, summarise(result)


def check_counts(workload, result, summary):
    n = result.num_programs
    assert result.errors == []
    assert summary["programs_ok"] == n
    assert summary["gen_calls"] == n * workload.gen_calls(workload.sizes("tiny"))
    gens = [r for r in result.records if r.kind == "gen"]
    if workload.fixed_lengths:
        assert all(r.completion_tokens == r.max_new_tokens > 0 for r in gens), "fixed output lengths"
        assert summary["short_calls"] == 0
        assert summary["output_tokens"] == sum(r.max_new_tokens for r in gens)
    else:  # each output ends with its grammar, within max_tokens
        assert all(0 < r.completion_tokens <= r.max_new_tokens for r in gens)
    assert all(r.first_token is not None and r.start < r.first_token <= r.end for r in gens)
    assert summary["ttft_ms_p50"] > 0 and summary["itl_ms_p50"] > 0
    assert summary["ttft_ms_p50"] <= summary["ttft_ms_p99"]
    assert summary["programs_per_s"] > 0 and summary["output_tok_per_s"] > 0


@pytest.mark.parametrize("name", NAMES)
def test_every_workload_in_process(name, local):
    local.flush_cache()
    workload, result, summary = run_tiny(name, local, kv_probe_for_engine(local))
    check_counts(workload, result, summary)
    if name == "no_reuse":
        # Only the chat template's default system turn can be shared, and only when one
        # program's prompt is cached before the other's is scheduled: timing decides.
        assert 0 <= summary["cache_hit_rate"] < 0.5
    else:
        assert 0 < summary["cache_hit_rate"] < 1
    assert 0 < summary["peak_kv_usage"] <= 1
    forks = name in ("tree_of_thought", "judge", "extract")
    assert (summary["prefill_calls"] > 0) == forks, "only forks send their prefix ahead"


def test_hit_rate_is_zero_with_the_cache_off(model_dir):
    backend = sgl.EngineBackend(model_path=str(model_dir), dtype="float32", max_total_tokens=8000,
                                disable_radix_cache=True)
    try:
        for name in ("critique", "tree_of_thought"):
            workload, result, summary = run_tiny(name, backend, n=1)
            check_counts(workload, result, summary)
            assert summary["cache_hit_rate"] == 0
    finally:
        backend.shutdown()


@pytest.mark.parametrize("name", NAMES)
def test_every_workload_on_a_live_server(name, server):
    """The DSL driver (native API) and the OpenAI chat driver against the same server give
    the same text, call for call, and both see the cache working."""
    dsl = sgl.RuntimeEndpoint(server.url)
    chat = OpenAIChatBackend(server.url)
    try:
        texts = {}
        for label, backend in (("dsl", dsl), ("openai", chat)):
            workload, result, summary = run_tiny(name, backend, kv_probe_for_url(server.url), concurrency=1)
            check_counts(workload, result, summary)
            assert summary["cache_hit_rate"] > 0
            assert summary["peak_kv_usage"] is not None
            # (the DSL also lists the template's default system turn; the chat API adds it unseen)
            texts[label] = [same_ids([m for m in state.messages() if m["role"] != "system" or name != "no_reuse"])
                            for state in result.states]
        assert texts["dsl"] == texts["openai"]
        if name == "react":  # through real tool calls: a call per step, its result as a tool message
            for messages in texts["openai"]:
                assert [m["role"] for m in messages].count("tool") == workload.sizes("tiny")["steps"]
                assert all(len(m["tool_calls"]) == 1 for m in messages if m.get("tool_calls"))
    finally:
        dsl.shutdown()
        chat.shutdown()


def test_the_react_workload_runs_tool_calls_through_the_openai_api(server, tmp_path, capsys):
    """``forkserve bench --workload react --backend openai``: the tool-calling agent runs to
    the end over the chat API."""
    code = bench_main(["--backend", "openai", "--url", server.url, "--size", "tiny", "--workload", "react",
                       "--output-dir", str(tmp_path), "--no-progress", "--no-plot"])
    assert code == 0
    (row,) = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert row["workload"] == "react" and row["errors"] == 0 and row["programs_ok"] == N


def test_the_openai_driver_holds_gen_int_to_its_regex(server):
    import re

    from frontend_lang.ir import DTYPE_REGEX

    @sgl.function
    def count(s):
        s += sgl.user("How many legs does a spider have? Answer with a number.")
        s += sgl.assistant(sgl.gen_int("n", max_tokens=6))

    chat = OpenAIChatBackend(server.url)
    try:
        state = count.run(temperature=0, backend=chat)
    finally:
        chat.shutdown()
    assert state.error() is None and re.fullmatch(DTYPE_REGEX[int] + r"[ \n]?", state["n"]), state["n"]


def test_the_openai_driver_empties_the_servers_cache_before_each_run(server, tmp_path, capsys):
    """Two runs of one program through ``--backend openai --url`` on one server see the same
    hit rate: the cache is emptied after the warm-up (``/flush_cache``), as the DSL driver
    does, instead of the second run finding the first one's prompts."""
    rates = []
    for run in range(2):
        out = tmp_path / str(run)
        code = bench_main(["--backend", "openai", "--url", server.url, "--size", "tiny", "--workload", "critique",
                           "--num-programs", "1", "--output-dir", str(out), "--no-progress", "--no-plot"])
        assert code == 0
        (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        rates.append(row["cache_hit_rate"])
    assert rates[0] == rates[1] < 0.9, rates
    assert "could not empty" not in capsys.readouterr().err


def test_a_server_without_a_flush_route_is_not_flushed():
    """The OpenAI driver tries /flush_cache, then vLLM's /reset_prefix_cache, and says False
    when neither answers 200 (measure then names the server on stderr)."""
    import http.server
    import threading

    paths = []

    class NoFlush(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (the standard library's name)
            paths.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoFlush)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    backend = OpenAIChatBackend(f"http://127.0.0.1:{httpd.server_address[1]}", model="any")
    try:
        assert backend.flush_cache() is False
        assert paths == ["/flush_cache", "/reset_prefix_cache"]
    finally:
        backend.shutdown()
        httpd.shutdown()


def test_bench_tools_baseline_is_the_same_calls_without_tools(server):
    """bench_tools' baseline: each tool call again with the same messages, no tools, held to
    the tool call's output length (measure checks the token counts match)."""
    from bench_agent.bench_tools import measure, without_tools

    result = measure(server.url, ["Paris"], warm_up=False)
    assert result["calls"] >= 1 and result["tokens"] > 0 and result["ratio"] > 0
    (calls,) = result["conversations"]
    assert calls and calls[0][0]["tool_choice"] == "required" and calls[0][0]["tools"]
    for body, tokens in calls:
        plain = without_tools(body, tokens)
        assert plain["messages"] == body["messages"] and not {"tools", "tool_choice"} & plain.keys()
        assert plain["max_tokens"] == tokens > 0 and plain["ignore_eos"] is True


def test_transformers_driver_matches_the_engine(local):
    """Greedy, fp32: the raw baseline and forkserve produce the same conversation."""
    from bench_agent.drivers.hf import HFBackend

    hf = HFBackend(dtype="float32")
    for name in ("critique", "tree_of_thought"):
        workload, result, summary = run_tiny(name, hf, n=1)
        check_counts(workload, result, summary)
        assert summary["cache_hit_rate"] == 0
        (args,) = workload.program_args(1, 0, "tiny")
        ours = workload.program.run(**args, backend=local, temperature=0, ignore_eos=True)
        assert ours.messages() == result.states[0].messages()
    workload = get_workload("react")
    result = run_workload(workload, hf, workload.program_args(1, 0, "tiny"), concurrency=1, progress=False)
    assert len(result.errors) == 1 and "transformers driver cannot run gens with tools" in result.errors[0]


def test_request_rate_mode(local):
    workload, result, summary = run_tiny("no_reuse", local, concurrency=None, request_rate=50.0)
    check_counts(workload, result, summary)


def test_cli_writes_table_jsonl_and_plot(tmp_path, capsys):
    code = bench_main(["--in-process", "--server-args=--dtype float32 --max-total-tokens 4000", "--size", "tiny",
                       "--workload", "critique", "--workload", "no_reuse", "--output-dir", str(tmp_path),
                       "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "| critique | dsl in-process" in out and "| no_reuse |" in out
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["workload"] for r in rows] == ["critique", "no_reuse"]
    assert all(r["errors"] == 0 and r["programs"] == 2 for r in rows)
    assert (tmp_path / "bench.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "table.md").exists()


def test_a_workload_whose_warm_up_fails_is_not_measured(server, tmp_path, capsys):
    """A wrong --model: the warm-up's 404 said so, then every measured program failed the
    same way and a table and plot of nothing were written. Now the workload is skipped with
    the warm-up's error, and a run with nothing measured writes nothing and fails."""
    code = bench_main(["--backend", "openai", "--url", server.url, "--model", "no-such-model", "--size", "tiny",
                       "--workload", "critique", "--workload", "no_reuse", "--output-dir", str(tmp_path),
                       "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("the warm-up program failed, so it was not measured") == 2 and "no-such-model" in err, err
    assert not (tmp_path / "results.jsonl").exists() and not (tmp_path / "bench.png").exists()


def test_cli_rejects_contradictory_flags(capsys):
    assert bench_main(["--backend", "hf", "--url", "http://127.0.0.1:1"]) == 1
    assert "--url and --in-process do not apply" in capsys.readouterr().err
    assert bench_main(["--in-process", "--url", "http://127.0.0.1:1"]) == 1  # --url was ignored
    assert "give one of them" in capsys.readouterr().err
    assert bench_main(["--in-process", "--model", "/nonexist"]) == 1  # the default model was measured
    assert "--model applies to --backend openai" in capsys.readouterr().err


def test_compare_runs_each_workload_on_both_servers_one_at_a_time(tmp_path, capsys, tiny_gqa_llama):
    """--compare with --compare-cmd: forkserve (a fresh local server) and then the other
    server (started by the command, here a second forkserve on the tiny model) run the same
    programs; the table has both rows and their ratios, and the other server is gone after."""
    from runtime.server.server_process import free_tcp_port

    port = free_tcp_port()
    other = f"http://127.0.0.1:{port}"
    cmd = f"exec python -m runtime.cli serve --port {port} --model-path {tiny_gqa_llama} --max-total-tokens 4000"
    code = bench_main(["--backend", "openai", f"--server-args=--model-path {tiny_gqa_llama} --max-total-tokens 4000",
                       "--size", "tiny", "--workload", "critique", "--output-dir", str(tmp_path), "--no-progress",
                       "--no-plot", "--compare", other, "--compare-cmd", cmd, "--compare-label", "other"])
    assert code == 0
    out = capsys.readouterr().out
    assert "| critique | openai @ local forkserve" in out and "| critique | other |" in out
    assert "| workload | forkserve / other programs/s | other / forkserve TTFT p50 |" in out
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["backend"] for r in rows] == [rows[0]["backend"], "other"]
    assert all(r["errors"] == 0 and r["programs_ok"] == 2 and r["short_calls"] == 0 for r in rows)
    import httpx

    with pytest.raises(httpx.HTTPError):
        httpx.get(other + "/v1/models", timeout=2)


def test_ctrl_c_stops_a_benchmark_run_and_its_programs(server, ctrl_c):
    """Ctrl-C waited for every program of the run (the pool's exit): the README promises
    'forkserve: interrupted' at once."""
    import signal

    main = ctrl_c

    def ctrl_c_at_the_twelfth(sent: int) -> None:  # Ctrl-C once a dozen gens have gone out
        if sent == 12:
            signal.pthread_kill(main, signal.SIGINT)

    workload = get_workload("critique")
    backend = CountingEndpoint(server.url, ctrl_c_at_the_twelfth)
    args = workload.program_args(32, 0, "quick")
    with pytest.raises(KeyboardInterrupt):
        run_workload(workload, backend, args, concurrency=8, progress=False)
    sent = backend.sent
    wait_until_idle(server.url)
    assert backend.sent == sent < 32 * workload.gen_calls(workload.sizes("quick")) / 4  # nothing more was sent
    assert pinned_programs(server.url) == 0


def test_bench_fairness_sends_calls_while_the_batch_runs(server):
    import argparse

    from bench_agent.bench_fairness import measure

    ns = argparse.Namespace(batch=150, batch_tokens=16, calls=2, interval=0.3)
    result = measure(server.url, ns)
    assert len(result["ttfts"]) >= 1 and all(t > 0 for t in result["ttfts"]) and result["batch_s"] > 0
