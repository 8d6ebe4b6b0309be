"""A report's tabs as the tests read them: (title, page HTML) from core/render/base.tabs_html."""

from __future__ import annotations

import html
import re


def tabs(report_html: str) -> list[tuple[str, str]]:
    """Each tab's title and the HTML from its page's start to the next tab (the last runs to the end)."""
    group = re.search(r'<input type="radio" name="(tm-tabs-[0-9a-f]+)"', report_html)
    if group is None:
        return []
    found = []
    for part in report_html.split(f'<input type="radio" name="{group.group(1)}"')[1:]:
        title = re.search(r'<label for="[^"]+">(.*?)</label>', part).group(1)
        found.append((html.unescape(title), part.split('<div class="tm-page">', 1)[1]))
    return found


def titles(report_html: str) -> list[str]:
    return [title for title, _ in tabs(report_html)]
