"""Matplotlib drawings, imported only when a picture is asked for (matplotlib costs ~0.3 s to import).

What each feature draws lives in its view; here is what they share: a figure on the Agg canvas and
its PNG bytes."""

from __future__ import annotations

import io


def new_figure(width_in: float, height_in: float, dpi: int = 100):
    """A matplotlib Figure on the Agg canvas (no pyplot, no GUI backend); the first call imports matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def figure_png(fig) -> bytes:
    """The figure as PNG bytes, cropped to what was drawn."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()
