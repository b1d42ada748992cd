"""A task's arguments, normalised as Django's backends do, refused in Django's words and durq's.

Django turns tuples into lists and UTF-8 ``bytes`` into text; what it cannot normalise it
refuses with ``TypeError("Unsupported type: <class '…'>")`` (``ValueError("Unsupported value:
…")`` for bytes that are not UTF-8), which does not say where the value sits. Here the refusal is
durq's ``InvalidPayload`` of the same class (a ``TypeError``; also a ``ValueError`` where Django
raises one) whose message starts with Django's own words and goes on to name the path,
``args[1]['when']``: code and tests written against Django's backends keep passing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..exceptions import InvalidPayload
from ..handlers.payload import check_json
from .framework import normalize_json

__all__ = ["UnsupportedValue", "normalized_arguments"]


class UnsupportedValue(InvalidPayload, ValueError):
    """A value Django's normalisation refuses with ``ValueError`` (bytes that are not UTF-8 text)."""


def normalized_arguments(value: Any, root: str) -> Any:
    """Django's JSON normalisation of task arguments, failing in Django's words and naming the value."""
    try:
        return normalize_json(value)
    except (TypeError, ValueError) as refused:
        found = _payload_error(value, root)
        kind = UnsupportedValue if isinstance(refused, ValueError) else InvalidPayload
        raise kind(f"{refused}: {found}", path=found.path) from None


def _payload_error(value: Any, path: str) -> InvalidPayload:
    """The error for the first value under ``value`` that Django's normalisation refuses."""
    if isinstance(value, Mapping):
        for key, child in value.items():
            if _refused(key):
                return _payload_error(key, f"{path} key")
            if _refused(child):
                return _payload_error(child, f"{path}[{key!r}]")
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        for index, child in enumerate(value):
            if _refused(child):
                return _payload_error(child, f"{path}[{index}]")
    elif isinstance(value, bytes):
        return InvalidPayload(f"{path} is bytes that are not UTF-8 text", path=path)
    try:
        check_json(value, path)
    except InvalidPayload as error:
        return error
    return InvalidPayload(f"{path} is of type {type(value).__name__}, which is not JSON", path=path)


def _refused(value: Any) -> bool:
    try:
        normalize_json(value)
    except (TypeError, ValueError):
        return True
    return False
