"""``forkserve serve --dp-size N`` before anything starts: how threads and the KV pool are
split, the replicas' and the gateway's command lines, and the error without the gateway.
(The processes themselves: ``test_data_parallel.py``.)"""

from __future__ import annotations

import argparse
import dataclasses
import signal

import pytest

from runtime.arg_fields import add_cli_args, args_from_namespace, cli_flags
from runtime.config import ServerArgs
from runtime.serve_args import DataParallelArgs, HttpArgs
from runtime.server import data_parallel, dp_launcher
from runtime.server.data_parallel import PlanError, gateway_command, local_url, plan_replicas


@pytest.fixture(autouse=True)
def _memory_unknown(monkeypatch):
    """Plans do not depend on this machine's free memory, unless a test says how much there is."""
    monkeypatch.setattr(data_parallel, "available_memory_bytes", lambda: None)


def _parse(flags: list[str], cls: type) -> object:
    parser = argparse.ArgumentParser()
    add_cli_args(parser, cls)
    return args_from_namespace(parser.parse_args(flags), cls)


@pytest.mark.parametrize("args", [
    ServerArgs(),
    ServerArgs(dtype="float32", max_total_tokens=4000, disable_radix_cache=True, enable_jump_forward=False,
               kv_cache_memory=0.25, attention_backend="torch_native", num_threads=3),
])
def test_cli_flags_rebuild_the_same_args(args):
    assert _parse(cli_flags(args), ServerArgs) == args
    http = HttpArgs(port=1234, api_key="k", served_model_name="m", stream_cumulative_logprobs=True)
    assert _parse(cli_flags(http), HttpArgs) == http


def test_threads_and_kv_tokens_are_split_between_replicas():
    replicas = plan_replicas(ServerArgs(num_threads=8, max_total_tokens=10_001), HttpArgs(port=80, host="0.0.0.0"),
                             DataParallelArgs(dp_size=3), [7001, 7002, 7003])
    assert [r.args.num_threads for r in replicas] == [3, 3, 2]  # every thread used
    assert [r.args.max_total_tokens for r in replicas] == [3333] * 3
    assert [r.url for r in replicas] == ["http://127.0.0.1:7001", "http://127.0.0.1:7002", "http://127.0.0.1:7003"]
    # every other flag is the user's, and the replica's command line carries them
    assert dataclasses.replace(replicas[2].args, num_threads=8, max_total_tokens=10_001) == \
        ServerArgs(num_threads=8, max_total_tokens=10_001)
    command = replicas[1].command(parent_pid=42)
    assert command[command.index("--port") + 1] == "7002" and "--dp-size" not in command
    assert command[command.index("--max-total-tokens") + 1] == "3333"


def test_kv_memory_is_split_and_one_thread_is_the_least():
    replicas = plan_replicas(ServerArgs(num_threads=1, kv_cache_memory=2.0), HttpArgs(), DataParallelArgs(dp_size=4),
                             [1, 2, 3, 4])
    assert {r.args.kv_cache_memory for r in replicas} == {0.5}
    assert {r.args.num_threads for r in replicas} == {1}  # more replicas than threads: they share cores
    assert data_parallel.thread_shares(3, 2) == [2, 1] and data_parallel.thread_shares(2, 2) == [1, 1]
    with pytest.raises(PlanError, match="at least"):
        plan_replicas(ServerArgs(max_total_tokens=40), HttpArgs(), DataParallelArgs(dp_size=4), [1, 2, 3, 4])


def test_the_replicas_weights_count_against_the_memory_available(monkeypatch):
    """Each replica loads the weights: N copies of them beside the pool must fit (the default
    model's weights are 0.30 GiB in bfloat16 on a CPU: 0.25 of parameters, and its tied
    output layer packed beside the embedding)."""
    args, dp = ServerArgs(kv_cache_memory=2.0, dtype="bfloat16", device="cpu"), DataParallelArgs(dp_size=4)
    monkeypatch.setattr(data_parallel, "available_memory_bytes", lambda: int(2.5 * 2**30))
    with pytest.raises(PlanError, match="4 copies of the 0.30 GiB of weights"):
        plan_replicas(args, HttpArgs(), dp, [1, 2, 3, 4])
    monkeypatch.setattr(data_parallel, "available_memory_bytes", lambda: int(3.5 * 2**30))
    assert len(plan_replicas(args, HttpArgs(), dp, [1, 2, 3, 4])) == 4


def test_gateway_command_puts_the_users_router_args_last():
    replicas = plan_replicas(ServerArgs(), HttpArgs(), DataParallelArgs(dp_size=2), [5001, 5002])
    dp = DataParallelArgs(dp_size=2, router_policy="round_robin", router_args="--cache-threshold 0.5 --policy random")
    cmd = gateway_command(replicas, HttpArgs(host="0.0.0.0", port=8000, api_key="k"), dp, 9100, parent_pid=1)
    at = cmd.index("--worker-urls")
    assert cmd[at + 1:at + 3] == ["http://127.0.0.1:5001", "http://127.0.0.1:5002"]
    assert cmd[cmd.index("--policy") + 1] == "round_robin" and cmd[-2:] == ["--policy", "random"]
    assert cmd[cmd.index("--port") + 1] == "8000" and cmd[cmd.index("--prometheus-port") + 1] == "9100"
    assert cmd[cmd.index("--api-key") + 1] == "k"
    assert "--balance-abs-threshold" not in cmd  # round_robin has no thresholds
    # replicas' 503s when full (load shedding) must not shut them out of the gateway, unless
    # the user configures the breaker
    assert "--disable-circuit-breaker" in cmd
    configured = DataParallelArgs(dp_size=2, router_args="--cb-failure-threshold 50")
    assert "--disable-circuit-breaker" not in gateway_command(replicas, HttpArgs(), configured, 9100, parent_pid=1)
    cache_aware = gateway_command(replicas, HttpArgs(), DataParallelArgs(dp_size=2), 9100, parent_pid=1)
    abs_threshold, rel_threshold = data_parallel.GATEWAY_BALANCE
    assert cache_aware[cache_aware.index("--balance-abs-threshold") + 1] == str(abs_threshold)
    assert cache_aware[cache_aware.index("--balance-rel-threshold") + 1] == str(rel_threshold)
    assert local_url("0.0.0.0", 8000) == "http://127.0.0.1:8000" and local_url("::", 1) == "http://[::1]:1"


def test_the_gateway_checks_that_replicas_generate_and_waits_longer_than_that_check():
    """/health alone stayed 200 on a replica whose scheduler hung; /health_generate answers
    within its probe's limit, which the gateway's timeout must exceed (else a busy replica,
    answering late but well, is marked unhealthy)."""
    import inspect

    from runtime.server.http_server import probe_generate

    replicas = plan_replicas(ServerArgs(), HttpArgs(), DataParallelArgs(dp_size=2), [5001, 5002])
    cmd = gateway_command(replicas, HttpArgs(), DataParallelArgs(dp_size=2), 9100, parent_pid=1)
    assert cmd[cmd.index("--health-check-endpoint") + 1] == "/health_generate"
    probe_limit = inspect.signature(probe_generate).parameters["timeout"].default
    assert float(cmd[cmd.index("--health-check-timeout-secs") + 1]) > probe_limit


def test_bad_values_name_the_flag():
    with pytest.raises(ValueError, match="dp_size"):
        DataParallelArgs(dp_size=0)
    with pytest.raises(ValueError, match="router_policy"):
        DataParallelArgs(router_policy="random")


def test_without_the_gateway_dp_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setattr(dp_launcher, "gateway_installed", lambda: False)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = dp_launcher.serve_data_parallel(ServerArgs(), HttpArgs(port=1), DataParallelArgs(dp_size=2))
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    err = capsys.readouterr().err
    assert code == 1 and data_parallel.INSTALL_HINT in err and "--dp-size 2" in err


def test_router_args_the_gateway_refuses_are_one_line_before_anything_starts():
    with pytest.raises(ValueError, match="router_args cannot be split into flags: No closing quotation"):
        DataParallelArgs(dp_size=2, router_args="'--unclosed")
    pytest.importorskip("sglang_router")
    data_parallel.check_router_args("--cache-threshold 0.5")
    with pytest.raises(ValueError, match="the gateway refuses them: unrecognized arguments: --no-such-flag 3"):
        data_parallel.check_router_args("--no-such-flag 3")
