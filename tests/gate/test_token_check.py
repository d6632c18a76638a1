"""Whether a restarted unit carries this deploy's parity token: decided from the exact EnvironmentFiles paths."""

from __future__ import annotations

from opsctl.gate.decision import GateState
from opsctl.inventory import GateSettings
from opsctl.pipeline.watch import reads_token_file, token_warning

TOKEN_FILE = "/srv/kd/state/parity.env"


def test_only_the_exact_token_file_counts() -> None:
    assert reads_token_file(("/etc/kd/sglang.env", TOKEN_FILE), TOKEN_FILE)
    # A substring check took each of these for the token file.
    for near in ("/srv/kd/state/parity.env.old", "/x/srv/kd/state/parity.env", "/srv/kd/state/parity.envx"):
        assert not reads_token_file((near,), TOKEN_FILE), near
    assert not reads_token_file((), TOKEN_FILE)


def test_the_warning_says_loudly_what_was_not_checked() -> None:
    text = token_warning(("/etc/kd/sglang.env",), TOKEN_FILE)
    assert text.startswith("WARNING: parity token NOT checked")
    assert TOKEN_FILE in text and "/etc/kd/sglang.env" in text
    assert "none" in token_warning((), TOKEN_FILE)


def test_the_history_says_whether_the_token_was_checked() -> None:
    """The gate's summary goes into every history record of a restart, deploy or rollback."""
    s = GateSettings()
    checked = GateState(settings=s, started_at=0.0, deadline_s=s.deadline_s, token="0123456789abcdef")
    unchecked = GateState(settings=s, started_at=0.0, deadline_s=s.deadline_s, token=None)
    assert checked.summary()["token_checked"] is True
    assert unchecked.summary()["token_checked"] is False
