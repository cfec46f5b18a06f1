"""The fused Triton elementwise kernels (``kernels/triton/elementwise.py``) against the
PyTorch layers they replace, in Triton's CPU interpreter (``tests/triton_interpreter.py``),
in float32 and bfloat16; then a whole model switched to them against the same model
unswitched. Compiled, they are checked the same way on a GPU by ``tests/gpu``."""

from __future__ import annotations

import pytest
import torch

from tests.triton_interpreter import enter_interpreter, require_interpreted

enter_interpreter()

from kernels.triton import elementwise  # noqa: E402
from tests.elementwise_agreement import (  # noqa: E402
    TRUNCATING,
    check_rms_norm,
    check_rotary_on_views_of_a_fused_projection,
    check_silu_and_mul,
)

require_interpreted(elementwise._rms_norm_kernel)

DTYPES = [torch.float32, torch.bfloat16]
# The interpreter's bfloat16 rounding is toward zero (see TRUNCATING): bfloat16 results are
# checked to within a step here, bit for bit on a GPU.
MIN_EQUAL = TRUNCATING


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 576), (3, 100), (9, 64)])  # 100: a masked block tail
def test_rms_norm_matches_the_layer(rows, hidden, dtype):
    check_rms_norm(elementwise, rows, hidden, dtype, min_equal=MIN_EQUAL)


@pytest.mark.parametrize("dtype", DTYPES)
# 80 and 96: head sizes that are not powers of two (the half block is masked)
@pytest.mark.parametrize("tokens,heads,kv_heads,dim", [(1, 9, 3, 64), (5, 4, 4, 128), (7, 8, 2, 64), (3, 5, 1, 80),
                                                        (2, 3, 3, 96)])
def test_rotary_matches_the_layer_on_views_of_a_fused_projection(tokens, heads, kv_heads, dim, dtype):
    check_rotary_on_views_of_a_fused_projection(elementwise, tokens, heads, kv_heads, dim, dtype, min_equal=MIN_EQUAL)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", [(1, 1536), (3, 100), (2, 2500)])  # 2500: two blocks, the last partial
def test_silu_and_mul_matches_the_layer(rows, width, dtype):
    check_silu_and_mul(elementwise, rows, dtype, width=width, min_equal=MIN_EQUAL)


def test_empty_batches_launch_nothing():
    x = torch.empty(0, 64)
    assert elementwise.rms_norm(x, torch.ones(64), 1e-5).shape == (0, 64)
    assert elementwise.silu_and_mul(torch.empty(0, 8)).shape == (0, 4)
    elementwise.rotary_(torch.empty(0, 2, 8), torch.empty(0, 1, 8), torch.empty(0, dtype=torch.int64),
                        torch.zeros(4, 8), torch.zeros(4, 8))


def test_bad_inputs_are_value_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight"):
        elementwise.rms_norm(x, torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        elementwise.rms_norm(x, torch.ones(8), 1e-5, torch.zeros(2, 7))
    q, k, cos = torch.randn(2, 2, 8), torch.randn(2, 1, 8), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="contiguous"):
        elementwise.rotary_(torch.randn(2, 8, 2).transpose(1, 2), k, torch.tensor([0, 1]), cos, cos)
    with pytest.raises(ValueError, match="fit together"):
        elementwise.rotary_(q, torch.randn(3, 1, 8), torch.tensor([0, 1]), cos, cos)
    with pytest.raises(ValueError, match="tables"):
        elementwise.rotary_(q, k, torch.tensor([0, 1]), cos.double(), cos)
    with pytest.raises(ValueError, match="even"):
        elementwise.rotary_(torch.randn(2, 2, 7), torch.randn(2, 1, 7), torch.tensor([0, 1]), cos[:, :7], cos[:, :7])
    with pytest.raises(ValueError, match="even"):
        elementwise.silu_and_mul(torch.randn(2, 7))


def test_a_model_switched_to_them_generates_the_same(tiny_gqa_llama):
    """A small random Llama in float32 (attention: ``torch_native``), its layers switched to
    the kernels and back: the same greedy tokens, logprobs to float32 rounding, over a
    prefill and decode steps."""
    from runtime.engine import Engine
    from runtime.layers import enable_fused_elementwise

    engine = Engine(str(tiny_gqa_llama), dtype="float32", attention_backend="torch_native", max_total_tokens=512,
                    disable_radix_cache=True)
    params = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
    outs = {}
    try:
        for ops in (elementwise, None):
            assert enable_fused_elementwise(engine.worker.model, ops) == 2 * 3 + 1 + 1
            out = engine.generate(input_ids=[[5, 900, 31, 7000, 12], [44, 3]], sampling_params=params,
                                  return_logprob=True)
            outs[ops] = [(o["output_ids"], [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]]) for o in out]
    finally:
        engine.shutdown()
    for (fused_ids, fused_lps), (plain_ids, plain_lps) in zip(outs[elementwise], outs[None], strict=True):
        assert fused_ids == plain_ids
        torch.testing.assert_close(fused_lps, plain_lps, atol=1e-4, rtol=1e-4)
