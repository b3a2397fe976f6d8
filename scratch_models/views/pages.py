"""Self-contained HTML pages of head scores and patching sweeps: markup, style and script are package data files
(scratch_models/views/static/: the shell analysis.html and analysis.css, a body and a script per page, and the heatmap
script and style they share with the attention page), filled in here with the numbers as JSON. Nothing is fetched
when the page opens.

    heads_html(report, title=...)                  the heads page (a tab per measure, a ranked table)
    patching_html(result, tokens, title=...)       the patching page (a tab per sweep)
"""

import html
import re
from typing import Sequence

from ..analysis.heads import HeadReport
from ..analysis.patching import PatchingResult
from .display import page_file, script_json

def heads_html(report: HeadReport, *, title: str = "attention heads") -> str:
    subtitle = f"{report.num_layers} layers × {report.num_heads} heads · target: {report.target}"
    return _page("heads_view.html", ("analysis_heatmap.js", "heads_view.js", "heads.js"), title, subtitle,
                 report.to_json())


def patching_html(result: PatchingResult, tokens: Sequence[str], *, title: str = "activation patching") -> str:
    subtitle = (f"{len(tokens)} positions · metric: clean {result.clean_metric:.4g}, corrupted "
                f"{result.corrupted_metric:.4g}")
    return _page("patching.html", ("analysis_heatmap.js", "patching.js"), title, subtitle, result.to_json(tokens))


def _page(body: str, scripts: Sequence[str], title: str, subtitle: str, data: dict) -> str:
    parts = {"TITLE": html.escape(title), "SUBTITLE": html.escape(subtitle),
             "STYLE": page_file("analysis.css") + page_file("analysis_heatmap.css"), "BODY": page_file(body),
             "SCRIPT": "\n".join(page_file(name) for name in scripts), "DATA": script_json(data)}
    # one pass, so a title holding "__DATA__" is not filled in a second time
    return re.sub(r"__(TITLE|SUBTITLE|STYLE|BODY|SCRIPT|DATA)__", lambda m: parts[m.group(1)],
                  page_file("analysis.html"))
