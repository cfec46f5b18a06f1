"""The raw baseline: transformers in-process, one request at a time.

Each ``gen`` tokenizes the program's text with the model's own tokenizer and runs
``model.generate`` on it alone (no batching, no cache kept between calls), which is what a
script calling transformers directly does. Requests from concurrent programs or fork
branches queue on one lock. Tokens are streamed out of ``generate`` through a streamer so
time to first token and inter-token gaps are measured like every other driver's.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

from bench_agent.drivers import check_sampling_params
from bench_agent.drivers.streaming import StreamingBackend
from frontend_lang.backend.base import BackendError
from runtime.config import ServerArgs
from runtime.executor.worker import TORCH_DTYPES
from runtime.model_loader.default_model import resolve_model_path
from runtime.tokenizer import Tokenizer

_DONE = object()


class _QueueStreamer(BaseStreamer):
    """Hands each new token id to the consuming thread. ``generate`` first puts the prompt."""

    def __init__(self) -> None:
        self.tokens: queue.Queue[Any] = queue.Queue()
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        for tok in value.reshape(-1).tolist():
            self.tokens.put(tok)

    def end(self) -> None:
        self.tokens.put(_DONE)


class HFBackend(StreamingBackend):
    can_cache_prefix = False
    driver_name = "transformers"

    def __init__(self, model_path: str | None = None, dtype: str = "auto") -> None:
        args = ServerArgs(model_path=model_path, dtype=dtype, device="cpu")
        self.dtype = args.resolved_dtype
        folder = resolve_model_path(model_path)
        self.tokenizer = Tokenizer(folder)
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=TORCH_DTYPES[self.dtype]).eval()
        self._one_at_a_time = threading.Lock()

    def role_markers(self) -> dict[str, Any]:
        return self.tokenizer.role_markers()

    def _generate_kwargs(self, params: dict[str, Any]) -> dict[str, Any]:
        check_sampling_params(params, {"max_new_tokens", "temperature", "top_p", "top_k", "ignore_eos"}, "transformers")
        new = int(params.get("max_new_tokens", 128))
        kw: dict[str, Any] = {"max_new_tokens": new, "pad_token_id": self.tokenizer.eos_token_ids[0]}
        if params.get("ignore_eos"):
            # Keep going past EOS without banning it, as servers' ignore_eos does
            # (min_new_tokens would mask EOS and change the greedy tokens).
            kw["eos_token_id"] = None
        temperature = float(params.get("temperature", 1.0))
        if temperature == 0:
            kw["do_sample"] = False
        else:
            kw.update(do_sample=True, temperature=temperature, top_p=float(params.get("top_p", 1.0)))
            if params.get("top_k", -1) > 0:
                kw["top_k"] = int(params["top_k"])
        return kw

    def generate_stream(
        self, prompt: str, sampling_params: dict[str, Any], *, program_id: str | None = None
    ) -> Iterator[dict[str, Any]]:
        kw = self._generate_kwargs(sampling_params)
        ids = self.tokenizer.encode(prompt)
        streamer = _QueueStreamer()
        failure: list[BaseException] = []
        start = time.perf_counter()

        def run() -> None:
            try:
                with self._one_at_a_time, torch.inference_mode():
                    self.model.generate(
                        torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), streamer=streamer, **kw
                    )
            except BaseException as err:  # reported to the caller below
                failure.append(err)
                streamer.end()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        out_ids: list[int] = []
        while (tok := streamer.tokens.get()) is not _DONE:
            out_ids.append(tok)
            yield {"text": self._decode(out_ids), "output_ids": list(out_ids)}
        thread.join()
        if failure:
            raise BackendError(f"transformers generate failed: {failure[0]}") from failure[0]
        yield {
            "text": self._decode(out_ids),
            "output_ids": out_ids,
            "meta_info": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(out_ids),
                "cached_tokens": 0,
                "e2e_latency": time.perf_counter() - start,
            },
        }

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.hf.decode(ids, skip_special_tokens=True)

    def end_program(self, program_id: str) -> None:
        pass
