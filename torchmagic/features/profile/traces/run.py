"""``torchmagic.analyze``: the traces a job wrote, one file per rank, each read into columns as it streams
(event_table.py), reduced per rank from them (rank.py), compared across ranks (cross.py) and diagnosed (rules.py); a
job of one rank also gets its operator-level report from the same columns (ops.py)."""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterable

from ....core.render.format import fmt_s
from ..kineto import timing_note, unread_note
from .cross import find_straggler, match_collectives, representative_lanes, summarize_rank
from .event_table import EventTable, read_table
from .ops import trace_profile
from .rank import RankTrace, rank_trace
from .fields import TEXT_CHARS, kind
from .reader import EVENT_CHARS, TraceFileError, shown_path
from .result import TraceAnalysis
from .rules import cross_rank_findings

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[_-]?([0-9]{1,9})", re.IGNORECASE)
MAX_RANKS = 1024         # trace files read in one analysis
MAX_META_INT = 1 << 31   # a rank or world size


def trace_files(source: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """The trace files behind ``source``: a file, a directory's ``*.json``/``*.json.gz`` files, or a
    list; at most ``MAX_RANKS`` of them (counted before any is read)."""
    if isinstance(source, (str, bytes, os.PathLike)):
        path = _path(source)
        mode = _mode(path)
        if not stat.S_ISDIR(mode):
            return [path]
        found = _listed(path)
        if not found:
            raise TraceFileError(path, "holds no trace files (*.json, *.json.gz)")
        return found
    try:
        items = iter(source)
    except TypeError:
        raise TraceFileError("analyze", f"takes a trace's path, a directory or a list of paths, not "
                                        f"{type(source).__name__}") from None
    paths = []
    for item in items:
        if not isinstance(item, (str, bytes, os.PathLike)):
            raise TraceFileError("analyze", f"takes a list of paths: one item is {type(item).__name__}")
        if len(paths) == MAX_RANKS:
            raise TraceFileError("analyze", _too_many(f"was given more than {MAX_RANKS:,} trace files"))
        paths.append(_path(item))
    if not paths:
        raise TraceFileError("analyze", "was given no trace files")
    return paths


def _path(item) -> str:
    return os.path.expanduser(os.fsdecode(item))


def _mode(path: str) -> int:
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        raise TraceFileError(path, "does not exist") from None
    except (OSError, ValueError) as exc:  # a loop of symbolic links, a NUL in the name ...
        raise TraceFileError(path, f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None


def _listed(directory: str) -> list[str]:
    """A directory's trace files, by name; refused when it cannot be listed or holds too many."""
    found = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.endswith(TRACE_SUFFIXES) and _is_file(entry):
                    if len(found) == MAX_RANKS:
                        raise TraceFileError(directory, _too_many(f"holds more than {MAX_RANKS:,} trace files"))
                    found.append(entry.path)
    except OSError as exc:
        raise TraceFileError(directory, f"cannot be listed ({exc.strerror or exc})") from None
    return sorted(found)


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _too_many(what: str) -> str:
    return f"{what}: analyze compares at most {MAX_RANKS:,} ranks (pass a list of those to compare)"


def analyze_traces(source, *, label: str | None = None, operators: bool = True) -> TraceAnalysis:
    """Read every trace of ``source`` and compare its ranks; with ``operators``, a job of one rank
    also gets its operator table and findings (from the same reading).  A file that is not a
    trace raises TraceFileError, whose traceback holds none of the frames that found it."""
    __tracebackhide__ = True  # noqa: F841
    try:
        return _analyze(source, label, operators)
    except TraceFileError as exc:
        raise exc.with_traceback(None) from None


def _analyze(source, label: str | None, operators: bool) -> TraceAnalysis:
    started = time.perf_counter()
    paths = trace_files(source)
    kept: list[EventTable] = []  # one rank's columns, for its operator report
    traces = []
    for path in paths:
        trace, columns = read_rank(path)
        traces.append(trace)
        if operators and len(paths) == 1:
            kept.append(columns)
        del columns  # (a rank's columns let go before the next is read)
    notes = _number_ranks(traces)
    for trace in traces:
        notes.extend(note if len(traces) == 1 else f"{shown_path(os.path.basename(trace.path))}: {note}"
                     for note in trace.read_notes)
    world_size = _one_world_size(traces)
    backend = next((t.backend for t in traces if t.backend), None)
    traces.sort(key=lambda t: t.rank)
    if world_size is not None and len(traces) < world_size:
        notes.append(f"traces for {len(traces)} of the job's {world_size} ranks "
                     f"({', '.join(str(t.rank) for t in traces)}): the others are not compared")
    for trace in traces:
        for note in (unread_note(trace.categories), timing_note(trace.categories)):
            if note:
                notes.append(note if len(traces) == 1 else f"rank {trace.rank}: {note}")
    unmarked = [t.rank for t in traces if not t.steps]
    if unmarked:
        notes.append(f"no ProfilerStep markers on rank(s) {', '.join(map(str, unmarked))}: each trace is "
                     "read as one step (call prof.step() once per iteration to compare steps)")
    matched, unmatched = match_collectives(traces)
    if unmatched:
        notes.append(f"{unmatched} collective(s) not found complete on every rank (cut short by the end of "
                     "profiling, or outside the profiled steps): their time counts as communication, "
                     "but not as waiting or transfer")
    if len(traces) == 1 and traces[0].collectives:
        notes.append("one rank: its collectives' waiting cannot be told from transfer without the other ranks' traces")
    ranks = [summarize_rank(t, m) for t, m in zip(traces, matched)]
    ahead = [r for r in ranks if r.device == "gpu" and r.compute_s > 1.05 * r.step_s]
    if ahead:
        r = max(ahead, key=lambda r: r.compute_s / r.step_s)
        notes.append(f"{'rank ' + str(r.rank) + ': ' if len(ranks) > 1 else ''}each step launched "
                     f"{fmt_s(r.compute_s)} of GPU work against {fmt_s(r.step_s)} of host time per step"
                     f"{' (and likewise on ' + str(len(ahead) - 1) + ' other rank(s))' if len(ahead) > 1 else ''}: "
                     "the host runs ahead of a busy GPU (GPU-bound), and the last steps' kernels ran after the "
                     "profiled window; compute counts what each step launched")
    straggler, phase, reason = find_straggler(ranks)
    lane_step, lanes = representative_lanes(traces)
    findings = cross_rank_findings(ranks, straggler, phase, reason)
    profile = None
    if operators and len(traces) == 1:  # one rank: its operators and findings, as %%torchprofile gives them
        profile = trace_profile(traces[0], kept.pop())
    return TraceAnalysis(
        source=label or (shown_path(_path(source)) if isinstance(source, (str, bytes, os.PathLike)) else "traces"),
        ranks=ranks, straggler=straggler, straggler_phase=phase, straggler_reason=reason,
        findings=findings + (profile.findings if profile else []), profile=profile, lanes=lanes, lane_step=lane_step,
        world_size=world_size or (len(traces) if len(traces) > 1 else None), backend=backend, notes=notes,
        events=sum(t.events for t in traces), bytes_read=sum(t.bytes_read for t in traces),
        analysis_s=time.perf_counter() - started)


def read_rank(path: str) -> tuple[RankTrace, EventTable]:
    """One trace file read into columns, and the RankTrace made from them with what its top level says of its rank."""
    columns, reader = read_table(path)
    trace = rank_trace(columns, path)
    trace.bytes_read, trace.meta = reader.bytes_read, reader.meta
    info = reader.meta.get("distributedInfo")
    if isinstance(info, dict):
        trace.rank = _meta_int(path, info, "rank", 0)
        trace.world_size = _meta_int(path, info, "world_size", 1)
        backend = info.get("backend")
        trace.backend = shown_path(backend[:64]) if isinstance(backend, str) else None
    if trace.rank is None:
        match = _RANK_IN_NAME.search(os.path.basename(path))
        trace.rank = int(match.group(1)) if match else None
    if trace.span is None:
        raise TraceFileError(path, "has no timed events (\"ph\": \"X\"): nothing to analyse")
    if trace.cut_strings:
        trace.read_notes.append(f"{trace.cut_strings:,} string(s) longer than {TEXT_CHARS:,} characters (names, "
                                "categories) were cut to their start, marked '…[cut: N characters]'")
    if reader.oversized:
        trace.read_notes.append(f"{reader.oversized:,} event(s) longer than {EVENT_CHARS:,} characters were "
                                "left out (not read)")
    if reader.skipped_meta:
        trace.read_notes.append(f"top-level value(s) too long to keep were left out: "
                                f"{', '.join(reader.skipped_meta[:3])}{' ...' if len(reader.skipped_meta) > 3 else ''}")
    return trace, columns


def _meta_int(path: str, info: dict, key: str, low: int) -> int | None:
    """distributedInfo's rank or world size: absent, or an integer in range."""
    value = info.get(key)
    if value is None:
        return None
    if type(value) is not int or not low <= value < MAX_META_INT:
        raise TraceFileError(path, f'distributedInfo["{key}"] is {kind(value) if type(value) is not int else value}, '
                                   f"not an integer from {low} to {MAX_META_INT - 1:,}")
    return value


def _number_ranks(traces: list[RankTrace]) -> list[str]:
    """Ranks from the traces; numbered in file order where none says; one trace per rank."""
    if all(t.rank is None for t in traces):
        for number, trace in enumerate(traces):
            trace.rank = number
        return ([] if len(traces) == 1 else
                ["no rank in the traces (distributedInfo) or their names: numbered in file name order"])
    unnamed = [os.path.basename(t.path) for t in traces if t.rank is None]
    if unnamed:
        raise TraceFileError(unnamed[0], "says no rank, while other traces do: pass one job's traces, "
                                         "each with distributedInfo or 'rank<N>' in its name")
    seen: dict[int, str] = {}
    for trace in traces:
        if trace.rank in seen:
            raise TraceFileError(os.path.basename(trace.path),
                                 f"is a second trace of rank {trace.rank} (with {os.path.basename(seen[trace.rank])}): "
                                 "pass one trace per rank (a directory per run, or a list of files)")
        seen[trace.rank] = trace.path
    return []


def _one_world_size(traces: list[RankTrace]) -> int | None:
    sizes = {t.world_size for t in traces if t.world_size is not None}
    if len(sizes) > 1:
        described = "; ".join(f"{size} ({', '.join(os.path.basename(t.path) for t in traces if t.world_size == size)})"
                              for size in sorted(sizes))
        raise TraceFileError("analyze", f"was given traces of jobs of different sizes: world sizes {described}")
    return sizes.pop() if sizes else None
