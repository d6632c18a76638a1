"""The single-host commands of docs/pipeline.md: deploy, restart, rollback, adopt, each a list of steps.

- ``plan.py``: what a deploy would do or why it refuses (pure);
- ``runner.py``: runs a command's steps: lock, timings, history, compensation (every outcome in its docstring);
- ``steps.py``: the steps the commands share (switch, unit, restart, gate) and their undos;
- ``deploy.py``, ``restart.py``, ``adopt.py``: the commands' step lists;
- ``rollback.py``: every path that puts an earlier release back (the rollback command, the deploy's undo, restart
  --rollback-on-fail, and where a rollback goes);
- ``prerestart.py``: the build and the pre-restart parity; ``watch.py``: the restart and the gate loop;
- ``signals.py``, ``report.py``, ``result.py``: signals, progress, results.
"""

from ..ssh.session import Connect, Session, default_connect
from .adopt import adopt
from .deploy import deploy
from .plan import DeployOptions, Plan, make_plan
from .prerestart import prerestart_fail_reason
from .report import NullReporter, Reporter
from .restart import restart
from .result import DeployResult, DeployVerdict, HistoryRecord
from .rollback import rollback, rollback_target
from .signals import Interrupted

__all__ = [
    "Connect",
    "DeployOptions",
    "DeployResult",
    "DeployVerdict",
    "HistoryRecord",
    "Interrupted",
    "NullReporter",
    "Plan",
    "Reporter",
    "Session",
    "adopt",
    "default_connect",
    "deploy",
    "make_plan",
    "prerestart_fail_reason",
    "restart",
    "rollback",
    "rollback_target",
]
