"""The ``[kdtree] shapes`` line (docs/lines.md): the verify metadata the backend saw, what it means for a reader
(:class:`ShapesSummary`), and what it proves about the keys and the mask (:func:`key_mask_warning`). Parsed by
:func:`opsctl.gate.lines.parse_line`."""

from __future__ import annotations

import re
from dataclasses import dataclass

_INT_RE = re.compile(r"0|[1-9][0-9]{0,17}", re.ASCII)
_TUPLE_RE = re.compile(r"\((?:(?:0|[1-9][0-9]{0,17}),(?: (?:0|[1-9][0-9]{0,17}),)*(?: (?:0|[1-9][0-9]{0,17}))?)?\)")


def tuple_text(text: str) -> tuple[int, ...] | None:
    """``(9, 8, 576)`` -> its integers; None when the text is not such a tuple."""
    if _TUPLE_RE.fullmatch(text) is None:
        return None
    return tuple(int(x) for x in text[1:-1].split(",") if x.strip())


def int_text(text: str) -> int | None:
    """A non-negative integer as the backend prints it; None for any other text."""
    return int(text) if _INT_RE.fullmatch(text) else None


@dataclass(frozen=True)
class ShapesLine:
    """``[kdtree] shapes ...``: the verify metadata the backend saw (well formed). Values kept as text."""

    fields: dict[str, str]
    rank: int | None = None
    raw: str = ""

    def tuple_of(self, key: str) -> tuple[int, ...] | None:
        value = self.fields.get(key)
        return None if value is None else tuple_text(value)

    def int_of(self, key: str) -> int | None:
        value = self.fields.get(key)
        return None if value is None else int_text(value)

    def decode(self) -> ShapesSummary:
        """What the numbers mean for a reader, plus the classic-bug check (:func:`key_mask_warning`)."""
        q = self.tuple_of("q")
        kv_buf = self.tuple_of("kv_buf")
        mask = self.tuple_of("mask")
        bs, q_len, kv_len_max = self.int_of("bs"), self.int_of("q_len"), self.int_of("kv_len_max")
        tokens, heads, head_dim = (*q, None, None, None)[:3] if q else (None, None, None)
        mask_numel = mask[0] if mask and len(mask) == 1 else None
        mask_row = mask_numel // tokens if mask_numel is not None and tokens and mask_numel % tokens == 0 else None
        return ShapesSummary(
            rank=self.rank,
            tokens=tokens,
            heads=heads,
            head_dim=head_dim,
            pool_rows=kv_buf[0] if kv_buf else None,
            bs=bs,
            q_len=q_len,
            kv_len_max=kv_len_max,
            mask_row=mask_row,
            scale=self.fields.get("scale"),
            warning=key_mask_warning(bs=bs, q_len=q_len, kv_len_max=kv_len_max, mask_numel=mask_numel, tokens=tokens),
        )


def key_mask_warning(
    *, bs: int | None, q_len: int | None, kv_len_max: int | None, mask_numel: int | None, tokens: int | None
) -> str | None:
    """What a shapes line proves about its keys and mask, for every batch size (docs/lines.md).

    With correct keys, request i has ``L_i = prefix_i + q_len`` keys, ``kv_len_max = max L_i`` and the mask holds
    ``q_len * sum L_i`` entries. Every ``L_i`` is between ``q_len`` and ``kv_len_max``, so ``sum L_i`` must lie in
    ``[kv_len_max + (bs-1)*q_len, bs*kv_len_max]``. A mask above that range proves the key lists are shorter than
    the mask rows; when the mask also fits ``kv_len_max + q_len`` as the longest row, that is the classic bug (the
    drafts left out of the keys, ``kv_len_max`` counting the prefix only). A mask below it proves the rows
    shorter than the keys. Inside the range the line cannot tell (see docs/lines.md). None: nothing proven."""
    if bs is None or q_len is None or kv_len_max is None or mask_numel is None or bs < 1 or q_len < 1:
        return None
    if tokens is not None and tokens != bs * q_len:
        return f"q holds {tokens} query tokens but bs={bs} x q_len={q_len} = {bs * q_len}"
    if mask_numel % q_len:
        return f"mask of {mask_numel} entries is not q_len={q_len} rows per request"
    keys_by_mask = mask_numel // q_len  # sum over requests of the mask row length
    most, least = bs * kv_len_max, kv_len_max + (bs - 1) * q_len
    per = "" if bs == 1 else " (summed over requests)"
    if keys_by_mask > most:
        shown = f"mask rows hold {keys_by_mask} keys{per} but kv_len_max={kv_len_max} allows at most {most}"
        fits_classic = bs * (kv_len_max + q_len) >= keys_by_mask >= kv_len_max + q_len + (bs - 1) * q_len
        return f"{shown}: " + (
            "draft tokens missing from the keys (classic marshaling bug)"
            if fits_classic
            else "key/mask length mismatch"
        )
    if keys_by_mask < least:
        return (
            f"mask rows hold {keys_by_mask} keys{per} but kv_len_max={kv_len_max} needs at least {least}: "
            "key/mask length mismatch"
        )
    return None


@dataclass(frozen=True)
class ShapesSummary:
    rank: int | None
    tokens: int | None
    heads: int | None
    head_dim: int | None
    pool_rows: int | None
    bs: int | None
    q_len: int | None
    kv_len_max: int | None
    mask_row: int | None
    scale: str | None
    warning: str | None

    def text(self) -> str:
        parts = []
        if self.tokens is not None:
            parts.append(f"{self.tokens} query tokens x {self.heads} heads x {self.head_dim}")
        if self.bs is not None and self.q_len is not None:
            parts.append(f"{self.bs} request(s) x {self.q_len} draft tokens")
        if self.kv_len_max is not None:
            parts.append(f"keys per request <= {self.kv_len_max}")
        if self.mask_row is not None:
            # One request: the row length (prefix + drafts). Several: their mean (rows differ per request).
            parts.append(f"mask row {self.mask_row}" if self.bs == 1 else f"mean mask row {self.mask_row}")
        if self.pool_rows is not None:
            parts.append(f"KV pool {self.pool_rows} rows")
        if self.scale is not None:
            parts.append(f"scale {self.scale}")
        return "; ".join(parts)
