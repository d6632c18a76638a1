"""The probe traffic (docs/gate.md "The probe", "The comparison workload"): the requests the gate sends to the
service's own HTTP API on the host's loopback, and what they answered.

The operator's side:

- ``traffic``: the host program (``TRAFFIC_PROGRAM``), its configurations (``service_config``, ``ready_config``,
  ``wave_config``), ``ProbeClient`` (one remote command per readiness wait or wave) and the plan in words;
- ``answers``: the program's answers as data (``RequestOutcome``, ``Wave``, ``Readiness``, ``ProbeTally``), their
  readers (``document``, ``parse_ready``, ``parse_wave``) and the 4xx rule (``is_client_error``,
  ``failure_cause``). Pure.

The host program (standard library only, Python 3.10; shipped as one text in this order, opsctl/ssh/hostprogram.py):

- ``envfile``: the API key, from the service's EnvironmentFile read as systemd reads it;
- ``budget``: the time budget (``request_time_s``) and the scheduler (``in_budget``);
- ``stream``: one request (``send_one``) and the reader of its answer stream;
- ``readings``: the server's load (``/metrics``) and the host's calibration;
- ``modes``: ``ready``, ``wave`` and ``compare``;
- ``traffic_on_host``: the entry: the configuration's check, ``run``, ``main``.

May import: ``errors``, ``ssh`` (``Remote``, ``HostProgram``), ``inventory`` (under TYPE_CHECKING); the host
program's modules import only the standard library and each other.
"""
