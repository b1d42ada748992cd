"""A task's arguments, normalised as Django's backends do, refused as ``@job`` refuses them.

Django turns tuples into lists and UTF-8 ``bytes`` into text; what it cannot normalise it
refuses with a message that does not say where the value sits. Here the refusal is durq's
``InvalidPayload`` (a ``TypeError``, as Django raises) naming the path, ``args[1]['when']``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..exceptions import InvalidPayload
from ..handlers.payload import check_json
from .framework import normalize_json

__all__ = ["normalized_arguments"]


def normalized_arguments(value: Any, root: str) -> Any:
    """Django's JSON normalisation of task arguments, failing as ``@job`` does: naming the value."""
    try:
        return normalize_json(value)
    except (TypeError, ValueError):
        raise _payload_error(value, root) from None


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
