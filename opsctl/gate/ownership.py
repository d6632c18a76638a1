"""Whose a line is: the invocation's token, whole, cut short or in pieces, in any message (docs/gate.md "The token"
and "Split lines"). Only a process that read the root-only token file can write the token, so any sign of it makes a
message the invocation's own; the gate (:mod:`opsctl.gate.decision`) decides what such a message is worth."""

from __future__ import annotations

import re

from kdtree_backend.wire import TOKEN_RE

_LOOSE_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9_])token=([A-Za-z0-9_-]+)", re.ASCII)
# A message that ends inside its ``token=`` value (or right after the ``=``): what is left of a line journald cut at
# LineMax, or a line truncated anywhere else. Looked for in the message's last characters only.
_TAIL_CHARS = len("token=") + 128
# The shortest piece of a token that, found alone at a message's edge, is taken for a piece of it: 8 of a token's
# characters (hex: 32 bits) at the start of an unrelated message happen about once in four billion.
MIN_TOKEN_PIECE = 8


def claims_token(own: str, token: str | None, raw: str) -> bool:
    """The one rule of whose a line is: the invocation holding ``own`` printed a line whose ``token=`` is ``own``,
    or that holds ``own`` anywhere (only a process that read the root-only token file can write it, so any sign of
    the token makes the line the invocation's own; the gate fails it unless it is well formed with that
    ``token=``), or whose token was cut short (:func:`cut_token`: a strict prefix of ``own``, a line journald
    split inside its token or one truncated there). ``token``: the line's ``token=`` value (None: none)."""
    if token == own:
        return True
    if not own:
        return False
    if token is not None and own.startswith(token):
        return True
    return own in raw or cut_token(raw, own) is not None


def cut_token(raw: str, own: str) -> str | None:
    """The piece of ``own`` a message ends with when it ends inside its ``token=`` value: a strict prefix of
    ``own``, empty when the message ends right after ``token=``. None when the message does not end so."""
    at = raw.rfind("token=", max(0, len(raw) - _TAIL_CHARS))
    if at < 0:
        return None
    piece = raw[at + 6 :]
    # (most lines end with a whole token, their own or another run's: the length alone says no)
    if len(piece) >= len(own) or not own.startswith(piece):
        return None
    before = raw[at - 1] if at else " "
    return None if before.isalnum() or before == "_" else piece


def token_rest_at_start(message: str, own: str, rests: frozenset[str] | set[str] = frozenset()) -> str | None:
    """The rest of ``own`` that ``message`` begins with: one of ``rests`` (what earlier cut-short lines left of the
    token), or any piece of the token's end of at least :data:`MIN_TOKEN_PIECE` characters. That is the second
    piece of a line journald split inside its token (or a forgery of one). None: it does not begin so."""
    for rest in rests:
        if rest and message.startswith(rest):
            return rest
    if len(own) < MIN_TOKEN_PIECE:
        return None
    head = message[: len(own)]
    end = own[-MIN_TOKEN_PIECE:]
    at = head.find(end)
    while at >= 0:
        k = at + MIN_TOKEN_PIECE
        if own.endswith(head[:k]):
            return head[:k]
        at = head.find(end, at + 1)
    return None


def loose_token(text: str) -> str | None:
    """The first ``token=<t>`` in any text (a message the marker does not start), when ``t`` is a token's form."""
    token = token_field(text)
    return token if token is not None and TOKEN_RE.fullmatch(token) else None


def token_field(text: str) -> str | None:
    """The value of the first ``token=`` in any text (whatever its form), or None."""
    m = _LOOSE_TOKEN_RE.search(text)
    return m.group(1) if m else None
