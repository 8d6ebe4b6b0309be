"""The running IPython shell, if any, found without importing IPython (plain Python stays light), and
the names IPython and torch.compile put in a notebook's namespace."""

from __future__ import annotations

import re
import sys
from typing import Any


def current_shell() -> Any | None:
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


# IPython's own history: the output cache and the input history
HISTORY = re.compile(r"^(_+|_i+|_i?\d+|_oh|_ih|_dh|In|Out)$")


def is_history(name: str) -> bool:
    return bool(HISTORY.match(name))


def is_internal(name: str) -> bool:
    """Dunders, and the helper globals torch.compile adds to the globals of the code it compiles
    (a notebook's namespace): ``__import_torch_dot_nn...``, ``__builtins_dict___3``."""
    return name.startswith("__")
