"""Typed errors. Every expected failure is an OpsError with a message a user can act on; the CLI turns it
into one red line and the exit code below (no traceback)."""

from __future__ import annotations


class OpsError(Exception):
    """Base of every expected failure. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InventoryError(OpsError):
    exit_code = 2


class UsageError(OpsError):
    exit_code = 2


class SshError(OpsError):
    """Anything that went wrong reaching or talking to a host."""

    exit_code = 10

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host


class HostUnreachable(SshError):
    exit_code = 11


class AuthFailed(SshError):
    exit_code = 12


class HostKeyUnknown(SshError):
    exit_code = 13


class HostKeyMismatch(SshError):
    exit_code = 14


class CommandFailed(SshError):
    exit_code = 15

    def __init__(self, host: str, command: str, rc: int, stderr_tail: str) -> None:
        tail = stderr_tail.strip()
        super().__init__(host, f"`{command}` exited {rc}" + (f": {tail}" if tail else ""))
        self.command = command
        self.rc = rc
        self.stderr_tail = tail


class CommandTimeout(SshError):
    exit_code = 16

    def __init__(self, host: str, command: str, timeout: float) -> None:
        super().__init__(host, f"`{command}` did not finish within {timeout:g}s and was killed on the host")
        self.command = command
        self.timeout = timeout


class LockHeld(OpsError):
    exit_code = 20


class DeployFailed(OpsError):
    exit_code = 30


class GateFailed(OpsError):
    exit_code = 31


class TestbedError(OpsError):
    exit_code = 40


# Exit codes of outcomes that are answers rather than errors (docs/exit-codes.md); errors carry their own above.
EXIT_NOT_CONFIRMED = 1  # a prompt answered no: nothing was done
EXIT_LOCK_HELD = 1  # `opsctl lock HOST` found the lock held (a status, like `test`)
EXIT_UNIT_INACTIVE = 3  # `opsctl service HOST status` on a unit that is not active (as `systemctl status`)
EXIT_INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP, after the host was restored
# The gate saw no verify traffic (probe disabled, host idle): rolled back, the release not marked bad.
EXIT_UNPROVEN = 32
