"""Health of deployed hosts (``opsctl health``, the opsctl-health timer), one module a job:

- ``probe``: the one SSH round trip and the reader of its output (``ssh_probe``, ``facts_from_probe``);
- ``findings``: what the probe found (``HostFacts``), plain data;
- ``checks``: the pure judgement of one host's facts (``evaluate``), and ``check_hosts`` over many;
- ``levels``: OK / WARN / CRIT per check and host, the record of a run, the exit codes;
- ``localstate``: the state directory, atomic writes and the history of runs on the machine running opsctl;
- ``alerts``: the alert hook; ``schedule``: the systemd timer.
"""
