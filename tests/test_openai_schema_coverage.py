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

from runtime.server import protocol, protocol_responses


def declared(model: type) -> set[str]:
    fields = model.model_fields
    return set(fields) | {f.alias for f in fields.values() if f.alias}


@pytest.mark.parametrize(
    ("params", "model"),
    [
        (chat_create_params.CompletionCreateParamsBase, protocol.ChatCompletionRequest),
        (completion_create_params.CompletionCreateParamsBase, protocol.CompletionRequest),
        (response_create_params.ResponseCreateParamsBase, protocol_responses.ResponsesRequest),
        *[(message, protocol.ChatMessage) for message in typing.get_args(ChatCompletionMessageParam)],
        (ChatCompletionContentPartTextParam, protocol.TextPart),
    ],
    ids=lambda x: x.__name__,
)
def test_every_field_the_openai_client_sends_is_declared(params, model):
    assert set(params.__annotations__) - declared(model) == set()
