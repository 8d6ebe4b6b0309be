"""What torch.compile did while a variant ran: graphs compiled, recompiles, graph breaks, cache hits,
the functions dynamo gave up on (and why), and whether compiled graphs ran at all.

Read from dynamo's global counters and its compilation metrics before and after a phase.  Whether
a variant ran compiled code is read from the profiler's events of one run, not inferred from the
counters: dynamo never tries again code it once gave up on, so a later variant (compile+amp, or the
same cell compared again) counts no compile and no failure while it runs all of it eager.  A
"compiled" variant that ran no compiled graph must never be reported as compiled.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import CodeType

from ...core.devices.profiler import ProfiledScope
from ...core.interrupts import deliver_pending, uninterruptible

REASON_CHARS = 300    # of one function's reason for being given up on, in a note
NAMED_FUNCTIONS = 3   # functions given up on that a note names (the rest are counted)
_NEXT_BREAK = "*** While handling this graph break, another graph break occurred: ***"
_GRAPH_CALL = "## Call CompiledFxGraph"     # inductor's record_function around each compiled graph it runs
_COMPILED_FRAME = "Torch-Compiled Region"   # dynamo's, around each frame it runs compiled code for


@dataclass(frozen=True)
class GaveUp:
    """A function dynamo tried to compile and gave up on: it runs eager, whole (a graph break inside a
    loop, or an unsupported object where dynamo cannot break the graph)."""

    key: tuple               # (compile id, start time): tells one attempt from another
    code: tuple[str, int]    # (file, first line) of the function's code
    name: str                # the code's name, e.g. "forward"
    why: str                 # dynamo's reason as it wrote it (several lines; graph breaks it led to)
    line: int | None = None  # the line where dynamo gave up

    @property
    def reason(self) -> str:
        """Dynamo's reason on one line (parsed only when shown: the counters are read around every block)."""
        return _one_line_reason(self.why, self.line)


@dataclass(frozen=True)
class CompileCounts:
    frames: int = 0         # frames dynamo converted: first compiles and recompiles
    graphs: int = 0         # FX graphs handed to the backend
    graph_breaks: int = 0
    cache_hits: int = 0     # inductor's FX graph cache (on disk): a warm compile
    cache_misses: int = 0
    break_reasons: tuple[str, ...] = ()
    cudagraph_skips: int = 0  # graphs inductor left without CUDA graphs (reduce-overhead, max-autotune)
    gave_up: tuple[GaveUp, ...] = ()  # functions dynamo tried and gave up on (the last 64 dynamo keeps)

    def __add__(self, other: CompileCounts) -> CompileCounts:
        reasons = self.break_reasons + tuple(r for r in other.break_reasons if r not in self.break_reasons)
        gave_up = self.gave_up + tuple(g for g in other.gave_up if g not in self.gave_up)
        return CompileCounts(self.frames + other.frames, self.graphs + other.graphs,
                             self.graph_breaks + other.graph_breaks, self.cache_hits + other.cache_hits,
                             self.cache_misses + other.cache_misses, reasons,
                             self.cudagraph_skips + other.cudagraph_skips, gave_up)

    def __sub__(self, before: CompileCounts) -> CompileCounts:
        reasons = tuple(r for r in self.break_reasons if r not in before.break_reasons)
        gave_up = tuple(g for g in self.gave_up if g not in before.gave_up)
        return CompileCounts(self.frames - before.frames, self.graphs - before.graphs,
                             self.graph_breaks - before.graph_breaks, self.cache_hits - before.cache_hits,
                             self.cache_misses - before.cache_misses, reasons,
                             self.cudagraph_skips - before.cudagraph_skips, gave_up)


def compile_counts() -> CompileCounts:
    """Dynamo's counters now (all zero when dynamo was never imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return CompileCounts()
    counters = utils.counters
    breaks = counters.get("graph_break", {})
    inductor = counters.get("inductor", {})
    return CompileCounts(
        frames=counters.get("frames", {}).get("total", 0),
        graphs=counters.get("stats", {}).get("unique_graphs", 0),
        graph_breaks=sum(breaks.values()),
        cache_hits=inductor.get("fxgraph_cache_hit", 0),
        cache_misses=inductor.get("fxgraph_cache_miss", 0),
        break_reasons=tuple(_first_line(reason) for reason in breaks),
        cudagraph_skips=inductor.get("cudagraph_skips", 0),
        gave_up=_gave_up(utils),
    )


def _gave_up(utils) -> tuple[GaveUp, ...]:
    """The functions dynamo's compilation metrics record as tried and not compiled (a backward graph's
    failure has no code: it raises in the step, and the variant fails)."""
    getter = getattr(utils, "get_compilation_metrics", None)  # private: a newer torch may move it
    if getter is None:
        return ()
    return tuple(GaveUp((m.compile_id, m.start_time), (m.co_filename, m.co_firstlineno), m.co_name,
                        m.fail_reason or m.fail_type, m.fail_user_frame_lineno)
                 for m in getter() if m.fail_type and not m.has_guarded_code and m.co_name)


def _one_line_reason(reason: str, line: int | None) -> str:
    """Dynamo's reason on one line: each graph break's type, the first's explanation and first hint
    (the actionable part, e.g. ``allow_rnn=True``), and then what it led to (``graph break in loop``)."""
    sections = [s.strip().splitlines() for s in reason.split(_NEXT_BREAK) if s.strip()]
    if not sections:
        return "no reason given"
    first = sections[0]
    said = {k: next((ln.strip().removeprefix(k).strip() for ln in first if ln.strip().startswith(k)), None)
            for k in ("Explanation:", "Hint:")}
    text = first[0].strip() + (f" at line {line}" if line else "")
    text += f": {said['Explanation:'].rstrip('.')}" if said["Explanation:"] else ""
    text += f" (hint: {said['Hint:'].rstrip('.')})" if said["Hint:"] else ""
    text += "".join(f"; then {s[0].strip()}" for s in sections[1:])
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1].rsplit(" ", 1)[0] + "…"


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0] if reason.strip() else "unknown reason"


@contextlib.contextmanager
def loud_recompile_limit(compiled_variants: int) -> Iterator[int]:
    """Make dynamo raise, not silently run eager, when it hits its recompile limit; yields the
    limit as the user had it.

    The variants compile the same forward code, and dynamo counts its cache entries per code
    object, so the limit is scaled by the number of compiled variants: each keeps the room
    it would have alone.  Both settings are put back afterwards.
    """
    import torch._dynamo

    config = torch._dynamo.config
    saved = config.recompile_limit, config.fail_on_recompile_limit_hit
    config.recompile_limit = saved[0] * max(compiled_variants, 1)
    config.fail_on_recompile_limit_hit = True
    try:
        yield saved[0]
    finally:
        _put_limit_back(config, saved)


@uninterruptible
def _put_limit_back(config, saved: tuple) -> None:
    # two settings, each set through the config module's own (Python) __setattr__: a Ctrl-C between them waits
    config.recompile_limit, config.fail_on_recompile_limit_hit = saved
    deliver_pending()


def is_recompile_limit(error: BaseException) -> bool:
    return type(error).__name__ == "FailOnRecompileLimitHit"


@dataclass
class CompiledCalls:
    """What one run executed of compiled code, from the profiler's events."""

    graphs: int = 0   # inductor graph calls (forward and backward)
    frames: int = 0   # frames dynamo ran compiled code for (a frame may hold an empty graph)


class compiled_calls(ProfiledScope):
    """Count the compiled graphs and frames the code in the scope ran, from the record_function
    events inductor and dynamo emit while a profiler runs: the one evidence that compiled code ran
    which dynamo's counters cannot fake (code it gave up on earlier runs eager and counts nothing).
    A Ctrl-C in the scope always finds the profiler stopped and fd 2 back (ProfiledScope)."""

    __slots__ = ()

    def reading(self) -> CompiledCalls:
        return CompiledCalls()

    def read(self, events, calls: CompiledCalls) -> None:
        for event in events:
            name = event.name()
            calls.graphs += name.startswith(_GRAPH_CALL)
            calls.frames += name.startswith(_COMPILED_FRAME)


@dataclass(frozen=True)
class ModelFunction:
    label: str       # how a note names it: "Class.forward" (dynamo's metrics know only the code's name)
    code: CodeType


def model_functions(model) -> dict[tuple[str, int], ModelFunction]:
    """The forward of each module class in ``model``, by (file, first line) as dynamo's metrics name code."""
    found = {}
    for module in model.modules() if model is not None else ():
        code = getattr(type(module).forward, "__code__", None)
        if isinstance(code, CodeType):
            found.setdefault((code.co_filename, code.co_firstlineno),
                             ModelFunction(f"{type(module).__name__}.forward", code))
    return found


def describe_gave_up(gave_up: Iterable[GaveUp], functions: dict[tuple[str, int], ModelFunction]) -> str:
    """The functions dynamo gave up on, each with where it is and why, for a note: bounded in length."""
    unique = list({g.code: g for g in gave_up}.values())  # a function retried (a recompile) is named once
    parts = [f"{label_of(g, functions)} ({os.path.basename(g.code[0])}:{g.code[1]}): {g.reason}"
             for g in unique[:NAMED_FUNCTIONS]]
    more = len(unique) - NAMED_FUNCTIONS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def label_of(gave_up: GaveUp, functions: dict[tuple[str, int], ModelFunction]) -> str:
    known = functions.get(gave_up.code)
    return known.label if known is not None else gave_up.name


def given_up_now(functions: dict[tuple[str, int], ModelFunction]) -> tuple[GaveUp, ...]:
    """The model's functions dynamo gave up on earlier (its metrics keep its last 64 attempts) and still
    skips: dynamo marks such code and never tries it again, so it holds no compiled code; after
    torch._dynamo.reset() it is tried afresh, and then it either compiles or is given up on anew."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list  # private: read where it is there

    return tuple(g for g in compile_counts().gave_up
                 if g.code in functions and not _debug_get_cache_entry_list(functions[g.code].code))


def not_compiled_reason(since_build: CompileCounts, model) -> str:
    """Why a compiled variant ran no compiled graph, from what dynamo did since it was built and before."""
    functions = model_functions(model)
    if since_build.gave_up:
        return f"dynamo gave up on {describe_gave_up(since_build.gave_up, functions)}"
    earlier = given_up_now(functions)
    if earlier:
        return (f"dynamo gave up on {describe_gave_up(earlier, functions)}, earlier in this process, and never "
                "tries that code again (torch._dynamo.reset() makes it)")
    if since_build.frames == 0:
        return ("dynamo compiled nothing the code ran: the code calls only what torch.compile(model) leaves out "
                "(the model's submodules or other methods), or what dynamo gave up on earlier in this process")
    breaks = "; ".join(since_build.break_reasons[:2])
    return "dynamo produced no graph for this code" + (f" ({breaks})" if breaks else "")
