"""Routes of the OpenAI API, SGLang's server or vLLM's that this server does not have, each
with what to use instead, for the 404 (or 405) a client gets: a bare "Not Found" leaves an
agent framework's user guessing whether the URL, the port or the server is wrong."""

from __future__ import annotations

import re

_TEXT_MODEL = "this server serves a text-generation model"

# (path pattern, why it is absent / what to use); the first match wins
_ABSENT: tuple[tuple[str, str], ...] = (
    (r"/v1/embeddings|/encode|/v1/score|/score|/v1/rerank|/rerank|/v1/classify|/classify|/pooling|/v1/pooling",
     f"{_TEXT_MODEL}; embeddings, scores, reranking and classification need a model of that kind and are not served here"),
    (r"/v1/audio(/.*)?|/v1/images(/.*)?|/v1/videos(/.*)?",
     f"{_TEXT_MODEL} that reads and writes text only"),
    (r"/v1/moderations", "moderation is not served here"),
    (r"/v1/(files|batches|fine_tuning|uploads|vector_stores|assistants|threads|realtime|containers|evals)(/.*)?",
     "this part of the OpenAI platform is not served here; this server generates (/v1/chat/completions, "
     "/v1/completions, /v1/responses)"),
    (r"/v1/chat/completions(/(?!render$)[^/]+(/messages)?)?",
     "chat completions are not stored here ('store' is ignored), so they cannot be listed, read, updated or "
     "deleted; /v1/responses stores what it answers (GET /v1/responses/{id})"),
    (r"/v1/messages(/count_tokens)?",
     "Anthropic's Messages API is not served here; use /v1/chat/completions (or /v1/responses)"),
    (r"/(v1/)?(load|unload)_lora_adapter(_from_tensors)?", "LoRA adapters are not supported by this server"),
    (r"/(update_weights_from_[a-z]+|init_weights_update_group|destroy_weights_update_group|update_weight_version"
     r"|get_weights_by_name|begin_weight_update|end_weight_update|send_weights_to_remote_instance"
     r"|init_weights_send_group_for_remote_instance|release_memory_occupation|resume_memory_occupation"
     r"|pause_generation|continue_generation|weights_checker)",
     "updating or swapping the weights of a running server is not supported; restart it with the new model"),
    (r"/concate_and_append_request", "SGLang's join(mode='concate_and_append') (merging the forks' KV caches) is "
     "not supported by this server; join forks with mode 'gather_variable' (the default): the branches already "
     "share their prefix in the cache"),
    (r"/(open_session|close_session)", "SGLang's sessions are not supported; a prefix shared by requests is "
     "cached without one (and a DSL program's pinned with program_id)"),
    (r"/(start_profile|stop_profile|start_expert_distribution_record|stop_expert_distribution_record"
     r"|dump_expert_distribution_record|set_internal_state|slow_down|freeze_gc|set_trace_level|pd_role_switch"
     r"|dumper/.*|hicache/.*|get_hicache_l3_cache_layout|remote_instance_transfer_engine_info"
     r"|get_remote_instance_transfer_engine_info|add_external_corpus|remove_external_corpus"
     r"|list_external_corpora)",
     "this SGLang server control is not supported by forkserve (GET /get_server_info shows its state)"),
)
_COMPILED = tuple((re.compile(pattern), why) for pattern, why in _ABSENT)


def absent_route_message(method: str, path: str) -> str | None:
    """Why ``method path`` is not served here, for a route another server has; else None."""
    for pattern, why in _COMPILED:
        if pattern.fullmatch(path):
            return f"{method} {path}: {why}"
    return None
