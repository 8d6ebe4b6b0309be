"""Where a finding's time is inside a library's own loop (read from Python stacks): which call, and
what that library offers instead of a training-loop pattern."""

from __future__ import annotations

import re

from .summary import largest

LIBRARY_SHARE = 0.5  # a library call holding this share of the syncs (or small ops) is named as their source
_FRAME = re.compile(r"^(?P<path>.*)\((?P<line>\d+)\): (?P<function>.*)$")


def library_call(counts, total: int) -> tuple[str, str] | None:
    """(package, function) of the library call the user's code made that holds most of ``total``
    (read from Python stacks: --stack, --memory), where it holds at least LIBRARY_SHARE of it."""
    if not counts or not total:
        return None
    frame, n = largest(counts, 1)[0]
    match = _FRAME.match(frame)
    if n < LIBRARY_SHARE * total or match is None:
        return None
    path = match["path"].replace("\\", "/")
    package = path.split("site-packages/", 1)[-1].split("dist-packages/", 1)[-1].split("/", 1)[0].removesuffix(".py")
    return package, match["function"]


def possessive(name: str) -> str:
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def library_fix(package: str, function: str, model: str) -> tuple[str, str]:
    """What the library itself offers for a loop of small steps with host reads (its own switch)."""
    if package == "transformers" and function in ("generate", "_sample", "_greedy_search", "_beam_search"):
        return ("transformers' generate reads the decoding loop's values on the host each token; give it a static "
                "KV cache and compile the decoding step, so each token is one CUDA graph replay (its torch.compile "
                "guide).",
                f"{model}.generation_config.cache_implementation = 'static'\n"
                f"{model}.forward = torch.compile({model}.forward, mode='reduce-overhead', fullgraph=True)")
    if package in ("lightning", "pytorch_lightning"):
        return ("Lightning's loop reads what the step logs: log with on_step=False, on_epoch=True (and sync_dist "
                "only where needed), and return the loss without .item() from training_step.",
                "self.log('train_loss', loss, on_step=False, on_epoch=True)   # in training_step")
    return (f"The calls come from inside {possessive(package)} {function}, a loop of its own: look for its "
            "option to keep values on the device or run whole steps at once, or compile the loop you call it from.",
            f"{model} = torch.compile({model})   # the calls into {package} that your step makes")
