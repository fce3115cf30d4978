"""Checking decoded wire values against dataclass field annotations (used by ``messages``).

Contract:
    * ``build(cls, data)`` turns a map from the wire into ``cls``: unknown keys, missing required
      fields and values of the wrong type raise ``FieldError`` naming the field, the expected type
      and the type received; afterwards the object's own ``validate()`` runs (it checks values).
    * ``check_instance(obj)`` applies the same rules to an object built in Python, so an encoder
      can refuse exactly what a decoder would refuse.
    * The rules are small and strict: ``int`` refuses ``bool``, ``float`` accepts ints (returned as
      float) but not NaN, ``X | None`` accepts nil, ``list[T]`` / ``dict[K, V]`` check every item,
      bare ``list`` / ``dict`` are free-form (a bare dict still needs string keys), and a nested
      dataclass arrives as a map. Strings, lists and maps are capped in size; an ``int`` must fit
      msgpack's 64 bits (``INT_RANGE``) and a string must not hold a lone surrogate (msgpack carries
      UTF-8 only), so an encoder refuses them with a FieldError instead of failing inside msgpack.
    * Only annotations made of those pieces are supported; anything else is a ``TypeError`` (a bug
      in the message definitions, not in the frame).
"""

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

# Far above any real request, low enough that one frame cannot make the daemon work without bound.
MAX_LIST_ITEMS = 1 << 20
MAX_STRING_CHARS = 16 * 1024 * 1024
MAX_MAP_ENTRIES = 1 << 16
# msgpack's integers: int64 to uint64
INT_RANGE = range(-(1 << 63), 1 << 64)
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

# Exact type() tests: bool is a subclass of int, but a bool is never a valid int on the wire.
_SCALAR_TESTS: dict[type, Callable[[Any], bool]] = {
    bool: lambda value: type(value) is bool,
    int: lambda value: type(value) is int,
    float: lambda value: type(value) in (int, float),
    str: lambda value: type(value) is str,
}


class FieldError(ValueError):
    """A field is unknown, missing, of the wrong type or too large; the text names the field."""


def type_name(value: Any) -> str:
    """Name a value's type the way error messages show it.

    Args:
        value: Any decoded value.

    Returns:
        "nil" for None, else the Python type's name ("str", "bool", "list", ...).
    """
    return "nil" if value is None else type(value).__name__


def _hint_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


def _wrong_type(where: str, hint: Any, value: Any) -> FieldError:
    return FieldError(f"{where}: expected {_hint_name(hint)}, got {type_name(value)}")


@cache
def field_specs(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """List a dataclass's fields for checking.

    Args:
        cls: A dataclass whose annotations are real types (no ``from __future__ import annotations``).

    Returns:
        One ``(name, annotation, required)`` triple per field, in declaration order.
    """
    return tuple(
        (spec.name, spec.type, spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING)
        for spec in dataclasses.fields(cls)
    )


def _check_scalar(value: Any, hint: type, where: str) -> Any:
    if not _SCALAR_TESTS[hint](value):
        raise _wrong_type(where, hint, value)
    if hint is str:
        if len(value) > MAX_STRING_CHARS:
            raise FieldError(f"{where}: {len(value)} characters, at most {MAX_STRING_CHARS}")
        if not value.isascii() and _LONE_SURROGATE.search(value):
            raise FieldError(f"{where}: holds a lone surrogate (not valid Unicode text)")
    if hint is int and value not in INT_RANGE:
        raise FieldError(f"{where}: {_int_outside(value)}")
    if hint is float:
        if math.isnan(value):
            raise FieldError(f"{where}: must not be NaN")
        return float(value)
    return value


def _int_outside(value: int) -> str:
    return f"an integer of {value.bit_length()} bits is outside the 64-bit range [-2^63, 2^64)"


def _check_list(value: Any, item_hint: Any, where: str) -> list:
    if type(value) not in (list, tuple):
        raise _wrong_type(where, list if item_hint is None else list[item_hint], value)
    if len(value) > MAX_LIST_ITEMS:
        raise FieldError(f"{where}: {len(value)} items, at most {MAX_LIST_ITEMS}")
    if item_hint is None:
        return list(value)
    if item_hint in (int, bool):
        # Token lists can hold a million ids: scan with the bare test, build the name only on failure.
        test = _SCALAR_TESTS[item_hint]
        for index, item in enumerate(value):
            if not test(item):
                raise _wrong_type(f"{where}[{index}]", item_hint, item)
        if item_hint is int and value and (min(value) < INT_RANGE.start or max(value) >= INT_RANGE.stop):
            index = next(i for i, item in enumerate(value) if item not in INT_RANGE)
            raise FieldError(f"{where}[{index}]: {_int_outside(value[index])}")
        return list(value)
    return [check_value(item, item_hint, f"{where}[{index}]") for index, item in enumerate(value)]


def _check_dict(value: Any, key_hint: Any, value_hint: Any, where: str) -> dict:
    if type(value) is not dict:
        raise _wrong_type(where, dict if key_hint is None else dict[key_hint, value_hint], value)
    if len(value) > MAX_MAP_ENTRIES:
        raise FieldError(f"{where}: {len(value)} entries, at most {MAX_MAP_ENTRIES}")
    if key_hint is None:
        # Free-form maps (usage, memory, chat messages) are JSON-like: string keys only.
        for key in value:
            if type(key) is not str:
                raise FieldError(f"{where}: keys must be str, got {type_name(key)}")
        return value
    return {
        check_value(key, key_hint, f"{where} key {key!r}"): check_value(item, value_hint, f"{where}[{key!r}]")
        for key, item in value.items()
    }


def check_value(value: Any, hint: Any, where: str) -> Any:
    """Check one value against an annotation.

    Args:
        value: The value as decoded from msgpack (or as set in Python).
        hint: The field's annotation.
        where: The field's dotted name, for error messages.

    Returns:
        The value normalised: ints become floats for ``float``, maps become nested dataclasses.

    Raises:
        FieldError: The value does not fit the annotation.
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return check_value(value, inner, where)
    if hint in _SCALAR_TESTS:
        return _check_scalar(value, hint, where)
    if hint is list or origin is list:
        return _check_list(value, (typing.get_args(hint) or (None,))[0], where)
    if hint is dict or origin is dict:
        key_hint, value_hint = typing.get_args(hint) or (None, None)
        return _check_dict(value, key_hint, value_hint, where)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            check_instance(value, f"{where}.")
            return value
        if type(value) is dict:
            return build(hint, value, f"{where}.")
        raise FieldError(f"{where}: expected map ({hint.__name__}), got {type_name(value)}")
    raise TypeError(f"no wire rule for annotation {hint!r} at {where}")


def check_instance(obj: Any, prefix: str = "") -> None:
    """Check every field of a dataclass object built in Python, then run its ``validate()``.

    Args:
        obj: The dataclass object.
        prefix: Dotted path of ``obj`` inside its parent ("" at the top).

    Raises:
        FieldError: A field has the wrong type or size.
    """
    for name, hint, _ in field_specs(type(obj)):  # type: ignore[arg-type]  # a class is hashable
        check_value(getattr(obj, name), hint, prefix + name)
    obj.validate()


def build(cls: type, data: dict, prefix: str = "") -> Any:
    """Build a dataclass from a decoded map, then run its ``validate()``.

    Args:
        cls: The dataclass to build.
        data: Field name -> decoded value.
        prefix: Dotted path of the object inside its parent ("" at the top).

    Returns:
        The new object.

    Raises:
        FieldError: Unknown or missing field, or a value of the wrong type or size.
    """
    specs = field_specs(cls)
    known = [name for name, _, _ in specs]
    for key in data:
        if key not in known:
            raise FieldError(f"unknown field {prefix}{key!r}; known fields: {', '.join(sorted(known))}")
    values = {}
    for name, hint, required in specs:
        if name in data:
            values[name] = check_value(data[name], hint, prefix + name)
        elif required:
            raise FieldError(f"missing field {prefix}{name}")
    obj = cls(**values)
    obj.validate()
    return obj
