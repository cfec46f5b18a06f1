"""Every field the installed ``openai`` client can send is a field of our request models, so a
field OpenAI adds shows up here (and is then implemented, accepted as harmless, or refused
with a 400 naming it) instead of passing unnoticed as an unknown field. The oracle is the
client's own typed request parameters, not a list kept by hand."""

from __future__ import annotations

import typing

import pytest
from openai.types import completion_create_params
from openai.types.chat import ChatCompletionContentPartTextParam, ChatCompletionMessageParam
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params

from runtime.server import protocol_native, protocol_openai, protocol_responses


def declared(model: type) -> set[str]:
    fields = model.model_fields
    return set(fields) | {f.alias for f in fields.values() if f.alias}


@pytest.mark.parametrize(
    ("params", "model"),
    [
        (chat_create_params.CompletionCreateParamsBase, protocol_openai.ChatCompletionRequest),
        (completion_create_params.CompletionCreateParamsBase, protocol_openai.CompletionRequest),
        (response_create_params.ResponseCreateParamsBase, protocol_responses.ResponsesRequest),
        *[(message, protocol_openai.ChatMessage) for message in typing.get_args(ChatCompletionMessageParam)],
        (ChatCompletionContentPartTextParam, protocol_openai.TextPart),
    ],
    ids=lambda x: x.__name__,
)
def test_every_field_the_openai_client_sends_is_declared(params, model):
    assert set(params.__annotations__) - declared(model) == set()


def dataclass_fields(source: str, name: str) -> set[str]:
    """The public fields a class of ``source`` declares (with its bases in the same file),
    read from the source: SGLang's modules import its whole server to load."""
    import ast

    classes = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}

    def of(cls: str) -> set[str]:
        node = classes.get(cls)
        if node is None:
            return set()
        found = set().union(*(of(b.id) for b in node.bases if isinstance(b, ast.Name)))
        return found | {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                        and isinstance(s.target, ast.Name) and not s.target.id.startswith("_")}

    return of(name)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "cls", "model"),
    [
        ("srt/entrypoints/openai/protocol.py", "ChatCompletionRequest", protocol_openai.ChatCompletionRequest),
        ("srt/entrypoints/openai/protocol.py", "CompletionRequest", protocol_openai.CompletionRequest),
        ("srt/managers/io_struct.py", "GenerateReqInput", protocol_native.GenerateReqInput),
    ],
    ids=lambda x: x if isinstance(x, str) else x.__name__,
)
def test_every_field_sglang_takes_is_declared(source, cls, model):
    """SGLang's own request classes (the version its frontend tests run): each of their
    fields is declared here, so it is honoured, accepted as harmless, or a 400 naming it."""
    from tests.sglang_venv import sglang_source

    fields = dataclass_fields(sglang_source(source).read_text(), cls)
    assert len(fields) > 20  # the class was found
    assert fields - declared(model) == set()


@pytest.mark.parametrize(("field", "value", "refused"), [
    ("watermarking", 0, True),  # a 0 is not "off" unless it is the field's default
    ("bad_words", ["x"], True), ("bad_words", None, False),
    ("use_beam_search", False, False), ("allowed_token_ids", [], False),
    ("priority", 0, False),  # the default: served in arrival order
    ("priority", 5, True), ("vllm_xargs", {}, False), ("vllm_xargs", {"a": 1}, True),
    ("routed_dp_rank", 0, False), ("routed_dp_rank", 1, True),  # a server of its own is rank 0
])
def test_a_field_we_cannot_honour_is_refused_unless_neutral(field, value, refused):
    """Neutral is unset, false, empty or the field's default; a 0 passed as "false" before."""
    from runtime.server.protocol import ApiError, reject_unsupported

    req = protocol_openai.CompletionRequest.model_validate({"prompt": "Hi", field: value})
    if refused:
        with pytest.raises(ApiError, match=field):
            reject_unsupported(req)
    else:
        reject_unsupported(req)
