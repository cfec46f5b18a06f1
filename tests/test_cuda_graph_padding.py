"""The CPU-checkable half of decode CUDA graphs: which batch sizes are captured, which
graph a batch replays, and how it is padded. (Capture and replay are checked on a GPU by
``tests/gpu/test_gpu_cuda_graph.py``.)"""

from __future__ import annotations

import pytest
import torch

from runtime.config import ServerArgs
from runtime.executor.cuda_graph_runner import (
    capture_batch_sizes,
    pad_decode_batch,
    padded_batch_size,
)


def test_capture_sizes_ladder():
    assert capture_batch_sizes(1) == [1]
    assert capture_batch_sizes(3) == [1, 2, 3]
    assert capture_batch_sizes(8) == [1, 2, 4, 8]
    assert capture_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_batch_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    sizes = capture_batch_sizes(160)
    assert sizes[sizes.index(64) + 1 :] == [80, 96, 112, 128, 144, 160]
    assert sizes == sorted(set(sizes))
    with pytest.raises(ValueError):
        capture_batch_sizes(0)


@pytest.mark.parametrize("max_bs", [1, 5, 8, 33, 64, 100, 256])
def test_every_batch_pads_to_the_smallest_size_that_holds_it(max_bs):
    sizes = capture_batch_sizes(max_bs)
    for bs in range(1, max_bs + 1):
        size = padded_batch_size(bs, sizes)
        assert size is not None and size >= bs
        assert not [s for s in sizes if bs <= s < size]
    assert padded_batch_size(max_bs + 1, sizes) is None


def test_padding_appends_dummy_requests():
    rows = torch.tensor([5, 2, 7])
    batch = pad_decode_batch(
        rows, [10, 0, 3], torch.tensor([11, 12, 13]), torch.tensor([100, 200, 300]),
        torch.tensor([10, 0, 3]), padded_size=5, dummy_row=64,
    )
    assert batch.req_rows.tolist() == [5, 2, 7, 64, 64]
    assert batch.prefix_lens == [10, 0, 3, 0, 0]  # dummies attend to their own token only
    assert batch.out_cache_loc.tolist() == [11, 12, 13, 0, 0]  # the reserved padding slot
    assert batch.input_ids.tolist() == [100, 200, 300, 0, 0]
    assert batch.positions.tolist() == [10, 0, 3, 0, 0]
    with pytest.raises(ValueError):
        pad_decode_batch(rows, [1, 2, 3], rows, rows, rows, padded_size=2, dummy_row=64)


def test_graph_flags():
    assert ServerArgs().disable_cuda_graph is False
    assert ServerArgs(max_running_requests=48).resolved_cuda_graph_max_bs == 48
    assert ServerArgs(max_running_requests=1000).resolved_cuda_graph_max_bs == 256
    assert ServerArgs(cuda_graph_max_bs=16).resolved_cuda_graph_max_bs == 16
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        ServerArgs(cuda_graph_max_bs=0)


def test_graph_flags_on_the_cli():
    import argparse

    from runtime.arg_fields import add_cli_args, args_from_namespace

    parser = argparse.ArgumentParser()
    add_cli_args(parser, ServerArgs)
    args = args_from_namespace(parser.parse_args(["--disable-cuda-graph", "--cuda-graph-max-bs", "32"]), ServerArgs)
    assert args.disable_cuda_graph and args.cuda_graph_max_bs == 32
