"""Request bodies of the HTTP API and how bad ones are described to the caller."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from batchpilot.models import MAX_BATCH_SIZE_LIMIT, MAX_QUEUE_TIME_MS_LIMIT, BatchingConfig

M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """A request the server refuses: HTTP status and a message saying what was wrong
    and what is allowed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Synthetic(Strict):
    """Ask the server to make a deterministic input of `size` rows (MLP) or tokens
    (encoder), so a load generator need not send the data."""

    size: Annotated[int, Field(ge=1)]


class PredictRequest(Strict):
    inputs: JsonValue = None
    synthetic: Synthetic | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> PredictRequest:
        if (self.inputs is None) == (self.synthetic is None):
            raise ValueError('give exactly one of "inputs" (real data) or "synthetic"')
        return self


class BatchingUpdate(Strict):
    """PUT /admin/batching: either field may be left out to keep its current value."""

    max_batch_size: int | None = None
    max_queue_time_ms: float | None = None  # strict still takes an integer here

    def merged(self, current: BatchingConfig) -> BatchingConfig:
        values = current.model_dump()
        values.update(self.model_dump(exclude_none=True))
        try:
            return BatchingConfig.model_validate(values)
        except ValidationError as exc:
            raise ApiError(
                422,
                f"{describe(exc)}; allowed: max_batch_size an integer 1 to "
                f"{MAX_BATCH_SIZE_LIMIT}, max_queue_time_ms a number 0 to "
                f"{MAX_QUEUE_TIME_MS_LIMIT:g}",
            ) from exc


def describe(exc: ValidationError) -> str:
    """The validation errors in one line: where, what was wrong."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"])
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def parse_json_object(body: bytes, allowed: str) -> dict[str, object]:
    """The body as a JSON object, or ApiError(400) that says why not."""
    if not body:
        raise ApiError(400, f"the request body is empty: send a JSON object {allowed}")
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            400, f"the body is not valid JSON ({exc}): send a JSON object {allowed}"
        ) from None
    if not isinstance(value, dict):
        raise ApiError(
            400, f"the body is a JSON {type(value).__name__}: send a JSON object {allowed}"
        )
    return value


def validate(model: type[M], value: Mapping[str, object], allowed: str) -> M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise ApiError(400, f"{describe(exc)}; allowed: {allowed}") from exc


def parse_body(model: type[M], body: bytes, allowed: str) -> M:
    """The body as `model`, or ApiError(400) that says what is wrong and what is allowed.

    A valid body goes through pydantic's one-pass JSON parser (about half the CPU of
    json.loads and validating the result, per request); only a refused one is parsed
    again step by step, for the message."""
    try:
        return model.model_validate_json(body)
    except ValidationError:
        return validate(model, parse_json_object(body, allowed), allowed)
