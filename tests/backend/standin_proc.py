"""The stand-in server (kdtree_backend.serve) as a subprocess on a free loopback port, for the backend tests."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.backend.helpers import PYTHON, REPO, replay_env

TOKEN = "standintest0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Standin:
    """A running ``python -m kdtree_backend.serve``; its output lines are collected as they come."""

    def __init__(
        self,
        tmp: Path,
        *,
        config: Mapping[str, Any] | None = None,
        args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
        tp: int = 2,
        load_delay: float = 1.5,
        root: Path = REPO,
    ) -> None:
        self.port = free_port()
        environ = replay_env(root)
        environ["KDTREE_PARITY_TOKEN"] = TOKEN
        if config is not None:
            path = tmp / f"kdtree-{self.port}.json"
            path.write_text(json.dumps(config))
            environ["KDTREE_CONFIG"] = str(path)
        environ.update(env or {})
        argv = [PYTHON, "-m", "kdtree_backend.serve", "--port", str(self.port), "--tp-size", str(tp)]
        argv += ["--load-delay", str(load_delay), *args]
        self.proc = subprocess.Popen(
            argv, cwd=root, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, want: Callable[[str], bool], timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if want(line):
                    return line
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no such line within {timeout}s; output:\n" + "\n".join(self.lines))

    def settled_lines(self, quiet_s: float = 0.5, timeout: float = 30.0) -> list[str]:
        """The output once it has stopped growing for ``quiet_s``: a request's answer can come back before this
        process's reader thread has taken in the lines the server printed while serving it (a loaded machine)."""
        deadline = time.monotonic() + timeout
        seen, since = len(self.lines), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if len(self.lines) != seen:
                seen, since = len(self.lines), time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
        return list(self.lines)

    def wait_started(self) -> None:
        self.wait_line(lambda line: line.startswith("kdtree-standin: started"))

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Poll /health until 200; returns the seconds it took."""
        t = time.monotonic()
        while time.monotonic() - t < timeout:
            try:
                if self.get("/health")[0] == 200:
                    return time.monotonic() - t
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("the stand-in never became ready:\n" + "\n".join(self.lines))

    def request(
        self, method: str, path: str, body: object = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, str, bytes]:
        """(status, content type, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=dict(headers or {}))
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type") or "", resp.read()
        finally:
            conn.close()

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, str, bytes]:
        return self.request("GET", path, headers=headers)

    def post(self, path: str, body: object, headers: Mapping[str, str] | None = None) -> tuple[int, Any]:
        status, _, raw = self.request("POST", path, body, {"Content-Type": "application/json", **(headers or {})})
        return status, json.loads(raw) if raw else None

    def kdtree_lines(self) -> list[str]:
        return [line for line in self.lines if line.startswith("[kdtree]")]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        return code


def sse_events(raw: bytes) -> list[str]:
    """The ``data:`` payloads of a text/event-stream body, in order."""
    events = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(block[len("data: ") :])
    return events
