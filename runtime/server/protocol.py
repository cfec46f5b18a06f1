"""What every request body of the HTTP API shares, and the one error type handlers raise.

The bodies themselves: ``protocol_openai.py`` (chat, completions), ``protocol_responses.py``
(the Responses API), ``protocol_native.py`` (SGLang's native routes, tokenize). Every field
of OpenAI's request schemas and of SGLang's (its frontend and its gateway send them) is
declared: each is implemented, accepted and ignored where it changes nothing here
(``user``, ``metadata``, ``store``...), or declared ``NeutralOnly[...]``: accepted only at its
neutral value, otherwise a 400 that says it is not supported. ``null`` means "not given". Fields outside all of these
are ignored with one warning in the log per name (vLLM's behaviour); wrong JSON types stay
400s naming the field.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

T = TypeVar("T")


class _NeutralOnlyMarker:
    """Annotation metadata: the field is accepted only at its neutral value."""

    def __repr__(self) -> str:
        return "NEUTRAL_ONLY"


NEUTRAL_ONLY = _NeutralOnlyMarker()
# A field declared so that clients may send it, that the server cannot honour: accepted unset,
# false, empty or at its default, otherwise a 400 naming it (``reject_unsupported``); OpenAPI shows only those
# values (``openapi.py``).
NeutralOnly = Annotated[T, NEUTRAL_ONLY]


class ApiError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers
        self.code = code  # OpenAI's error code where it has one for this error, else the status
        self.type = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code or self.status}}


class _Body(BaseModel):
    """A request body: JSON types checked strictly (no numbers as strings); ``null`` means
    "not given", so the field keeps its default; fields outside the model are kept aside
    (``model_extra``) for ``read_body`` to log once and ignore, as vLLM does."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)
    # the fields declared ``NeutralOnly[...]``, this class's and its bases' (set per subclass)
    UNSUPPORTED: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if not cls.__pydantic_complete__:  # an unresolved annotation would hide its NeutralOnly marker
            raise TypeError(f"{cls.__name__}: a field's type is not defined yet; define the types a body "
                            "uses before it")
        cls.UNSUPPORTED = tuple(name for name, field in cls.model_fields.items() if NEUTRAL_ONLY in field.metadata)

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data: Any) -> Any:
        """Drops nulls; a whole float for an integer field (``2.0``, as Python clients that
        compute a value send it) becomes the integer, as vLLM and SGLang take it."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: int(v) if isinstance(v, float) and v.is_integer() and k in fields
                and _takes_int_not_float(fields[k].annotation) else v
                for k, v in data.items() if v is not None}


def _takes_int_not_float(annotation: Any) -> bool:
    kinds = set(typing.get_args(annotation)) or {annotation}
    return int in kinds and float not in kinds


def reject_unsupported(req: _Body) -> None:
    """A 400 for the first ``NeutralOnly`` field of ``req`` given a value other than its neutral
    one (``is_neutral``): something the server cannot do."""
    for name in req.UNSUPPORTED:
        if not is_neutral(getattr(req, name), type(req).model_fields[name].default):
            raise ApiError(400, f"'{name}' is not supported by this server", param=name)


def is_neutral(value: Any, default: Any) -> bool:
    """Unset, false, empty, or the field's default. Compared by kind, not ``==``: a 0 is not
    false (vLLM's ``prompt_logprobs: 0`` asks for the prompt's logprobs)."""
    if value is None or value is False:
        return True
    if isinstance(value, (list, dict, tuple)):
        return not value
    return type(value) is type(default) and value == default
