"""The host commands of docs/pipeline.md: deploy, restart, rollback, adopt, each a list of steps.

- ``plan.py``: what a deploy would do or why it refuses, where a rollback goes (pure);
- ``runner.py``: runs a command's steps: lock, timings, history, compensation (every outcome in its docstring);
- ``steps.py``: the steps the commands share (switch, unit, restart, gate, restore) and their undos;
- ``ship.py``, ``restart.py``, ``adopt.py``: the commands' step lists;
- ``checks.py``: the build and the pre-restart parity; ``watch.py``: the restart and the gate loop;
- ``session.py``, ``lease.py``, ``signals.py``, ``report.py``, ``result.py``: connection, lock lease, signals,
  progress, results.
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
