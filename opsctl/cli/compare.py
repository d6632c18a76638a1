"""``opsctl compare BASELINE.json CANDIDATE.json``: judge two recorded comparison samples offline, with the judge
and settings a deploy uses (opsctl/gate/compare.py, docs/gate.md "The comparison"). Exit 0 when the candidate
passes, 31 when it fails, 32 when the samples cannot decide (too few answered requests, the load differed, 4xx on
both sides) or a slowdown beyond the bound is withheld (UNPROVEN: the load or the host's contention could explain
it; never a pass), 2 for bad input. Connects nowhere: it imports neither the SSH stack nor the pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ..errors import EXIT_UNPROVEN, GateFailed, UsageError
from ..gate.compare import Comparison, Outcome, compare
from ..gate.sample import ComparisonSample, SampleError
from . import common

if TYPE_CHECKING:
    from ..inventory import CompareSettings

app = typer.Typer()

MAX_SAMPLE_BYTES = 256 * 1024 * 1024  # a sample at its bounds (4096 requests x 65,536 ids) is well below
EXIT_UNDECIDED = EXIT_UNPROVEN  # no verdict on the release: the same code as a gate that could not prove it

_OUTCOME_STYLE = {
    Outcome.PASS: "green",
    Outcome.FAIL: "bold red",
    Outcome.UNDECIDED: "yellow",
    Outcome.UNPROVEN: "yellow",
    Outcome.ERROR: "red",
}


def read_sample(path: Path) -> ComparisonSample:
    """One side of a comparison from a file: the JSON the history records for it (``{"requests": [...]}``).
    Every problem is a UsageError naming the file (and the line or the field)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_SAMPLE_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(raw) > MAX_SAMPLE_BYTES:
        raise UsageError(f"{path}: larger than {MAX_SAMPLE_BYTES // 2**20} MiB: not a comparison sample")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.start}): not a comparison sample") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}:{e.lineno}: not JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise UsageError(f"{path}: JSON nested too deeply: not a comparison sample") from None
    try:
        return ComparisonSample.from_json(doc)
    except SampleError as e:
        raise UsageError(f"{path}: not a comparison sample: {e}") from None


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
    common.out.print(f"comparison: [{style}]{result.outcome}[/] {escape(result.line())}", soft_wrap=True)
    for reason in result.reasons:
        common.out.print(f"  {escape(reason)}", soft_wrap=True)


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
