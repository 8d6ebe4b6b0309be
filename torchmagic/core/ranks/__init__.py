"""Ranks: a cell's code run in N processes as ``torchrun`` runs a script's workers.

The notebook side starts and stops the processes (processes.py), shows their output live
(output.py), sends them variables (share.py) and, for a magic that steers its ranks step by step,
talks to them over pipes (control.py).  The rank side (rank.py) joins the process group, loads what
was shared and shows the cell's frames only when the cell fails.
"""

from .control import RankControl
from .output import RankOutput
from .processes import EXIT_SETUP_FAILED, Node, RankFailed, RankProcesses, choose_backend, failure_error
from .share import pickle_shared

__all__ = ["EXIT_SETUP_FAILED", "Node", "RankControl", "RankFailed", "RankOutput", "RankProcesses", "choose_backend",
           "failure_error", "pickle_shared"]
