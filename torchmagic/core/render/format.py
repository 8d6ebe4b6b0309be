"""Human units for times, sizes and shares, shared by every renderer, and names made safe to show."""

from __future__ import annotations

import re

# What a terminal or a page acts on rather than shows: C0 and C1 controls (ESC starts an ANSI sequence,
# CR overwrites a line), DEL, the bidirectional overrides and isolates (they reorder what is read), and
# the Unicode line and paragraph separators.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def visible(text: str, keep: str = "") -> str:
    """``text`` with each control character (but those in ``keep``) written out as its escape, \\x1b or
    \\u202e, as repr() writes it: a name from the user's code can colour, move or hide nothing."""
    return _CONTROLS.sub(lambda m: m.group() if m.group() in keep else ascii(m.group())[1:-1], text)


def fmt_us(us: float | None) -> str:
    """A duration given in microseconds, in the unit that keeps 3 significant digits."""
    if us is None:
        return "–"
    if us < 1:
        return f"{us * 1e3:.0f} ns"
    if us < 1e3:
        return f"{us:.3g} µs" if us >= 100 else f"{us:.2f} µs".replace(".00 µs", " µs")
    if us < 1e6:
        return f"{us / 1e3:.3g} ms" if us >= 1e5 else f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


def fmt_s(seconds: float | None) -> str:
    return "–" if seconds is None else fmt_us(seconds * 1e6)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_pct(share: float | None) -> str:
    if share is None:
        return "–"
    pct = share * 100
    return f"{pct:.1f}%" if pct < 10 else f"{pct:.0f}%"


def fmt_count(n: float) -> str:
    return f"{n:,.0f}"


def fmt_flops(flops: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.3g} {unit}"
    return f"{flops:.0f} FLOP"


def bar(share: float, width: int = 20) -> str:
    """A text bar for a share in [0, 1], with eighth-block resolution."""
    share = min(max(share, 0.0), 1.0)
    eighths = round(share * width * 8)
    full, rest = divmod(eighths, 8)
    return "█" * full + ("" if rest == 0 else "▏▎▍▌▋▊▉"[rest - 1])
