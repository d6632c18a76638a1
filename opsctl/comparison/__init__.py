"""The comparison (docs/gate.md "The comparison"): two samples of the same workload, the running release's and the
new one's, judged request by request. The judge is pure (no I/O, no clock); only the workload talks to a host.

- ``workload``: the workload sent on the host's loopback by the probe's host program, and its answer read back;

- ``sample``: one side's requests as data (``ComparisonSample``, ``CompareRequest``), read strictly from untrusted
  JSON;
- ``results``: the verdict as data: the outcomes, the thresholds read, each part's result and the ``Comparison``;
- ``compare``: the judge (``compare``, a small judge a part), the second sample's ``confirm``, a sample judged
  alone, the rules in words;
- ``decode``: the decode-speed judge, the same prompt paired within each concurrency level;
- ``signedrank`` and ``mannwhitney``: the one-sided Wilcoxon signed-rank and Mann-Whitney U tests in plain Python
  (the signed-rank test is also the pre-restart speed check's).

Imports: ``errors``, ``inventory``, ``ssh`` and ``probe`` (the host program, its answers and the 4xx rule), for the
workload and the sample's reader; the judge's modules the standard library and this package only.
"""
