"""The model's own names for its modules in the report: torch's Python tracer calls a module's forward
"nn.Module: Linear_3" (its class and a counter); the trace's tree keeps which object it was, and the
user's objects say what the code calls it ("model.lm_head")."""

from __future__ import annotations

from collections.abc import Iterable

MODULE_MARK = "nn.Module: "


def module_labels(tree: Iterable, paths: dict[int, str]) -> dict[str, str]:
    """Tracer name ("nn.Module: Linear_3") -> "nn.Module: model.lm_head (Linear)" for each module call in
    the tree whose object is one of ``paths`` (id -> name); the others keep the tracer's name."""
    labels: dict[str, str] = {}
    if not paths:
        return labels
    pending = list(tree)
    while pending:
        node = pending.pop()
        pending.extend(node.children)
        if node.tag.name != "PyCall":
            continue
        name = node_name(node)
        if not name.startswith(MODULE_MARK) or name in labels:
            continue
        info = getattr(node.extra_fields, "module", None)
        path = paths.get(getattr(info, "self_ptr", None))
        if path is not None:
            labels[name] = f"{MODULE_MARK}{path} ({info.cls_name})"
    return labels


def node_name(node) -> str:
    """An event tree node's name; "" where torch 2.13's Python tracer garbled its own frame's name."""
    try:
        return node.name
    except UnicodeDecodeError:
        return ""
