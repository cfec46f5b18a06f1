"""What SGLang's and vLLM's flags that forkserve does not take are called here, or why none
is needed: shown under argparse's "unrecognized arguments" error, so a command carried over
from either server says what to type instead."""

from __future__ import annotations

_KV_SIZE = "give the KV pool in GiB with --kv-cache-memory, or in tokens with --max-total-tokens " \
           "('forkserve capacity' prints what fits)"
FOREIGN_FLAGS = {
    "--mem-fraction-static": _KV_SIZE,
    "--gpu-memory-utilization": _KV_SIZE,
    "--max-num-batched-tokens": "--chunked-prefill-size caps the prompt tokens one step prefills",
    "--seed": "the server's default sampling seed is --random-seed",
    "--uvicorn-log-level": "the HTTP server's log level is --log-level-http",
    "--disable-log-requests": "requests are logged only with --log-requests (off by default)",
    "--enable-log-requests": "--log-requests",
    "--enable-metrics": "/metrics is always served (nothing to enable)",
    "--enable-prefix-caching": "the radix prefix cache is always on (--disable-radix-cache turns it off)",
    "--trust-remote-code": "models run on forkserve's own code for their architecture; no remote code is run",
    "--tokenizer": "the tokenizer is read from the model folder (or the GGUF file)",
    "--tokenizer-path": "the tokenizer is read from the model folder (or the GGUF file)",
    "--quantization": "quantized weights are not served; a GGUF file is dequantized once at load",
    "--kv-cache-dtype": "the KV cache has the model's --dtype",
    "--enable-auto-tool-choice": "tool calls are parsed whenever a request has tools (--tool-call-parser picks the format)",
    "--max-tokens": "a request's output length here is --max-new-tokens (generate) or the request's own max_tokens",
    "--no-enable-prefix-caching": "--disable-radix-cache",
    "--disable-prefix-caching": "--disable-radix-cache",
    "--enforce-eager": "--disable-cuda-graph",
    "--block-size": "--page-size",
    "--max-prefill-tokens": "--chunked-prefill-size caps the prompt tokens one step prefills",
    "--enable-mixed-chunk": "decodes ride along with prefill chunks by default (--disable-mixed-chunk turns it off)",
    "--enable-chunked-prefill": "prompts are prefilled in chunks of --chunked-prefill-size by default",
    "--disable-log-stats": "the scheduler's periodic activity line is logged at info: --log-level warning hides it "
                           "(--log-stats-interval sets how often it comes)",
    "--grammar-backend": "the grammar engine (xgrammar or llguidance) is chosen per constraint; nothing to set",
    "--guided-decoding-backend": "the grammar engine (xgrammar or llguidance) is chosen per constraint; nothing to set",
    "--download-dir": "nothing is downloaded: give a local model folder or .gguf file",
    "--revision": "nothing is downloaded: give a local model folder or .gguf file",
    "--load-format": "the weights' format is read from the model folder (safetensors) or the .gguf file",
    "--pipeline-parallel-size": "pipeline parallelism is not supported; --tp-size splits a model over devices",
    "-pp": "pipeline parallelism is not supported; --tp-size splits a model over devices",
    "-tp": "--tp-size (or --tp)",
    "--pp-size": "pipeline parallelism is not supported; --tp-size splits a model over devices",
    "--enable-torch-compile": "the CPU kernels are compiled C++ and CUDA decode uses CUDA graphs; there is no torch.compile mode",
    "--logprobs-mode": "logprobs are the model's own log-probabilities (under a grammar's mask), before temperature, "
                       "penalties, logit_bias and the sampling filters (vLLM's default, raw_logprobs); no other mode "
                       "is offered",
    "--swap-space": "a request that runs out of KV is sent back to the queue and recomputed, not swapped",
}


def hints(unrecognized: list[str]) -> list[str]:
    """One line for each flag among ``unrecognized`` (``--flag`` or ``--flag=value``) that
    SGLang or vLLM has: what to use here."""
    out = []
    for arg in unrecognized:
        flag = arg.split("=", 1)[0].replace("_", "-")  # vLLM takes --trust_remote_code too
        if flag in FOREIGN_FLAGS:
            out.append(f"  {flag}: {FOREIGN_FLAGS[flag]}")
    return out
