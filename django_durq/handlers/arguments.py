"""What a handler takes after its ``JobContext``: checked when ``@job`` registers it, and at every enqueue.

A job whose arguments the handler cannot take would fail every attempt in the worker; refusing
it at ``enqueue()`` names the mistake where it is made, before any SQL. The check runs for every
enqueue and run, so a call is judged as Python would take it by set comparisons, without binding
the signature.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


class HandlerArguments:
    def __init__(self, func: Callable[..., Any], signature: inspect.Signature) -> None:
        self.func = func
        self.signature = signature
        parameters = signature.parameters.values()
        self.keywords = frozenset(p.name for p in parameters if p.kind in _KEYWORD)
        self.required = frozenset(p.name for p in parameters if p.default is p.empty and p.kind not in _VARIADIC)
        self.any_keyword = any(p.kind == p.VAR_KEYWORD for p in parameters)
        # Where a required parameter can only be given positionally, keywords alone never suffice.
        self.keywords_suffice = self.required <= self.keywords
        # The names positional arguments fill, in order, and whether more may follow (``*args``).
        self.positional = tuple(p.name for p in parameters if p.kind in _POSITIONAL)
        self.any_positional = any(p.kind == p.VAR_POSITIONAL for p in parameters)
        # Of the first n positional parameters, those a keyword could also fill: a keyword naming
        # one of them is given twice; one naming a positional-only parameter goes to ``**kwargs``.
        self._filled_keywords = [self.keywords.intersection(self.positional[:n]) for n in range(len(self.positional) + 1)]

    @classmethod
    def of(cls, func: Callable[..., Any]) -> HandlerArguments | None:
        """``func``'s parameters after the context; None when it takes any arguments at all.

        Raises ``TypeError`` for a handler that cannot take the context as its first positional
        argument.
        """
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError):
            return None  # a callable Python cannot describe (a builtin): the worker will tell
        parameters = list(signature.parameters.values())
        if not parameters or parameters[0].kind not in (*_POSITIONAL, inspect.Parameter.VAR_POSITIONAL):
            raise TypeError(
                f"job handler {qualified_name(func)}{signature} cannot take the JobContext: its first parameter "
                f"receives the JobContext, positionally; write it as def {getattr(func, '__name__', 'handler')}(ctx, ...)"
            )
        rest = parameters if parameters[0].kind == inspect.Parameter.VAR_POSITIONAL else parameters[1:]
        if len(rest) == 2 and {p.kind for p in rest} == set(_VARIADIC):
            return None  # (*args, **kwargs): checking would only cost time
        return cls(func, signature.replace(parameters=rest))

    def check(self, name: str, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> None:
        """Raise ``TypeError`` naming job ``name``, the handler and the argument it could not take."""
        reason = self.refusal(args, kwargs)
        if not reason:
            return
        message = f"cannot enqueue {name!r}: {reason}"
        unknown = [] if self.any_keyword else [key for key in kwargs if key not in self.keywords]
        close = difflib.get_close_matches(unknown[0], sorted(self.keywords), n=1) if unknown else []
        if close:
            message += f" (did you mean {close[0]!r}?)"
        message += f"; the handler {qualified_name(self.func)} takes {self.signature} after the JobContext"
        first = next(iter(inspect.signature(self.func).parameters))
        if first in kwargs:
            message += f", which its first parameter, {first!r}, receives"
        raise TypeError(message)

    def refusal(self, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> str:
        """Why a call with these arguments after the context would raise ``TypeError``; "" when it would not.

        Judged as Python takes a call, by set comparisons: it runs for every enqueue and before
        every run, where binding the signature would cost more than the rest of a no-op job's run
        on the slot (and ``inspect.Signature.bind`` differs from a call in corners between Python
        versions).
        """
        named = kwargs.keys()
        if not args and self.keywords_suffice and self.required <= named and (self.any_keyword or named <= self.keywords):
            return ""  # the usual call, keywords only: the short way to what follows
        if not self.any_keyword and not named <= self.keywords:
            # A misspelt keyword is the likelier slip than the required argument it leaves missing.
            return f"got an unexpected keyword argument {next(key for key in kwargs if key not in self.keywords)!r}"
        given = len(args)
        if given > len(self.positional) and not self.any_positional:
            return f"too many positional arguments ({given}; it takes {len(self.positional)})"
        twice = named & self._filled_keywords[min(given, len(self.positional))]
        if twice:
            return f"got multiple values for argument {sorted(twice)[0]!r}"
        missing = self.required.difference(self.positional[:given], named & self.keywords)
        if missing:
            return f"missing a required argument: {sorted(missing)[0]!r}"
        return ""


def qualified_name(func: Callable[..., Any]) -> str:
    module, qualname = getattr(func, "__module__", ""), getattr(func, "__qualname__", "")
    return f"{module}.{qualname}" if module else qualname or repr(func)
