"""The pre-restart speed check's program on the host: this release's verify path against another release's (the
running one), on the same calls, alternating A B, B A, ... (docs/gate.md "The pre-restart speed check").

    cd <new release> && python3 -m kdtree_backend.speed_ab --against <old release dir>   # config JSON on stdin

Standard library only: it starts two workers (``deploy/speed_worker.py`` of THIS release, each run with the
working directory and ``PYTHONPATH`` of the release it times), has the new side build the calls and both sides
load them, then for each round times every call on both sides back to back, the order flipped every round, so
that a drift of the host (clocks, another process) falls on both sides of each pair alike. It judges nothing:
it prints one JSON document with every pair, and opsctl judges it (``opsctl.speed``).

Config (stdin, JSON): ``cases`` [[bs, prefix, q_len, heads], ...] (null: chosen for the device, below),
``q_len``, ``heads`` (for the chosen cases; heads null: this release's ``replay.heads``), ``rounds``,
``budget_s`` (the rounds stop once it is spent, after at least :data:`MIN_ROUNDS`), ``graphs``, ``device``,
``cpu`` (the CPU both workers are pinned to: :func:`shared_cpu`),
``seed``, ``timing_ms`` (a timing is as many back-to-back calls as take about this long; default 3), ``tries``
(each time is the fastest of this many timings, the two sides' timings interleaved A B B A ...: contention only
adds time, and a busy moment of the host falls on both sides; default 5).

Exit status: 0 with the document; 2 bad usage; 4 the check cannot run here (``{"cannot": why}``: the old release
has no ``kernel/``, a worker failed to start or to load, ...), which a deploy reports and does not count against
the release.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_CANNOT = 4
MIN_ROUNDS = 3
# The synthetic set per device: batch sizes (a bs >= 8 case included: the kernel's plan changes with the batch)
# and prefix lengths that cover what a host serves. On the CPU (the testbed's stand-in) the reference path is
# timed at the stand-in's own small sizes.
CUDA_BATCHES = (1, 8, 32)
CUDA_PREFIXES = (1024, 8192, 32768)
CPU_BATCHES = (1, 2, 8)
CPU_PREFIXES = (64, 128)


class Worker:
    """One side: a worker process of this release's ``deploy/speed_worker.py`` in ``release``'s tree."""

    def __init__(self, name: str, release: Path, script: Path, cpu: int | None = None) -> None:
        self.name = name
        env = {
            **os.environ,
            "PYTHONPATH": f"{release / 'kernel'}{os.pathsep}{release / 'backend'}",
            "PYTHONDONTWRITEBYTECODE": "1",  # never write into a release another process may be serving from
        }
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], cwd=release, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, bufsize=1, preexec_fn=None if cpu is None else _pinned(cpu),
        )  # fmt: skip

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(json.dumps(cmd) + "\n")
            stdin.flush()
        except BrokenPipeError:
            pass
        line = stdout.readline()
        if not line:
            raise WorkerFailed(f"{self.name} side: the worker exited ({self._stderr_tail()})")
        doc = json.loads(line)
        if "error" in doc:
            raise WorkerFailed(f"{self.name} side: {doc['error']} ({self._stderr_tail()})")
        return doc

    def _stderr_tail(self) -> str:
        self.proc.kill()
        err: IO[str] | None = self.proc.stderr
        text = err.read() if err is not None else ""
        lines = [line for line in text.strip().splitlines() if not line.startswith("[W")]  # torch's warnings
        return " | ".join(lines[-6:]) or f"exit {self.proc.wait()}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class WorkerFailed(Exception):
    pass


def shared_cpu(config: dict[str, Any]) -> int | None:
    """The one CPU both workers run on (config ``cpu``; default the last this program may use; None: unpinned).

    On the testbed, with each worker free to move, an A/A check measured 0.91x (p=0.0002): for whole rounds one
    side ran 1.4x as long per call of CPU time while the other did not, the mark of a busy sibling of the core that
    side happened to be on. On one CPU whatever else runs on the host meets both sides alike. The two never run at
    once (one command at a time), so sharing a CPU costs neither of them anything."""
    if config.get("cpu") is False or not hasattr(os, "sched_getaffinity"):
        return None
    if isinstance(config.get("cpu"), int):
        return int(config["cpu"])
    return max(os.sched_getaffinity(0))


def _pinned(cpu: int) -> Any:
    def pin() -> None:  # in the child, before it runs Python: every thread it starts stays on ``cpu``
        os.sched_setaffinity(0, {cpu})

    return pin


def chosen_cases(config: dict[str, Any], device: str, heads: int) -> list[list[int]]:
    if config.get("cases"):
        return [[int(x) for x in case] for case in config["cases"]]
    q_len = int(config.get("q_len") or 9)
    cuda = device.startswith("cuda")
    batches = config.get("batch_sizes") or (CUDA_BATCHES if cuda else CPU_BATCHES)
    prefixes = config.get("prefixes") or (CUDA_PREFIXES if cuda else CPU_PREFIXES)
    return [[int(bs), int(prefix), q_len, heads] for bs in batches for prefix in prefixes]


def release_heads(release: Path) -> int:
    try:
        return int(json.loads((release / "deploy" / "kdtree.json").read_text())["replay"]["heads"])
    except (OSError, ValueError, KeyError, TypeError):
        return 8


class Session:
    """Both workers up and the calls loaded; :meth:`sample` then times them in rounds (the deploy takes one
    sample; the GPU machine's benchmark takes many from one session, kernel/bench/speed_ab.py)."""

    def __init__(self, config: dict[str, Any], new: Path, old: Path, log: IO[str]) -> None:
        self.config, self.started = config, time.monotonic()
        script = new / "deploy" / "speed_worker.py"
        self.cpu = shared_cpu(config)
        self.sides = {"new": Worker("new", new, script, self.cpu), "old": Worker("old", old, script, self.cpu)}
        try:
            with tempfile.TemporaryDirectory(prefix="kdtree-speed-") as tmp:
                calls_file = str(Path(tmp) / "calls.pt")
                device = str(config.get("device") or "auto")
                resolved = self.sides["new"].ask({"op": "device"})["device"] if device == "auto" else device
                heads = int(config.get("heads") or release_heads(new))
                self.cases = chosen_cases(config, resolved, heads)
                seed = int(config.get("seed") or 0)
                self.sides["new"].ask({"op": "build", "cases": self.cases, "file": calls_file, "seed": seed})
                load = {"op": "load", "file": calls_file, "device": device, "graphs": bool(config.get("graphs", True)),
                        "seed": seed}  # fmt: skip
                self.ready = {name: side.ask(load) for name, side in self.sides.items()}
        except BaseException:
            self.close()
            raise
        self.ready_s = time.monotonic() - self.started
        log.write(f"speed_ab: ready after {self.ready_s:.1f}s: {json.dumps(self.ready)}\n")
        self.reps = _reps(self.ready, float(config.get("timing_ms") or 3.0))
        self.tries = max(1, int(config.get("tries") or 5))

    def sample(self) -> dict[str, Any]:
        """Rounds until ``rounds`` or ``budget_s`` (from the session's start; at least :data:`MIN_ROUNDS`)."""
        config, sides = self.config, self.sides
        budget = float(config.get("budget_s") or 30.0)
        rounds_max = max(MIN_ROUNDS, int(config.get("rounds") or 8))
        pairs: list[dict[str, list[float]]] = [{"new": [], "old": []} for _ in self.cases]
        began, rounds = time.monotonic(), 0
        while rounds < rounds_max and (rounds < MIN_ROUNDS or time.monotonic() - self.started < budget):
            order = ("new", "old") if rounds % 2 == 0 else ("old", "new")
            for i in range(len(self.cases)):
                timing = {"op": "time", "call": i, "reps": self.reps[i], "tries": 1}
                best: dict[str, float] = {}
                for t in range(self.tries):  # interleaved: a busy moment of the host falls on both sides
                    for name in order if t % 2 == 0 else order[::-1]:
                        us = sides[name].ask(timing)["us"]
                        best[name] = min(us, best.get(name, us))
                for name in order:
                    pairs[i][name].append(best[name])
            rounds += 1
        return {
            "device": self.ready["new"]["device"],
            "cpu": self.cpu,
            "paths": {name: self.ready[name]["path"] for name in sides},
            "graphs": {name: self.ready[name]["graphs"] for name in sides},
            "rounds": rounds,
            "reps": self.reps,
            "ready_s": round(self.ready_s, 2),
            "rounds_s": round(time.monotonic() - began, 2),
            "elapsed_s": round(time.monotonic() - self.started, 2),
            "calls": [
                {"bs": c[0], "prefix": c[1], "q_len": c[2], "heads": c[3], "new_us": p["new"], "old_us": p["old"]}
                for c, p in zip(self.cases, pairs, strict=True)
            ],
        }

    def close(self) -> None:
        for side in self.sides.values():
            side.close()


def measure(config: dict[str, Any], new: Path, old: Path, log: IO[str]) -> dict[str, Any]:
    """Both workers up, the calls built and loaded, then the rounds: the document opsctl judges."""
    session = Session(config, new, old, log)
    try:
        return session.sample()
    finally:
        session.close()


def _reps(ready: dict[str, dict[str, Any]], timing_ms: float) -> list[int]:
    """Back-to-back calls per timing, the same on both sides: about ``timing_ms`` of the slower side's call."""
    slower = [max(a, b) for a, b in zip(ready["new"]["call_us"], ready["old"]["call_us"], strict=True)]
    return [max(1, min(1000, round(timing_ms * 1000.0 / max(us, 1.0)))) for us in slower]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kdtree_backend.speed_ab", description=__doc__.split("\n")[0])
    parser.add_argument("--against", required=True, type=Path, help="the release directory to time against")
    parser.add_argument("--new", type=Path, default=Path.cwd(), help="this release's directory (default: cwd)")
    args = parser.parse_args(argv)
    try:
        config = json.loads(sys.stdin.read() or "{}")
        if not isinstance(config, dict):
            raise ValueError("the config must be a JSON object")
    except ValueError as e:
        print(json.dumps({"error": f"config on stdin: {e}"}))
        return EXIT_USAGE
    new, old = args.new.resolve(), args.against.resolve()
    for side, path in (("new", new), ("old", old)):
        if not (path / "kernel").is_dir() or not (path / "backend").is_dir():
            print(json.dumps({"cannot": f"the {side} release {path} has no kernel/ and backend/ to time"}))
            return EXIT_CANNOT
    try:
        doc = measure(config, new, old, sys.stderr)
    except (WorkerFailed, ValueError, OSError) as e:
        print(json.dumps({"cannot": str(e)[:500]}))
        return EXIT_CANNOT
    print(json.dumps(doc))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
