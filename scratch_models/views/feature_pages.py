"""The pages of `scratch-models features`: an index of every feature and one page per feature, offline.

    out/index.html                 every feature: frequency, max, mean, the tokens it fires most on, the tokens it
                                   raises most; sorted by a click on a column, searched by number or token
    out/features/{i}.html          feature i: its numbers, histogram, logit effects, top examples and quantile bands
    out/assets/features.{js,css}   shared by them (package data in static/, copied once)

The markup, style and script are package data (static/features_index.html, feature.html, features.js,
features.css); this module fills in each page's data as JSON. A page's examples travel packed: the token strings
it shows once each (`strings`), and per example set the windows' indices into them (int32, -1 outside the
sequence) and activations (float32, NaN where a token has none) as base64, row-major, little-endian, which the
script unpacks. The pages load only each other and their assets, by relative paths, so the directory opens
offline wherever it is copied.
"""

import base64
import html
import math
import re
from pathlib import Path

import numpy as np
import torch

from .display import page_file, script_json, write_atomically

PAGE_ROWS = 100  # rows of the index shown at first, and added by "show more"
INDEX_TOKENS = 6  # tokens it raises most, in an index row
BAND_NAMES = {3: "the top quarter of its firings", 2: "the second quarter", 1: "the third quarter",
              0: "the lowest quarter"}


def feature_data(report, feature: int, chunk: dict, i: int) -> dict:
    """What feature `feature`'s page shows: row `i` of `chunk` (FeatureReport.chunks) and the report's counts."""
    stats = report.stats
    start, end = int(report.hist_start[feature]), int(report.hist_end[feature])
    examples = {name: {field: chunk[name][field][i][chunk[name]["filled"][i]] for field in chunk[name]
                       if field != "filled"} for name in ("top", "sample")}
    ids = torch.cat([examples[name]["ids"].flatten() for name in examples])
    shown = torch.unique(ids[ids >= 0])
    data = {"feature": feature, "tokens": stats.tokens, "fired": int(stats.fired[feature]),
            "frequency": float(report.frequency[feature]), "max": float(report.max[feature]),
            "mean": float(report.mean[feature]),
            "quantiles": [[q, _number(v)] for q, v in zip(report.quantile_levels, report.quantiles[feature].tolist())],
            "hist": {"edges": [_number(e) for e in report.edges[start:end + 1]],
                     "counts": stats.hist[feature, start:end].tolist()},
            "logits": _logits(report, feature), "before": stats.before, "width": stats.before + 1 + stats.after,
            "strings": report.strings(shown), "previous": feature - 1 if feature else None,
            "next": feature + 1 if feature + 1 < report.sae.cfg.d_sae else None}
    for name, found in examples.items():
        where = torch.searchsorted(shown, found["ids"].clamp(min=0).long()).int()
        data[name] = {"value": found["value"].tolist(), "document": found["document"].tolist(),
                      "position": found["position"].tolist(),
                      "tokens": _packed(torch.where(found["ids"] >= 0, where, -1), "<i4"),
                      "acts": _packed(found["acts"], "<f4")}
    data["sample"]["band"] = examples["sample"]["band"].tolist()
    data["bands"] = {str(band): name for band, name in BAND_NAMES.items()}
    return data


def index_row(report, page: dict) -> list:
    """A feature's row of the index: number, fired, frequency, max, mean, the distinct tokens at its top examples'
    peaks, the tokens it raises most."""
    width, before = page["width"], page["before"]
    indices = np.frombuffer(base64.b64decode(page["top"]["tokens"]), dtype="<i4").reshape(-1, width)[:, before]
    peaks = " · ".join(dict.fromkeys(page["strings"][i] for i in indices if i >= 0))
    raises = " · ".join(token for token, _ in page["logits"]["top"][:INDEX_TOKENS])
    return [page["feature"], page["fired"], page["frequency"], page["max"], page["mean"], _cut(peaks), raises]


def index_html(report, rows: list[list]) -> str:
    """The index: `rows` are index_row(...) of every feature."""
    data = {"columns": ["feature", "fired", "frequency", "max", "mean", "tokens", "raises"], "rows": rows,
            "page": PAGE_ROWS}
    return _filled("features_index.html", title(report), subtitle(report), data)


def feature_html(report, page: dict) -> str:
    return _filled("feature.html", f"feature {page['feature']}", subtitle(report), page)


def write_assets(out: Path) -> None:
    (out / "assets").mkdir(parents=True, exist_ok=True)
    (out / "features").mkdir(exist_ok=True)
    for name in ("features.js", "features.css"):
        write_atomically(out / "assets" / name, page_file(name).encode())


def write_feature(out: Path, report, page: dict) -> None:
    write_atomically(out / "features" / f"{page['feature']}.html", feature_html(report, page).encode())


def write_index(out: Path, report, rows: list[list]) -> Path:
    return write_atomically(out / "index.html", index_html(report, rows).encode())


def title(report) -> str:
    return f"features of {report.sae.cfg.source or 'a dictionary'}"


def subtitle(report) -> str:
    cfg = report.sae.cfg
    return (f"{cfg.architecture} dictionary, {cfg.d_sae} features of {cfg.d_in}, reading {report.site.given}"
            + (f" (our {report.site.name})" if report.site.given != report.site.name else "")
            + f" of {report.source or 'the model'}; {report.stats.tokens} tokens")


def _logits(report, feature: int) -> dict:
    if not report.effects:
        return {"how": report.effects_reason, "top": [], "bottom": []}
    top_ids, top_values, bottom_ids, bottom_values = (values[feature] for values in report.effects)
    return {"how": report.effects_reason,
            "top": [[text, value] for text, value in zip(report.strings(top_ids), top_values.tolist())],
            "bottom": [[text, value] for text, value in zip(report.strings(bottom_ids), bottom_values.tolist())]}


def _packed(tensor: torch.Tensor, dtype: str) -> str:
    """The values, row-major, as `dtype` (little-endian int32 "<i4" or float32 "<f4"), in base64."""
    return base64.b64encode(tensor.contiguous().numpy().astype(dtype).tobytes()).decode("ascii")


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _cut(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _filled(shell: str, title_text: str, subtitle_text: str, data) -> str:
    parts = {"TITLE": html.escape(title_text), "SUBTITLE": html.escape(subtitle_text),
             "DATA": script_json(data, finite=True)}  # feature_data writes None for every non-finite number
    return re.sub(r"__(TITLE|SUBTITLE|DATA)__", lambda m: parts[m.group(1)], page_file(shell))
