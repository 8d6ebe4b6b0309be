"""Draw docs/images/report.png, the README's picture of a report: the README's example, profiled for real.

    python docs/screenshot.py [--out docs/images/report.png] [--height 900]

Runs the README's `%%torchprofile` cell through `torchmagic.profile_code` (what the magic runs), renders
the report's HTML (`to_html()`, what a saved notebook or GitHub shows) in the system's Chromium through
Playwright, as tests/test_browser.py does, and writes the top of the page as a PNG reduced to 256 colours
(Pillow comes with matplotlib) to stay small. Needs Chromium on PATH (Debian/Ubuntu: apt install chromium).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.lab import chromium_page, find_chromium  # noqa: E402  (the browser the tests drive, launched alike)

# The README's example, line for line: its set-up cell, then the profiled cell.
SETUP = """\
import torch
from torch import nn
model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(128, 512), torch.randint(0, 10, (128,))) for _ in range(10)]
"""
CELL = """\
for x, y in data:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    print_every_batch = loss.item()
"""

PAGE = """<!doctype html><html><head><meta charset="utf-8">
<style>body {{ margin: 0; padding: 16px 20px; background: #fff; font-family: system-ui, sans-serif; }}</style>
</head><body><div id="cell">{html}</div></body></html>"""


def chromium() -> str:
    found = find_chromium()
    if found is None:
        sys.exit("docs/screenshot.py: no Chromium on PATH (Debian/Ubuntu: apt install chromium)")
    return found


def report_html() -> str:
    import torchmagic

    namespace: dict = {}
    exec(SETUP, namespace)  # noqa: S102 - our own example code, not input
    result = torchmagic.profile_code(CELL, namespace, warmup=1, steps=3, top=8, label="%%torchprofile")
    return result.to_html()


def screenshot(html: str, executable: str, width: int, height: int) -> bytes:
    with chromium_page(executable, width, height) as (page, _):
        page.set_content(PAGE.format(html=html), wait_until="load")
        shown = page.locator("#cell").bounding_box()
        clip_height = min(height, int(shown["y"] + shown["height"]) + 16) if shown else height
        return page.screenshot(clip={"x": 0, "y": 0, "width": width, "height": clip_height})


def small_png(png: bytes) -> bytes:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "images" / "report.png")
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--height", type=int, default=900, help="the most of the page kept, in pixels")
    args = parser.parse_args(argv)
    png = small_png(screenshot(report_html(), chromium(), args.width, args.height))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(png)
    print(f"wrote {args.out} ({len(png) / 1024:.0f} KB)")
    return args.out


if __name__ == "__main__":
    main()
