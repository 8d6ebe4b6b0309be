"""No release a Ctrl-C can skip: every ``finally`` in torchmagic gives things back through the one
mechanism (core/interrupts.py), read from the package's source.

A real SIGINT is handled where the eval loop checks (a Python function's start, after a call to C
returns, a backward jump).  In a frame that is not marked ``@uninterruptible``, a ``finally`` whose
release takes two calls, or one call into unmarked Python code, can be cut in the middle.  So each
statement of such a ``finally`` must be a call to a marked function (or a HeldScope), a store or
``del`` with no call in it (no check point), or an ``if`` on a call-free test around those.  The few
that are none of these are listed below, each with why a Ctrl-C cannot split it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torchmagic

PACKAGE = Path(torchmagic.__file__).parent

# (module, function) -> why its finally is safe as it is
AUDITED = {
    ("core/devices/nvml.py", "nvml_reading"): "one C call (nvmlShutdown), checked only after it returns",
    ("core/devices/nvml.py", "energy_mj"): "one C call (nvmlShutdown), checked only after it returns",
    ("core/devices/select.py", "use_device"): "one C call (list.remove)",
    ("core/ipython.py", "run_from_button"): "one C call (ContextVar.reset)",
    ("features/autobatch/magic.py", "autobatch"): "a status line cleared: display only, nothing held",
    ("features/autobatch/magic.py", "_ranks"): "a status line cleared: display only, nothing held",
    ("features/compare/magic.py", "amp_compare"): "a status line cleared: display only, nothing held",
    ("features/loadertune/magic.py", "loadertune"): "a status line cleared: display only, nothing held",
    ("features/autobatch/magic.py", "step"): "each branch one C-level dict operation on the user's namespace",
    ("features/autobatch/magic.py", "_step"): "each branch one C-level dict operation on the user's namespace",
    ("features/autobatch/worker.py", "main"): "a rank's own process: no guard, a SIGINT ends the process",
    ("features/profile/traces/worker.py", "main"): "a rank's own process: no guard, a SIGINT ends the process",
    ("features/memory/watch.py", "_run"): "the watch's thread: signals are handled on the main thread only",
}


def _marked_names(trees: dict[str, ast.Module]) -> set[str]:
    """Functions marked @uninterruptible and HeldScope classes, by name; a name also defined unmarked
    elsewhere in the package is ambiguous and not counted (``close``: the tuner's is marked, a status
    line's is not)."""
    marked, unmarked = set(), set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                is_marked = any(isinstance(d, ast.Name) and d.id == "uninterruptible" for d in node.decorator_list)
                (marked if is_marked else unmarked).add(node.name)
            elif isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "HeldScope" for b in node.bases):
                marked.add(node.name)
    return (marked - unmarked) | {"deliver_pending"}


def _called(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) for n in ast.walk(node))


def _safe(statement: ast.stmt, marked: set[str]) -> bool:
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        return name in marked and not any(_called(a) for a in [*statement.value.args,
                                                                *(k.value for k in statement.value.keywords)])
    if isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete, ast.Pass)):
        return not _called(statement)
    if isinstance(statement, ast.If):
        return not _called(statement.test) and all(_safe(s, marked) for s in [*statement.body, *statement.orelse])
    return False


def _releases_outside_the_mechanism() -> dict[tuple[str, str], list[str]]:
    trees = {str(p.relative_to(PACKAGE)): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    marked = _marked_names(trees)
    found: dict[tuple[str, str], list[str]] = {}
    for module, tree in trees.items():
        held_scope_methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                              and any(getattr(b, "id", None) == "HeldScope" for b in c.bases)
                              for f in c.body if isinstance(f, ast.FunctionDef) and f.name in ("acquire", "release")}
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or id(fn) in held_scope_methods:
                continue  # a HeldScope's acquire and release run inside its marked __enter__/__exit__
            if any(isinstance(d, ast.Name) and d.id == "uninterruptible" for d in fn.decorator_list):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Try) and node.finalbody:
                    bare = [ast.unparse(s).splitlines()[0] for s in node.finalbody if not _safe(s, marked)]
                    if bare:
                        found.setdefault((module, fn.name), []).extend(bare)
    return found


def test_every_release_goes_through_a_marked_function():
    found = _releases_outside_the_mechanism()
    unaudited = {where: lines for where, lines in found.items() if where not in AUDITED}
    assert not unaudited, ("a finally that a Ctrl-C can cut: move its release into an @uninterruptible function "
                           f"(or a HeldScope): {unaudited}")
    stale = set(AUDITED) - set(found)
    assert not stale, f"audited entries that no longer need to be: {stale}"


def test_the_check_refuses_a_bare_release():
    # what it would say of the autobatch search as it was: the weights restored, then the cache emptied,
    # in the finally of an unmarked frame (a Ctrl-C between the two was possible)
    source = "def search():\n    try:\n        run()\n    finally:\n        snapshot.restore()\n        _release(device)\n"
    fn = ast.parse(source).body[0]
    assert [_safe(s, {"restore"}) for s in fn.body[0].finalbody] == [True, False]
