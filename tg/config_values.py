"""Config values by type: parse a `--set` string by its field's type, check a value's type, one error class.

Every config field is annotated `int`, `float`, `str`, `bool` or `tuple[str, ...]`; `check_types` holds a
group to its annotations before the group checks its ranges, so a wrong type fails as one `ConfigError`
naming the field, the value and what is allowed, never as a `TypeError` from a comparison further on.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
from dataclasses import fields, is_dataclass
from typing import Any, Sequence, get_origin, get_type_hints


class ConfigError(ValueError):
    """A config value is out of range; the message names the field and what is allowed."""


def check(ok: bool, name: str, allowed: str, value: Any) -> None:
    """Raise `ConfigError` naming `name`, `value` and `allowed` unless `ok`."""
    if not ok:
        raise ConfigError(f"config field `{name}` = {value!r} is invalid: allowed {allowed}")


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """' (did you mean `x`?)' for the closest of `known` to a mistyped `name` (difflib), '' when none is close."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def allowed_type(tp: Any) -> str:
    """How a message names the values of type `tp`."""
    if get_origin(tp) is tuple:
        return "a list of strings (a,b,c or a JSON list)"
    return {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}[tp]


def type_ok(value: Any, tp: Any) -> bool:
    """Whether `value` is a `tp`: an int is a float too (so `lr=1` keeps its hash), a bool is neither."""
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, str)
    return isinstance(value, tuple) and all(isinstance(v, str) for v in value)


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass (`get_type_hints`, computed once per class)."""
    return get_type_hints(cls)


def check_types(prefix: str, obj: Any) -> None:
    """Check every non-group field of the dataclass `obj` against its annotation (`prefix` names the group)."""
    hints = field_types(type(obj))
    for f in fields(obj):
        tp = hints[f.name]
        if not is_dataclass(tp):
            check(type_ok(getattr(obj, f.name), tp), f"{prefix}{f.name}", allowed_type(tp), getattr(obj, f.name))


def parse_value(raw: str, tp: Any) -> Any:
    """A `--set` value for a field of type `tp`. Strings are taken as written (a JSON string literal is
    unquoted); lists split on commas unless written as a JSON list; numbers and booleans are read as
    JSON (`3`, `1e-4`, `true`), and anything else is returned as written for `check_types` to name."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON (json.JSONDecodeError is a ValueError)
        value = raw
    if tp is str:
        return value if isinstance(value, str) else raw
    if get_origin(tp) is tuple:
        return tuple(value) if isinstance(value, list) else tuple((value if isinstance(value, str) else raw).split(","))
    return value
