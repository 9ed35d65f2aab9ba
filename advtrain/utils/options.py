"""Strict typed options (pydantic) and their one-line error messages."""

from __future__ import annotations

import re
from typing import Annotated, Any, Optional

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator

from advtrain.utils.errors import did_you_mean

# int32: seeds go to numpy, TensorFlow and Keras (seed + epoch).
INT_MAX = 2**31 - 1
Seed = Annotated[int, Field(ge=0, le=INT_MAX)]
# NUL, C0 controls except tab and newlines, DEL, unpaired surrogates.
_BAD_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


class Options(BaseModel):
    """Refuses unknown names, wrong types (YAML's `yes` is not 1, 2.5 not
    an int), NaN/Inf, control characters and huge integers."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False
    )

    @field_validator("*")
    @classmethod
    def _plain_values(cls, value: Any) -> Any:
        if isinstance(value, str) and _BAD_CHARS.search(value):
            raise ValueError(
                "text must not hold NUL, control characters or unpaired surrogates"
            )
        if isinstance(value, int) and abs(value) > INT_MAX:
            raise ValueError(f"integers must be within +-{INT_MAX}")
        return value


# Union members pydantic names in an error's location ("float",
# "literal['auto']", "function-after[...]"): not configuration keys.
_TYPE_TAG = re.compile(r"(float|int|str|bool|none|[a-z-]+\[.*\])")


def _known_keys(model: type[BaseModel], path: tuple[str, ...]) -> list[str]:
    for part in path:
        field = model.model_fields.get(part)
        sub = field.annotation if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return []
        model = sub
    return list(model.model_fields)


def _format_error(
    error: dict[str, Any],
    source: str,
    schema: type[BaseModel],
    renamed: Optional[dict[str, str]] = None,
) -> str:
    loc = tuple(str(p) for p in error["loc"] if not _TYPE_TAG.fullmatch(str(p)))
    path = ".".join(loc)
    kind = error["type"]
    if kind == "extra_forbidden" and path in (renamed or {}):
        return f"{source}: '{path}' was renamed {renamed[path]}."
    if kind == "extra_forbidden":
        known = _known_keys(schema, loc[:-1])
        section = "".join(f"{part}." for part in loc[:-1])
        hint = did_you_mean(loc[-1], known, cutoff=0.5, prefix=section)
        allowed = ", ".join(known)
        return f"{source}: unknown key '{path}'.{hint} Allowed here: {allowed}."
    received = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if isinstance(received, bool) and kind in ("int_type", "float_type"):
        message = f"{message} (true/false/yes/no are booleans, not numbers)"
    if isinstance(received, (dict, list)) and kind != "literal_error":
        received_text = ""
    else:
        shown = repr(received)
        if len(shown) > 80:
            shown = f"{shown[:77]}..."
        received_text = f" Received: {path or 'value'}={shown}"
    where = f" for '{path}'" if path else ""
    if "Received:" in message:  # a validator's own line says it already
        return f"{source}: invalid value{where}: {message}"
    return f"{source}: invalid value{where}: {message.rstrip('.')}.{received_text}"


def format_validation_error(
    exc: pydantic.ValidationError,
    source: str,
    schema: type[BaseModel],
    renamed: Optional[dict[str, str]] = None,
) -> str:
    """One line for a pydantic error: `SOURCE: invalid value for 'KEY': WHY.
    Received: KEY=VALUE` or `SOURCE: unknown key 'KEY'. Did you mean ...`;
    `schema` is the model validated, `renamed` old keys' notes."""
    errors = exc.errors(include_url=False)
    # Prefer an unknown-key error: it usually explains the others.
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    line = _format_error(errors[0], source, schema, renamed)
    if len(errors) > 1:
        line += f" ({len(errors) - 1} more problem(s) after this one)"
    return line
