"""A backend whose every request is a stream; ``generate`` returns the stream's last chunk."""

from __future__ import annotations

from typing import Any

from frontend_lang.backend.base import Backend, BackendError


class StreamingBackend(Backend):
    driver_name = "this"

    def generate(self, prompt: Any, sampling_params: dict[str, Any], **kw: Any) -> Any:
        if kw.get("return_logprob"):
            raise BackendError(f"the {self.driver_name} driver does not return logprobs (select() needs them)")
        if isinstance(prompt, list):  # one by one: a streamed request carries one prompt
            return [self.generate(p, sampling_params, **kw) for p in prompt]
        out: dict[str, Any] = {}
        for out in self.generate_stream(prompt, sampling_params, program_id=kw.get("program_id")):  # noqa: B007
            pass
        return out
