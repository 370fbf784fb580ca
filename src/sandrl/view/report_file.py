"""``sandrl view RUN_DIR --out report.html``: the viewer's page as one self-contained file.

The file holds the page's script and style inline, the run's overview and a bounded sample of its
episodes (whole groups, spread over the run, so two samples of a group can be read side by side)
as JSON in a data block the browser never runs. Its policy (a ``<meta>`` Content-Security-Policy)
lets run only the inline script and style whose hashes it names: nothing an episode holds can
run, and the page loads nothing from anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from sandrl.view.app import asset
from sandrl.view.run_view import RunView
from sandrl.view.summary import listing_row

MAX_EPISODES = 200
"""Episodes embedded by default (``--max-episodes``): the file stays a few MB."""
REPORT_TOKENS = 1500
"""Tokens shown per embedded episode in the token view (the live viewer shows more)."""


def write_report(view: RunView, out: Path, *, max_episodes: int = MAX_EPISODES) -> dict[str, Any]:
    """Write the report of ``view``'s run to ``out``; return what it holds (episodes, bytes)."""
    summary = view.summary()
    numbers = sample_groups(view, max_episodes)
    steps_of = view.run.episode_steps()
    rows = [listing_row(view.run, n, steps_of) for n in numbers]
    episodes = {str(n): view.episode(n, tokens_shown=REPORT_TOKENS) for n in numbers}
    data = {"summary": summary, "rows": rows, "episodes": episodes}
    html = render(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(out)
    return {"path": str(out), "episodes": len(numbers), "of": len(view.run.episodes), "bytes": len(html.encode())}


def sample_groups(view: RunView, limit: int) -> list[int]:
    """Up to ``limit`` episode numbers: whole groups, picked evenly over the run's groups."""
    index = view.run.episodes
    groups: dict[str, list[int]] = {}
    for n, group in enumerate(index.group_id):
        groups.setdefault(group, []).append(n)
    if limit <= 0 or not groups:
        return []
    order = list(groups)
    size = max(1, round(len(index) / len(order)))
    wanted = max(1, min(len(order), limit // size))
    picked: list[int] = []
    for k in range(wanted):
        picked.extend(groups[order[k * len(order) // wanted]])
    return sorted(picked[:limit])


def render(data: dict[str, Any]) -> str:
    """The page with its script, style and ``data`` inline, under a policy that names their hashes."""
    page = asset("viewer.html")
    script = asset("viewer.js")
    style = asset("viewer.css")
    policy = (
        f"default-src 'none'; script-src '{_hash(script)}'; style-src '{_hash(style)}'; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )
    page = _swap(page, "style", f"<style>{style}</style>")
    page = _swap(page, "script", f"<script>{script}</script>")
    page = page.replace("<!--sandrl:policy-->", f'<meta http-equiv="Content-Security-Policy" content="{policy}">', 1)
    page = page.replace(
        "<!--sandrl:data-->", f'<script type="application/json" id="sandrl-data">{json_for_html(data)}</script>', 1
    )
    return page


def json_for_html(data: Any) -> str:
    """``data`` as JSON that cannot end the ``<script>`` block it sits in, whatever its strings hold."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str)
    for raw in ("<", ">", "&", "\u2028", "\u2029"):
        text = text.replace(raw, f"\\u{ord(raw):04x}")
    return text


def _swap(page: str, name: str, inline: str) -> str:
    start, end = f"<!--sandrl:{name}-->", f"<!--/sandrl:{name}-->"
    a, b = page.index(start), page.index(end) + len(end)
    return page[:a] + inline + page[b:]


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
