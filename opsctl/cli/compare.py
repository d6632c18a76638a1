"""``opsctl compare BASELINE.json CANDIDATE.json``: judge two recorded comparison samples offline, with the judge
and settings a deploy uses (opsctl/comparison/compare.py, docs/gate.md "The comparison"). Exit 0 when the candidate
passes, 31 when it fails, 32 when the samples cannot decide (too few answered requests, the load differed, 4xx on
both sides) or a slowdown beyond the bound is withheld (UNPROVEN: the load or the host's contention could explain
it; never a pass), 2 for bad input. Connects nowhere: it imports neither the SSH stack nor the pipeline."""

from __future__ import annotations

import json
import os
import re
from json.decoder import scanstring
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from ..comparison.compare import compare
from ..comparison.results import Comparison, Outcome
from ..comparison.sample import ComparisonSample, SampleError
from ..errors import EXIT_UNPROVEN, GateFailed, UsageError
from ..terminal import escaped
from . import common

if TYPE_CHECKING:
    from ..inventory import CompareSettings

app = typer.Typer()

# A sample as a deploy records it is at most 256 requests (the inventory's MAX_PROMPTS) x 4096 ids (max_new_tokens)
# of at most 11 bytes each, ~11.5 MB with its figures: a file larger than this is no sample. Checked before the
# file is read, so that parsing (about 30 bytes of memory per byte of `{}`) stays near half a GB at worst.
MAX_SAMPLE_BYTES = 16 * 1024 * 1024
EXIT_UNDECIDED = EXIT_UNPROVEN  # no verdict on the release: the same code as a gate that could not prove it

_OUTCOME_STYLE = {
    Outcome.PASS: "green",
    Outcome.FAIL: "bold red",
    Outcome.UNDECIDED: "yellow",
    Outcome.UNPROVEN: "yellow",
    Outcome.ERROR: "red",
}


class _Duplicate(ValueError):
    """A JSON object with a key twice (json keeps the last one silently: a forged second "requests" would win)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise _Duplicate("a key twice")
    return doc


_WS = re.compile(r"[ \t\n\r]*")


def _skip_ws(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    return m.end() if m else pos


def _locate(text: str) -> tuple[int, str, str] | None:
    """Where json.loads refused a sample that is otherwise JSON (a key twice, an integer of more than 4300 digits):
    ``(offset, field, problem)``, found by walking the text with the standard library's own scanners (only on this
    error path: a Python loop over the objects, linear in the text)."""
    plain = json.JSONDecoder()

    def ws(pos: int) -> int:
        return _skip_ws(text, pos)

    def walk(pos: int, path: str) -> tuple[int, str, str] | None:
        pos = ws(pos)
        if text.startswith("{", pos):
            seen: set[str] = set()
            pos = ws(pos + 1)
            while not text.startswith("}", pos):
                key_at = pos
                key, pos = scanstring(text, pos + 1)
                field = f"{path}.{key}" if path else key
                if key in seen:
                    return key_at, shown_field(field), "the key is given twice (JSON keeps only one: refused)"
                seen.add(key)
                pos = ws(pos) + 1  # the ':'
                found = walk(pos, field)
                if found:
                    return found
                pos = _after(pos)
                pos = ws(pos)
                if text.startswith(",", pos):
                    pos = ws(pos + 1)
            return None
        if text.startswith("[", pos):
            pos = ws(pos + 1)
            i = 0
            while not text.startswith("]", pos):
                found = walk(pos, f"{path}[{i}]")
                if found:
                    return found
                pos = ws(_after(pos))
                if text.startswith(",", pos):
                    pos = ws(pos + 1)
                i += 1
            return None
        try:
            plain.raw_decode(text, pos)
        except ValueError:
            return pos, shown_field(path or "(top level)"), "a number of more than 4300 digits"
        return None

    ends: dict[int, int] = {}

    def _after(pos: int) -> int:
        """The end of the value at ``pos`` (already walked, so it decodes with duplicates allowed)."""
        pos = ws(pos)
        if pos not in ends:
            ends[pos] = plain.raw_decode(text, pos)[1]
        return ends[pos]

    try:
        return walk(0, "")
    except (ValueError, RecursionError, AttributeError):
        return None


def shown_field(field: str) -> str:
    return escaped(field[:200])


def read_sample(path: Path) -> ComparisonSample:
    """One side of a comparison from a file: the JSON the history records for it (``{"requests": [...]}``).
    Every problem is a UsageError naming the file (and the line or the field); the size is checked before the file
    is read, and a key given twice is refused."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_SAMPLE_BYTES:
                raise UsageError(
                    f"{path}: {size:,} bytes, larger than {MAX_SAMPLE_BYTES // 2**20} MiB: not a comparison sample"
                )
            raw = f.read(MAX_SAMPLE_BYTES + 1)  # a file that grows meanwhile, or a pipe: bounded all the same
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_SAMPLE_BYTES:
        raise UsageError(f"{path}: larger than {MAX_SAMPLE_BYTES // 2**20} MiB: not a comparison sample")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise UsageError(f"{path}:{line}: not UTF-8 text (byte {e.start}): not a comparison sample") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}:{e.lineno}: not JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise UsageError(f"{path}: JSON nested too deeply: not a comparison sample") from None
    except ValueError:  # a key twice, or an integer json will not convert (over 4300 digits)
        found = _locate(text)
        if found is None:
            raise UsageError(f"{path}: a key given twice or a number too long: not a comparison sample") from None
        at, field, problem = found
        line = text.count("\n", 0, at) + 1
        raise UsageError(f"{path}:{line}: {field}: {problem}: not a comparison sample") from None
    try:
        return ComparisonSample.from_json(doc)
    except SampleError as e:
        raise UsageError(f"{path}: not a comparison sample: {escaped(str(e))}") from None


def judge_settings(host: str | None, overrides: dict[str, float | int | None]) -> CompareSettings:
    """The comparison settings a deploy to HOST uses, else the defaults; flags (``overrides``) on top."""
    # Here, not at the top: the inventory's models (pydantic) are the slowest import, and --help needs none.
    from pydantic import ValidationError

    from ..inventory import CompareSettings

    base = common.inventory().host(host).gate.compare if host is not None else CompareSettings()
    update = {k: v for k, v in overrides.items() if v is not None}
    tokens = update.get("compare_tokens")
    if tokens is not None and tokens > base.max_new_tokens:  # samples judged offline: as many as they hold
        update["max_new_tokens"] = tokens
    try:
        return CompareSettings.model_validate({**base.model_dump(), **update})
    except ValidationError as e:
        first = e.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else ""
        flag = f"--{key.replace('_', '-')}" if key in overrides else (key or "settings")
        raise UsageError(f"{flag}: {first['msg'].removeprefix('Value error, ')}") from None


def exit_code(outcome: Outcome) -> int:
    """0 PASS, 31 FAIL, 32 no verdict on the release (UNDECIDED, UNPROVEN, or ERROR: 4xx on both sides)."""
    if outcome is Outcome.PASS:
        return 0
    return GateFailed.exit_code if outcome is Outcome.FAIL else EXIT_UNDECIDED


def print_comparison(result: Comparison) -> None:
    style = _OUTCOME_STYLE[result.outcome]
    # A reason may quote a sample's error text (the server's words): escaped.
    common.out.print(f"comparison: [{style}]{result.outcome}[/] {escape(escaped(result.line()))}", soft_wrap=True)
    for reason in result.reasons:
        common.out.print(f"  {escape(escaped(reason))}", soft_wrap=True)


@app.command("compare")
@common.bounded
def compare_command(
    baseline: Annotated[Path, typer.Argument(help="The baseline's sample (the release replaced), JSON.")],
    candidate: Annotated[Path, typer.Argument(help="The candidate's sample (the new release), JSON.")],
    host: Annotated[str | None, typer.Option("--host", help="Use this inventory host's gate.compare settings.")] = None,
    compare_tokens: Annotated[
        int | None, typer.Option("--compare-tokens", min=1, help="Output ids compared per prompt.")
    ] = None,
    min_identical: Annotated[
        float | None,
        typer.Option("--min-identical", parser=common.finite(0), help="FAIL when fewer prompts agree (a fraction)."),
    ] = None,
    max_slowdown: Annotated[
        float | None,
        typer.Option("--max-slowdown", parser=common.finite(0), help="FAIL when decode is slower than 1 - this."),
    ] = None,
    alpha: Annotated[
        float | None, typer.Option("--alpha", parser=common.finite(0), help="The tests' significance level.")
    ] = None,
    max_accept_drop: Annotated[
        float | None,
        typer.Option("--max-accept-drop", parser=common.finite(0), help="FAIL when accepted drafts drop more."),
    ] = None,
    max_load_diff: Annotated[
        float | None,
        typer.Option("--max-load-diff", parser=common.finite(0), help="Speed undecided beyond this load difference."),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="What to call the baseline in the report (default: its file name).")
    ] = None,
    json_out: common.JsonOption = False,
) -> None:
    """Judge a candidate's comparison sample against a baseline's, as a deploy would; exit 0 pass, 31 fail,
    32 cannot decide.

    jq '.comparison.baseline' old.json > a.json; jq '.comparison.candidate' new.json > b.json; opsctl compare a.json b.json
    """
    overrides: dict[str, float | int | None] = {
        "compare_tokens": compare_tokens,
        "min_identical": min_identical,
        "max_slowdown": max_slowdown,
        "alpha": alpha,
        "max_accept_drop": max_accept_drop,
        "max_load_diff": max_load_diff,
    }
    settings = judge_settings(host, overrides)
    old, new = read_sample(baseline), read_sample(candidate)
    result = compare(old, new, settings, baseline=name or baseline.name)
    if json_out:
        common.emit_json(result.to_json())
    else:
        print_comparison(result)
    code = exit_code(result.outcome)
    if code:
        raise typer.Exit(code=code)
