"""The running IPython shell, if any, found without importing IPython (plain Python stays light)."""

from __future__ import annotations

import sys
from typing import Any


def current_shell() -> Any | None:
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None
