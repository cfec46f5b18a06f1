"""The benchmark's own pieces, without a model: synthetic text, the OpenAI driver's
message encoding, per-call timing, percentiles and Poisson arrivals."""

from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench_agent.drivers import KVReading
from bench_agent.drivers.openai_chat import ROLE_MARKERS, _request_body, messages_from_text
from bench_agent.metrics import summarise
from bench_agent.recording import CallLog, RecordingBackend
from bench_agent.runner import RunResult, _arrival_offsets, _PeakSampler
from bench_agent.synth import rng_for, text
from bench_agent.workloads import NAMES, get_workload
from frontend_lang.backend.base import Backend, BackendError


def test_synthetic_text_is_deterministic_and_sized():
    assert text(rng_for("a", 0), 200) == text(rng_for("a", 0), 200)
    assert text(rng_for("a", 0), 200) != text(rng_for("a", 1), 200)
    words = len(text(rng_for("b", 3), 1200).split())
    assert 900 <= words <= 1100


@pytest.mark.parametrize("name", NAMES)
def test_program_args_differ_per_program_and_repeat_per_seed(name):
    w = get_workload(name)
    a, b = w.program_args(2, 0, "quick")
    assert a != b
    assert w.program_args(2, 0, "quick") == [a, b]


def _encode(messages: list[dict[str, str]]) -> str:
    out = "".join(ROLE_MARKERS[m["role"]][0] + m["content"] + ROLE_MARKERS[m["role"]][1] for m in messages)
    return out + ROLE_MARKERS["assistant"][0]


@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text()), max_size=6))
def test_messages_round_trip_through_role_markers(pairs):
    messages = [{"role": r, "content": c.replace("\x1e", "")} for r, c in pairs]
    assert messages_from_text(_encode(messages)) == messages


def test_chat_driver_refuses_what_a_chat_api_cannot_do():
    with pytest.raises(BackendError, match="whole assistant turns"):
        messages_from_text(_encode([{"role": "user", "content": "hi"}]) + "Sure,")
    with pytest.raises(BackendError, match="outside a chat role"):
        messages_from_text("loose text" + _encode([{"role": "user", "content": "hi"}]))


def test_chat_driver_sends_a_regex_as_structured_outputs():
    """gen(regex=...) and gen_int over a chat API: vLLM's structured_outputs (forkserve and
    vLLM take it); they were refused."""
    body = _request_body("m", [{"role": "user", "content": "hi"}], {"max_new_tokens": 4, "regex": "[0-9]+"})
    assert body["structured_outputs"] == {"regex": "[0-9]+"}
    with pytest.raises(BackendError, match="gen\\(n=...\\) needs the native API"):
        _request_body("m", [], {"n": 2})


class _Scripted(Backend):
    """Streams chunks of the given token counts with the given pauses (seconds)."""

    def __init__(self, script: list[tuple[float, int]]) -> None:
        self.script = script

    def generate(self, *a, **k):
        raise NotImplementedError

    def generate_stream(self, prompt, sampling_params, *, program_id=None):
        ids: list[int] = []
        for pause, n in self.script:
            time.sleep(pause)
            ids += [0] * n
            yield {"text": "x" * len(ids), "output_ids": list(ids)}
        yield {"text": "x" * len(ids), "output_ids": ids,
               "meta_info": {"prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": len(ids)}}

    def role_markers(self):
        return {}

    def end_program(self, program_id):
        pass


def test_recording_times_first_token_and_gaps():
    log = CallLog()
    RecordingBackend(_Scripted([(0.05, 1), (0.02, 1), (0.04, 2)]), log, 0).generate("p", {"max_new_tokens": 4})
    (rec,) = log.records
    assert rec.first_token - rec.start == pytest.approx(0.05, abs=0.02)
    assert len(rec.itls) == 3  # tokens 2, 3 and 4
    assert rec.itls[0] == pytest.approx(0.02, abs=0.015)
    assert rec.itls[1] == rec.itls[2] == pytest.approx(0.02, abs=0.015)  # a 2-token chunk after 0.04 s
    assert (rec.prompt_tokens, rec.cached_tokens, rec.completion_tokens, rec.max_new_tokens) == (10, 4, 4, 4)
    summary = summarise(RunResult(log.records, [0.2], 1.0, 1))
    assert summary["cache_hit_rate"] == pytest.approx(0.4)
    assert summary["itl_ms_p50"] == pytest.approx(np.percentile([g * 1000 for g in rec.itls], 50))


def test_hit_rate_is_unknown_when_the_server_does_not_say():
    log = CallLog()
    backend = RecordingBackend(_Scripted([(0, 1)]), log, 0)
    backend.generate("p", {"max_new_tokens": 1})
    log.records[0].cached_tokens = None
    assert summarise(RunResult(log.records, [0.1], 1.0, 1))["cache_hit_rate"] is None


def _sampled_peak(readings: list[KVReading | None]) -> float | None:
    """What the sampler keeps of a run too short for any poll: the readings before and after."""
    replies = iter(readings)
    with _PeakSampler(lambda: next(replies), interval=60) as sampler:
        pass
    return sampler.peak


def test_a_run_shorter_than_the_poll_still_has_the_servers_own_peak():
    # Nothing in use at either end; the server's mark rose in between, so the run used that much.
    assert _sampled_peak([KVReading(0.0, 0.0), KVReading(0.0, 0.3)]) == 0.3
    # A mark that did not rise was set by an earlier run: only the polled readings count.
    assert _sampled_peak([KVReading(0.0, 0.5), KVReading(0.1, 0.5)]) == 0.1
    # A server without a mark (another engine's gauge), or a failed first read: polls only.
    assert _sampled_peak([KVReading(0.0), KVReading(0.2)]) == 0.2
    assert _sampled_peak([None, KVReading(0.0, 0.4)]) == 0.0


def test_poisson_arrivals_are_seeded_with_the_right_mean():
    a = _arrival_offsets(4000, 5.0, seed=1)
    assert a == _arrival_offsets(4000, 5.0, seed=1)
    gaps = np.diff(a)
    assert statistics.mean(gaps) == pytest.approx(0.2, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.2, rel=0.1)  # exponential: sd = mean


def test_compare_ratios_put_forkserve_ahead_above_one():
    from bench_agent.compare import ratio_table

    rows = [{"workload": "critique", "programs_per_s": 3.0, "ttft_ms_p50": 100.0},
            {"workload": "critique", "programs_per_s": 2.0, "ttft_ms_p50": 250.0},
            {"workload": "no_reuse", "programs_per_s": 1.0, "ttft_ms_p50": None},
            {"workload": "no_reuse", "programs_per_s": 0.0, "ttft_ms_p50": 10.0}]
    table = ratio_table(rows).splitlines()
    assert table[2] == "| critique | 1.50x | 2.50x |"
    assert table[3] == "| no_reuse | n/a | n/a |"


def test_compare_rounds_give_the_median_ratio_and_each_rounds():
    from bench_agent.compare import ratio_table

    rows = []
    for ours, theirs in ((3.0, 2.0), (1.0, 2.0), (2.0, 1.0)):  # ratios 1.5, 0.5, 2.0
        rows += [{"workload": "tot", "programs_per_s": ours, "ttft_ms_p50": 100.0},
                 {"workload": "tot", "programs_per_s": theirs, "ttft_ms_p50": None}]
    assert ratio_table(rows).splitlines()[2] == "| tot | 1.50x (1.50x, 0.50x, 2.00x) | n/a (n/a, n/a, n/a) |"


def test_compare_rounds_alternate_which_server_goes_first(monkeypatch):
    """Round 1 runs forkserve first, round 2 the other first, and so on; the rows stay in
    (ours, theirs) pairs labelled by round."""
    import argparse

    from bench_agent import compare

    order = []

    def opener(side):  # noqa: ANN001, ANN202
        @contextlib.contextmanager
        def open_side(ns):  # noqa: ANN001, ANN202
            order.append(side)
            yield None, None, side
        return open_side

    monkeypatch.setattr(compare, "open_driver", opener("ours"))
    monkeypatch.setattr(compare, "open_peer", opener("theirs"))
    monkeypatch.setattr(compare, "selected_workloads", lambda ns: [type("W", (), {"name": "tot"})()])
    monkeypatch.setattr(compare, "measure", lambda w, b, ns, d, label, *a: {
        "workload": w.name, "backend": label, "programs_per_s": 1.0, "ttft_ms_p50": 1.0, "errors": 0})
    rows = []
    monkeypatch.setattr(compare, "finish", lambda r, ns, title, extra_markdown: rows.extend(r) or 0)
    ns = argparse.Namespace(concurrency=None, rounds=3, backend="openai", num_programs=None, size="quick",
                            compare="http://x", compare_label=None)
    assert compare.run_compared(ns) == 0
    assert order == ["ours", "theirs", "theirs", "ours", "ours", "theirs"]
    assert [r["backend"] for r in rows] == [f"{side} (round {n})" for n in (1, 2, 3) for side in ("ours", "theirs")]


def test_compare_flags_that_do_not_combine_are_refused(capsys):
    from bench_agent.cli import main as bench_main

    assert bench_main(["--compare-cmd", "true"]) == 1
    assert "--compare-cmd needs --compare" in capsys.readouterr().err
    assert bench_main(["--compare", "http://127.0.0.1:1", "--backend", "hf"]) == 1
    assert "does not combine" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "says"), [
    (["--suite", "quick", "--workload", "tot"], "--workload do not apply"),
    (["--suite", "quick", "--url", "http://127.0.0.1:1", "--backend", "openai"], "--url, --backend do not apply"),
    (["--suite", "quick", "--size", "tiny"], "--size do not apply"),
    (["--suite", "quick", "--model", "/some/model"], "--model do not apply"),
    (["--backend", "hf", "--server-args=--disable-radix-cache"], "--backend hf runs transformers"),
    (["--url", "http://127.0.0.1:1", "--server-args=--disable-radix-cache"], "the server at --url runs with its own"),
    (["--backend", "openai", "--url", "http://127.0.0.1:1", "--dtype", "bfloat16"], "--dtype is transformers'"),
])
def test_flags_a_run_would_ignore_are_refused_before_it_starts(argv, says, capsys):
    """Each of these ran (minutes of work) with the flag silently ignored: a baseline 'without
    the cache' measured with it, a suite that was not the workload asked for."""
    from bench_agent.cli import main as bench_main

    assert bench_main(argv) == 1
    assert says in capsys.readouterr().err


def test_the_compared_server_is_started_in_its_own_group_and_stopped_whole(tmp_path):
    """--compare-cmd's server: waited for on /v1/models, then SIGTERM to its whole process
    group (a child it started goes too); a command that exits early is an error with its output."""
    import os
    import subprocess
    import sys

    from bench_agent.compare import PeerServer
    from runtime.server.server_process import free_tcp_port

    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text('{"data": []}')
    port = free_tcp_port()
    # a shell that starts a static server on the port and a sleeping child, and waits
    cmd = (f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {tmp_path} & "
           f"sleep 300 & wait")
    peer = PeerServer(cmd, f"http://127.0.0.1:{port}/v1").wait_ready(30)
    group = os.getpgid(peer.proc.pid)
    assert group == peer.proc.pid != os.getpgid(0)
    peer.stop(timeout=10)
    left = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True).stdout.split()
    assert left == []
    with pytest.raises(RuntimeError, match="exited with 3"):
        PeerServer("echo starting; exit 3", "http://127.0.0.1:1").wait_ready(30)
    # vLLM's development mode (its /reset_prefix_cache route) is on for the command
    with pytest.raises(RuntimeError, match="dev mode 1"):
        PeerServer('echo "dev mode $VLLM_SERVER_DEV_MODE"; exit 3', "http://127.0.0.1:1").wait_ready(30)


@pytest.mark.parametrize("how", ["timeout", "ctrl-c"])
def test_a_compared_server_that_never_gets_ready_is_stopped_with_its_children(how, monkeypatch):
    """--compare-cmd's server is stopped, its whole process group, when waiting for it ends
    without it ready: the time runs out, or Ctrl-C while it starts (a vLLM takes ~90 s)."""
    import os

    from bench_agent import compare
    from runtime.server.server_process import free_tcp_port

    peer = compare.PeerServer("sleep 300 & sleep 300", f"http://127.0.0.1:{free_tcp_port()}")
    if how == "ctrl-c":
        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(compare.httpx, "get", interrupted)
    with pytest.raises(TimeoutError if how == "timeout" else KeyboardInterrupt):
        peer.wait_ready(timeout=1.5)
    with pytest.raises(ProcessLookupError):
        os.killpg(peer.proc.pid, 0)  # no process of its group is left


def test_the_attention_benchmark_prints_a_row_per_case(capsys):
    from bench_agent import bench_attention

    assert bench_attention.main(["--cached", "0", "30", "--new", "9", "--rounds", "1", "--scattered"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "%" in line]
    assert [row.split("|")[1:3] for row in rows] == [[" 0 ", " 9 "], [" 30 ", " 9 "]]


@pytest.mark.slow
def test_requantize_gguf_writes_the_same_model_in_another_type(tmp_path):
    """``bench_agent/requantize_gguf.py``: the default model's GGUF as Q8_0: every field but
    the file type as in the source, the norms untouched, every other weight Q8_0 and its
    values the source's to within Q8_0's step."""
    import gguf
    import numpy as np

    from bench_agent import requantize_gguf
    from runtime.model_loader.default_model import find_default_gguf

    out = tmp_path / "copy.gguf"
    assert requantize_gguf.main(["--type", "Q8_0", "--out", str(out)]) == 0
    source, copy = gguf.GGUFReader(str(find_default_gguf())), gguf.GGUFReader(str(out))
    assert set(source.fields) == set(copy.fields)
    for name, field in source.fields.items():
        if name == "general.file_type":
            assert copy.fields[name].contents() == gguf.LlamaFileType.MOSTLY_Q8_0.value
        elif not name.startswith("GGUF."):
            assert copy.fields[name].contents() == field.contents(), name
    tensors = {t.name: t for t in copy.tensors}
    assert [t.name for t in source.tensors] == list(tensors)
    for t in source.tensors:
        c = tensors[t.name]
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            assert c.tensor_type == t.tensor_type and np.array_equal(c.data, t.data)
            continue
        assert c.tensor_type == gguf.GGMLQuantizationType.Q8_0
        before, after = gguf.quants.dequantize(t.data, t.tensor_type), gguf.quants.dequantize(c.data, c.tensor_type)
        # half a step, and the step's own rounding to float16 (2^-11 of it) over up to 127 steps
        step = np.abs(before).reshape(before.shape[0], -1, 32).max(-1, keepdims=True) / 127
        assert np.all(np.abs(after - before).reshape(step.shape[0], -1, 32) <= step * (0.5 + 127 * 2**-11)), t.name
    with pytest.raises(SystemExit):
        requantize_gguf.main(["--type", "Q8_0", "--out", str(tmp_path / "copy.bin")])
