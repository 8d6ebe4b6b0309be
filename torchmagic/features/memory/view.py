"""Text and HTML views of a :class:`MemoryResult`: the headline, what a cell or ``--free`` did, each
device and the host, then the variables holding the most memory."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from ...core.render.base import report_html
from ...core.render.format import fmt_bytes, fmt_s
from ...core.render.table import Column, Table

if TYPE_CHECKING:  # the result imports this view when it is shown, not the other way round
    from .result import DeviceMemory, MemoryResult


def headline(r: MemoryResult) -> str:
    if r.cell is not None:
        c = r.cell
        peak = fmt_bytes(c.peak_bytes) if c.peak_bytes is not None else "not measured"
        return f"%%gpumem: the cell peaked at {peak} and kept {fmt_bytes(c.net_bytes)} on {c.device}"
    if r.freed is not None:
        got = ", ".join(f"{fmt_bytes(n)} on {d}" for d, n in r.freed.reclaimed.items()) or "nothing measurable"
        return f"{' '.join(['%gpumem --free', *r.freed.names])}: reclaimed {got}"
    if not r.devices:
        return "%gpumem: no GPU found; host memory and CPU tensors below"
    if len(r.devices) == 1:
        return f"%gpumem: {_device_line(r.devices[0])}"
    return "%gpumem: " + "; ".join(f"{d.label} {_device_line(d)}" for d in r.devices)


def device_lines(r: MemoryResult) -> list[str]:
    lines = []
    for d in r.devices:
        lines.append(f"{d.label} {d.name}: {_device_line(d)}")
        lines += [f"  {line}" for line in _device_details(d)]
    host = r.host
    rss = fmt_bytes(host.get("rss_bytes")) if host.get("rss_bytes") is not None else "unknown"
    lines.append(f"host: this process {rss} resident; {fmt_bytes(host.get('available_bytes'))} of "
                 f"{fmt_bytes(host.get('total_bytes'))} available; CPU tensors held by variables "
                 f"{fmt_bytes(host.get('variables_bytes', 0))}")
    return lines


def pinned_lines(r: MemoryResult) -> list[str]:
    what = {"history": "IPython's output history (Out, _, __, _N)",
            "traceback": "the last error's traceback (kept for %debug and %tb)"}
    lines = []
    for key, per_device in r.pinned.items():
        total = ", ".join(f"{fmt_bytes(n)} on {d}" for d, n in per_device.items() if n)
        graphs = r.pinned_graphs.get(key, 0)
        if not total:
            continue
        graph = (f", plus the autograd graph{'s' if graphs > 1 else ''} of {graphs} tensor{'s' if graphs > 1 else ''} "
                 "(not counted, often far more)") if graphs else ""
        lines.append(f"{what.get(key, key)} holds {total} that no variable holds{graph}: %gpumem --free drops it")
    return lines


def _variables_table(r: MemoryResult) -> Table:
    return Table([
        Column("variable", lambda v: v.name, "left"),
        Column("device", lambda v: v.device, "left"),
        Column("memory", lambda v: fmt_bytes(v.bytes)),
        Column("tensors", lambda v: f"{v.tensors:,}"),
        Column("type", lambda v: v.type + (" + autograd graph" if v.graphs else ""), "left"),
        Column("shared", lambda v: (fmt_bytes(v.shared_bytes) if v.shared_bytes else "")
               + (" (walk stopped at a limit)" if v.partial else ""), "left"),
    ], r.variables, limit=r.top, noun="variables", hint=" (-o r: r.variables has them all)")


def _cell_lines(r: MemoryResult) -> list[str]:
    if r.cell is None:
        return []
    c = r.cell
    lines = [f"ran in {fmt_s(c.seconds)}; peak and net are torch's allocations on {c.device}, above the "
             "cell's start (read from the profiler's memory events: no peak counter was reset)"]
    if c.note:
        lines.append(c.note)
    if c.new_variables:
        lines.append("held by: " + ", ".join(f"{v.name} {fmt_bytes(v.bytes)}" for v in c.new_variables[:8]))
    unheld = c.net_bytes - sum(v.bytes for v in c.new_variables)
    if unheld > max(0.05 * c.net_bytes, 2**20):
        with_graph = [v.name for v in c.new_variables if v.graphs]
        lines.append(f"{fmt_bytes(unheld)} of the net is held by no variable directly: usually the autograd "
                     "graph of an output computed with gradients on (the activations a backward would need"
                     + (f"; here {', '.join(with_graph)} {'has' if len(with_graph) == 1 else 'have'} one"
                        if with_graph else "")
                     + "), or objects the walk does not enter")
    return lines


def _freed_lines(r: MemoryResult) -> list[str]:
    if r.freed is None:
        return []
    f = r.freed
    lines = [f"deleted: {', '.join(f.names)}"] if f.names else []
    if f.dropped:
        lines.append(f"{'also dropped' if f.names else 'dropped'}: {', '.join(f.dropped)}")
    elif not f.names:
        lines.append("dropped nothing: no memory was held by IPython alone")
    if f.still_alive_tensors:
        lines.append(f"{f.still_alive_tensors} of their tensors ({fmt_bytes(f.still_alive_bytes)}) are still "
                     "held elsewhere: another variable, a closure, an object's attribute or a running frame")
    return lines


def _device_line(d: DeviceMemory) -> str:
    parts = []
    if d.used_bytes is not None and d.total_bytes:
        parts.append(f"{fmt_bytes(d.used_bytes)} of {fmt_bytes(d.total_bytes)} used (all processes)")
    if not d.in_use:
        parts.append("not used by this process")
    elif d.allocated_bytes is not None:
        parts.append(f"torch {fmt_bytes(d.allocated_bytes)} allocated, {fmt_bytes(d.reserved_bytes)} reserved")
    if d.utilization_pct is not None:
        parts.append(f"{d.utilization_pct:.0f}% busy")
    return ", ".join(parts) or "no readings"


def _device_details(d: DeviceMemory) -> list[str]:
    lines = []
    if d.peak_bytes is not None and d.in_use:
        lines.append(f"peak allocated {fmt_bytes(d.peak_bytes)} (reserved {fmt_bytes(d.peak_reserved_bytes)}) "
                     "since the last reset (%gpumem --reset)")
    if d.cached_bytes:
        split = (f", {fmt_bytes(d.inactive_split_bytes)} of it in split blocks (fragmentation)"
                 if d.inactive_split_bytes else "")
        lines.append(f"cached by torch (reserved − allocated, often called fragmentation): {fmt_bytes(d.cached_bytes)}"
                     f"{split}; torch reuses it, other processes cannot (torch.cuda.empty_cache() hands it back)")
    if d.num_ooms or d.num_alloc_retries:
        lines.append(f"{d.num_ooms} out-of-memory errors and {d.num_alloc_retries} allocator retries "
                     "(cache flushed to satisfy an allocation) so far")
    env = []
    if d.temperature_c is not None:
        env.append(f"{d.temperature_c:.0f} °C")
    if d.power_w is not None:
        env.append(f"{d.power_w:.0f} W")
    if env:
        lines.append(" · ".join(env))
    if d.allocated_bytes:
        lines.append(f"held by notebook variables: {fmt_bytes(d.variables_bytes)} of the "
                     f"{fmt_bytes(d.allocated_bytes)} allocated")
    return lines + d.notes


# -- text ------------------------------------------------------------------------------
def text(r: MemoryResult) -> str:
    lines = [headline(r), *_cell_lines(r), *_freed_lines(r), *device_lines(r),
             *pinned_lines(r), *r.notes]
    if r.variables:
        lines += ["", "Largest variables by tensor memory (storages counted once):", _variables_table(r).to_text()]
    return "\n".join(lines)


# -- HTML ------------------------------------------------------------------------------
def _body_html(r: MemoryResult) -> str:
    notes = [*_cell_lines(r), *_freed_lines(r), *device_lines(r), *pinned_lines(r), *r.notes]
    out = f'<div class="tm-headline">{escape(headline(r))}</div>'
    out += "".join(f'<div class="tm-note">{escape(line)}</div>' for line in notes)
    if r.variables:
        out += ("<h4>Largest variables by tensor memory (storages counted once)</h4>"
                + _variables_table(r).to_html())
    return out


def html(r: MemoryResult) -> str:
    return report_html(_body_html(r))
