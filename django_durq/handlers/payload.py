"""Job arguments as JSON: validated in Python at ``enqueue()``, identically on every database.

Validation happens here rather than in the database because the databases disagree:
PostgreSQL rejects NUL and lone surrogates, SQLite stores them, and NaN is not JSON at all.
Doing it before any SQL also keeps a caller's transaction usable when a payload is refused.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..exceptions import InvalidPayload

MAX_DEPTH = 100


def encode_arguments(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any], max_bytes: int) -> str:
    """The stored text of a job's arguments, or :class:`InvalidPayload` naming the bad value."""
    check_json(list(args), "args")
    check_json(kwargs, "kwargs")
    text = json.dumps({"args": list(args), "kwargs": kwargs}, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise InvalidPayload(
            f"job arguments are {size} bytes as JSON, over the limit of {max_bytes} bytes "
            '(DURQ["MAX_PAYLOAD_BYTES"]); store large data elsewhere and pass a reference',
            path="",
        )
    return text


def decode_arguments(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Arguments back from the stored text; raises ``ValueError`` on a corrupt row."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("args"), list) or not isinstance(data.get("kwargs"), dict):
        raise ValueError("stored arguments are not an object with 'args' (list) and 'kwargs' (object)")
    return data["args"], data["kwargs"]


def encode_json(value: Any, path: str = "value") -> str:
    """Any JSON value (a result, a schedule's kwargs) checked the same way as arguments."""
    check_json(value, path)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def check_json(value: Any, root: str) -> None:
    """Raise :class:`InvalidPayload` at the first value that would not survive a JSON round trip."""
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InvalidPayload(f"{path} is nested more than {MAX_DEPTH} levels deep", path=path)
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidPayload(f"{path} is {item!r}, which JSON cannot represent", path=path)
            continue
        if isinstance(item, str):
            _check_text(item, path)
            continue
        if isinstance(item, (list, tuple)):
            for index, child in enumerate(item):
                stack.append((child, f"{path}[{index}]", depth + 1))
            continue
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidPayload(
                        f"{path} has a key of type {_type_name(key)} ({key!r}); JSON object keys must be str",
                        path=path,
                    )
                _check_text(key, f"{path} key {key[:40]!r}")
                stack.append((child, f"{path}[{key!r}]", depth + 1))
            continue
        raise InvalidPayload(
            f"{path} is of type {_type_name(item)}, which is not JSON; pass str, int, float, bool, None, "
            "list or dict (for example an id instead of a model instance, isoformat() for a datetime)",
            path=path,
        )


def _check_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise InvalidPayload(f"{path} contains a NUL character, which not every database can store", path=path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidPayload(f"{path} contains a lone surrogate ({error.reason})", path=path) from None


def _type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
