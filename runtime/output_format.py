"""The logprob part of a ``/generate`` result, shared by the offline engine and the server."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def logprob_meta(
    input_token_logprobs: Sequence[tuple[float | None, int]],
    input_top_logprobs: Sequence[Any],
    output_token_logprobs: Sequence[tuple[float, int]],
    output_top_logprobs: Sequence[Any],
    id_to_text: Callable[[int], str] | None,
    num_output_logprobs: int | None = None,
) -> dict[str, Any]:
    """SGLang's ``[logprob, token_id, text | None]`` triples; text only when ``id_to_text``
    is given (``return_text_in_logprobs``). ``output_token_logprobs_length`` is SGLang's count
    of all the output's logprobs so far (``num_output_logprobs``; a stream's events carry only
    the new ones), by default those given. The prompt's first reported token (the one at
    ``logprob_start_len``) has a null logprob, as on SGLang."""

    def triple(lp: float | None, tid: int) -> list[Any]:
        return [lp, tid, id_to_text(tid) if id_to_text is not None else None]

    def tops(entries: Sequence[Any]) -> list[Any]:
        return [None if e is None else [triple(lp, t) for lp, t in e] for e in entries]

    return {
        "input_token_logprobs": [triple(lp, t) for lp, t in input_token_logprobs],
        "output_token_logprobs": [triple(lp, t) for lp, t in output_token_logprobs],
        "input_top_logprobs": tops(input_top_logprobs),
        "output_top_logprobs": tops(output_top_logprobs),
        "output_token_logprobs_length": len(output_token_logprobs) if num_output_logprobs is None
        else num_output_logprobs,
    }
