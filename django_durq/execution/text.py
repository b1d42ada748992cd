"""Long text kept to a bound without cutting a word, and saying how much was left out.

Log lines carry a message whole; what is stored (an attempt's error) is bounded, and a bounded
text ends at a word with a note of what it dropped, so that no reader takes a cut word or
value for the real one.
"""

from __future__ import annotations


def clip(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters; else its longest start of whole words
    within ``limit``, then `` … (N more characters)``.

    A first word longer than ``limit`` is cut at ``limit``: the note still says so.
    """
    if len(text) <= limit:
        return text
    head = text[:limit]
    if not text[limit].isspace():
        cut = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
        if cut > 0:
            head = head[:cut]
    head = head.rstrip()
    return f"{head} … ({len(text) - len(head)} more characters)"


def clip_start(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters; else its last whole lines within
    ``limit``, after a first line saying how many characters came before them."""
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    newline = tail.find("\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1 :]
    return f"… ({len(text) - len(tail)} earlier characters)\n{tail}"
