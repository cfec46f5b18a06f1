"""The output constraint of an OpenAI-route request as sampling fields: ``response_format``,
SGLang's ``regex`` / ``ebnf`` / ``json_schema`` and vLLM's ``guided_*`` / ``structured_outputs``,
at most one of them, with error messages that name the field the client used."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from runtime.constrained.spec import best_effort_schema
from runtime.server.protocol import ApiError
from runtime.server.protocol_openai import OpenAISampling, StructuredOutputs

# Sampling fields as OpenAI clients call them, for error messages.
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens", "json_schema": "response_format"}
# The sampling field each kind of given constraint becomes (``constraint_source``'s kinds).
CONSTRAINT_FIELD = {"regex": "regex", "choice": "regex", "ebnf": "ebnf", "json": "json_schema", "json_object": "json_schema"}


class OutputConstraint:
    """What ``OpenAIHandler`` (and so each OpenAI route) knows of its request's constraint."""

    req: OpenAISampling

    def constraint(self) -> dict[str, Any]:
        """The request's output constraint as sampling fields: ``response_format`` becomes a
        ``json_schema`` (``json_object``: any object), the rest as ``given_constraint``."""
        fields = self.given_constraint()
        schema = self.answer_schema()
        if schema is None:
            return fields
        if fields.get("json_schema") is not None:
            raise ApiError(400, f"give response_format or {self.constraint_source[0]}, not both",  # type: ignore[index]
                           param="response_format")
        return {**fields, "json_schema": json.dumps(schema)}

    @functools.cached_property
    def api_names(self) -> dict[str, str]:
        """Our field names -> the request's, for its errors: a JSON schema is
        ``response_format``'s only when the client sent that field; a constraint given by
        vLLM's or SGLang's fields keeps the name it came in (``guided_regex``,
        ``structured_outputs.json``)."""
        names = dict(OPENAI_NAMES)
        if getattr(self.req, "response_format", None) is None:
            del names["json_schema"]
        source = self.constraint_source
        if source is not None and source[0] != source[1]:
            names[CONSTRAINT_FIELD[source[1]]] = source[0]
        return names

    @functools.cached_property
    def constraint_source(self) -> tuple[str, str, Any] | None:
        """(the field as the client named it, its kind, its value) of the one constraint given
        besides ``response_format``; kinds: regex, choice, ebnf, json, json_object. Two
        different ones are a 400 (nothing says which would win)."""
        r = self.req
        so = r.structured_outputs or StructuredOutputs()
        candidates = [
            ("regex", "regex", r.regex), ("guided_regex", "regex", r.guided_regex),
            ("structured_outputs.regex", "regex", so.regex), ("guided_choice", "choice", r.guided_choice),
            ("structured_outputs.choice", "choice", so.choice), ("ebnf", "ebnf", r.ebnf),
            ("guided_grammar", "ebnf", r.guided_grammar), ("structured_outputs.grammar", "ebnf", so.grammar),
            ("json_schema", "json", r.json_schema), ("guided_json", "json", r.guided_json),
            ("structured_outputs.json", "json", so.json_),
            ("structured_outputs.json_object", "json_object", so.json_object or None),
        ]
        given = [c for c in candidates if c[2] is not None]
        # The same constraint under two servers' names (a client written for both sends
        # SGLang's regex and vLLM's structured_outputs.regex) is one constraint.
        other = next((c for c in given[1:] if (c[1], c[2]) != (given[0][1], given[0][2])), None)
        if other is not None:
            raise ApiError(400, f"give one output constraint, not both {given[0][0]} and {other[0]}", param=other[0])
        return given[0] if given else None

    def given_constraint(self) -> dict[str, Any]:
        """The constraint fields besides ``response_format`` as sampling fields: SGLang's
        ``regex`` / ``ebnf`` / ``json_schema``, vLLM's ``guided_*`` and ``structured_outputs``
        (a choice as the regex of its alternatives)."""
        source = self.constraint_source
        if source is None:
            return {}
        name, kind, value = source
        if kind == "choice":
            if not any(value):
                raise ApiError(400, f"{name} must list at least one non-empty choice", param=name)
            value = "|".join(re.escape(c) for c in value)
        elif kind == "json_object":
            value = json.dumps({"type": "object"})
        elif kind == "json" and not isinstance(value, str):
            value = json.dumps(value)
        return {CONSTRAINT_FIELD[kind]: value}

    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema ``response_format`` asks the answer to follow (``json_object``: any
        object; a ``json_schema`` without a schema: any JSON value), or None."""
        fmt = self.req.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"type": "object"}
        if fmt.type == "structural_tag":
            raise ApiError(400, "response_format of type structural_tag is not supported by this server (json_schema "
                                "is; tool calls are kept to their schemas with 'tools')", param="response_format")
        if fmt.json_schema is None:
            raise ApiError(400, "response_format of type json_schema needs a 'json_schema' object", param="response_format")
        schema = fmt.json_schema.schema_
        if schema is None:
            return {}
        # without strict, OpenAI promises best effort: what no engine enforces whole is kept
        # as far as xgrammar enforces it, not a 400 (strict, it is the 400 OpenAI gives too)
        return schema if fmt.json_schema.strict else best_effort_schema(schema)  # type: ignore[return-value]
