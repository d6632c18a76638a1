"""opsctl's half of the opsctl/backend wire contract, pinned to the backend's: what opsctl writes, hands over, looks
for and judges is what the backend reads and prints, observed through both sides' code (tests/backend/
test_wire_contract.py is the backend's half; :func:`backend_view` is how the backend behaves)."""

from __future__ import annotations

import json
import shlex
import subprocess

from kdtree_backend import wire
from kdtree_backend.capture_format import parse_request
from kdtree_backend.lines import ParityIdentity

from opsctl.captures.arming import new_capture_id, request_doc
from opsctl.gate.decision import GateState, LineVerdict, judge
from opsctl.gate.lines import MARKER, FallbackLine, ParityLine, ShapesLine, parse_line
from opsctl.host.releaseroot import new_parity_token, parse_parity_env
from opsctl.host.replay import synthetic_replay_command
from opsctl.inventory import GateSettings
from opsctl.pipeline import prerestart
from tests.backend.test_wire_contract import GOOD_TOKEN, backend_lines, backend_view


def opsctl_view() -> dict[str, object]:
    """The contract as opsctl behaves: the marker it looks for, the variable its replay command exports the token
    in (read back by a shell, as on a host), the exit status its pre-restart check reads as a parity failure."""
    command = synthetic_replay_command("true", "/", GOOD_TOKEN, steps=1, threshold=0.1)
    # The command reads the token from stdin into its variable; run its prefix with `env` as the program.
    prefix = command.command.split(" && ")[:-1]
    shown = subprocess.run(
        ["sh", "-c", " && ".join([*prefix, "env"])], input=command.stdin, capture_output=True, text=True, check=True
    ).stdout
    token_vars = [line.split("=", 1)[0] for line in shown.split("\n") if line.endswith(f"={GOOD_TOKEN}")]
    return {
        "marker": MARKER,
        "token_var": token_vars[0] if len(token_vars) == 1 else token_vars,
        "exit_parity_failed": prerestart.REPLAY_EXIT_PARITY_FAILED,
    }


def test_opsctl_and_the_backend_agree_on_marker_token_variable_and_exit_status() -> None:
    backend = backend_view()
    assert opsctl_view() == {k: backend[k] for k in ("marker", "token_var", "exit_parity_failed")}


def test_opsctl_reads_every_kind_of_line_the_backend_prints() -> None:
    shapes, parity, fallback = (parse_line(line) for line in backend_lines())
    assert isinstance(shapes, ShapesLine) and isinstance(fallback, FallbackLine)
    assert isinstance(parity, ParityLine) and parity.rank == 1 and parity.token == GOOD_TOKEN


def test_the_gate_counts_the_backend_s_line_with_its_token_and_ignores_it_with_another() -> None:
    parity = backend_lines()[1]
    mine = GateState.every_line(GateSettings(), expected_ranks=2, token=GOOD_TOKEN)
    other = GateState.every_line(GateSettings(), expected_ranks=2, token="another-token-0123")
    counted, ignored = judge(mine, parity, 0.0), judge(other, parity, 0.0)
    assert counted is not None and counted.verdict is not LineVerdict.IGNORED
    assert ignored is not None and ignored.verdict is LineVerdict.IGNORED


def test_the_token_opsctl_hands_out_is_one_the_backend_accepts() -> None:
    token = new_parity_token()
    env_file = f"{wire.PARITY_TOKEN_VAR}={token}\n"  # what write_parity_token writes for systemd
    assert parse_parity_env(env_file) == token
    assert ParityIdentity.from_env(0, {wire.PARITY_TOKEN_VAR: token}).token == token


def test_a_capture_request_opsctl_writes_is_one_the_backend_accepts() -> None:
    ident = new_capture_id()
    doc = request_doc(capture_id=ident, layers=[0, 30], steps=2, max_mb=64, tp=2, host_now=1e9)
    assert parse_request(json.loads(json.dumps(doc))).id == ident
    assert shlex.quote(ident) == ident  # used unquoted in paths the backend builds
