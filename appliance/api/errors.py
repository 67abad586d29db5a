"""The OpenAI error envelope and the errors the API raises."""

from __future__ import annotations

import re

import msgspec

from .schemas import ErrorBody, ErrorEnvelope, encoder


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or []

    def body(self) -> bytes:
        return encoder.encode(ErrorEnvelope(ErrorBody(self.message, self.type, self.param, self.code)))


Renames = tuple[tuple["re.Pattern[str]", str], ...]


def with_param_renamed(err: ApiError, renames: Renames) -> ApiError:
    """`err` with its field named as another API's request names it: the first pattern that
    matches the chat route's field name rewrites it, in the message too."""
    if err.param is not None:
        for pattern, name in renames:
            if pattern.search(err.param):
                before, err.param = err.param, pattern.sub(name, err.param)
                err.message = err.message.replace(before, err.param)
                break
    return err


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


_AT_PATH = re.compile(r" - at (?:`key` in )?`\$(?P<path>[^`]*)`$")  # (a dict's key: the dict is named)
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")


def from_validation(err: msgspec.MsgspecError) -> ApiError:
    """A 400 naming the offending field, from a msgspec decode/validation error."""
    text = str(err)
    m = _AT_PATH.search(text)
    param = None
    if m:
        param = m.group("path").lstrip(".") or None
        text = text[: m.start()]
    missing = _MISSING.search(text)
    if missing:
        param = f"{param}.{missing.group('field')}" if param else missing.group("field")
    if isinstance(err, msgspec.ValidationError):
        msg = f"invalid value for '{param}': {text}" if param else f"invalid request body: {text}"
        return ApiError(400, msg, param=param, code="invalid_value")
    return ApiError(400, f"request body is not valid JSON: {text}", code="invalid_json")


def decoded(decoder: msgspec.json.Decoder, body: bytes):
    """The request body decoded by `decoder`; a validation error is the 400 naming its field.
    A top-level field sent as null is taken as left out (its default), as OpenAI takes the
    nullable fields its clients send so (`"temperature": null`)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        if "got `null`" in str(e) and (plain := _without_nulls(body)) is not None:
            try:
                return decoder.decode(plain)
            except msgspec.MsgspecError as again:
                raise from_validation(again) from None
        raise from_validation(e) from None
    except msgspec.MsgspecError as e:
        raise from_validation(e) from None


def _without_nulls(body: bytes) -> bytes | None:
    """The JSON object `body` without its top-level null members (None: it is no object, or has
    none)."""
    try:
        obj = msgspec.json.decode(body)
    except msgspec.MsgspecError:
        return None
    if not isinstance(obj, dict) or None not in obj.values():
        return None
    return msgspec.json.encode({k: v for k, v in obj.items() if v is not None})
