"""The gate's host program on a real host (testbed tb1: Debian's python3, systemd, the stand-in server): systemd
itself reads an environment file as the program does (issue 36 item 9); a 140 KB prompt goes through SSH on stdin
and reaches the server (item 7: `Argument list too long` before); and the comparison workload (issue 37) gives the same answers twice on
the same release, with every request's record as the judge reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.comparison.workload import run_workload
from opsctl.inventory import CompareSettings, HostConfig, Inventory
from opsctl.probe import envfile
from opsctl.probe.traffic import ProbeClient
from opsctl.ssh import connect
from tests.pipeline.test_testbed_deploy import ensure_good, fast

# Lines systemd must read as the program does: a NEL, a line separator, a form feed inside a value (not line ends),
# a carriage return (a line end to both), quotes and their escapes, a continuation, comments, spaces, repeats.
ENV_TEXT = (
    "A=x\x85B=injected\n"
    "C=a\rD=b\n"
    'E="q \\"w\\" \\$x \\y"\n'
    "F='lit \\n $y'\n"
    "G=a\\\nb\n"
    "H = spaced value  \n"
    "#I=comment\n"
    ";J=comment\n"
    "K=1\nK=2\n"
    "L=a\x0cM=b\n"
    "N=a\u2028O=b\n"
    "P='a'\"b\"c\n"
)
NAMES = "ABCDEFGHIJKLMNOP"


@pytest.fixture
def tb1(testbed: Inventory) -> HostConfig:
    return fast(testbed.host("tb1"))


def test_systemd_reads_an_environment_file_as_the_program_does(tb1: HostConfig) -> None:
    with connect(tb1) as r:
        r.write_file("/tmp/opsctl-envfile-test.env", ENV_TEXT.encode(), mode=0o600)
        out = r.run(
            "systemd-run --quiet --wait --pipe --collect -p EnvironmentFile=/tmp/opsctl-envfile-test.env "
            "/usr/bin/env -0",
            timeout=60,
        ).stdout
    seen = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    systemd = {k: seen[k] for k in NAMES if k in seen}
    assert systemd == {k: v for k, v in envfile.parse_environment_file(ENV_TEXT).items() if k in NAMES}
    assert systemd["A"] == "x\x85B=injected" and "B" not in systemd  # what str.splitlines() got wrong


def test_a_140_kb_prompt_and_the_comparison_workload_on_the_standin(
    tb1: HostConfig, good_tree: Path, good_id: str
) -> None:
    ensure_good(tb1, good_tree, good_id)
    prompt = "word " * 28_000
    probe = tb1.gate.probe.model_copy(update={"prompts": [prompt], "requests": 1, "max_new_tokens": 2})
    host = tb1.model_copy(update={"gate": tb1.gate.model_copy(update={"probe": probe})})
    with connect(host) as r:
        client = ProbeClient(host, lambda: r)
        assert client.ready(30).ready
        wave = client.wave()
        # The prompt reached the server, which judged it (the stand-in's context is short: a 400 naming the
        # prompt's length); before, the command never ran (`Argument list too long`).
        (request,) = wave.requests
        assert request.ok or (request.status == 400 and "the prompt" in (request.error or "")), request
        settings = CompareSettings(
            prompts=["The capital of France is", "def f(x):", "Once upon"], max_new_tokens=8, concurrency=1
        )
        first, second = (run_workload(r, host, settings=settings) for _ in range(2))
    for run in (first, second):
        assert (run.warmup_sent, run.warmup_failed, run.unsent) == (2, 0, 0)
        assert len(run.sample.requests) == 3 and all(q.ok for q in run.sample.requests), run.sample.to_json()
        for q in run.sample.requests:
            assert len(q.output_ids) == q.completion_tokens == 8
            assert q.ttft_s is not None and q.decode_s_per_token is not None and q.decode_s_per_token > 0
            assert q.spec_verify_ct is None or q.spec_verify_ct >= 1
            assert (q.load is None) == (run.sample.load_source is None)
    # Greedy, same release: the same answers (A/A)
    assert [q.output_ids for q in first.sample.requests] == [q.output_ids for q in second.sample.requests]
    print(json.dumps({"elapsed_s": [first.elapsed_s, second.elapsed_s], "sample": first.sample.to_json()}))
