"""The pages of `scratch-models features`: an index of every feature and one page per feature, offline.

    out/index.html                 every feature: frequency, max, mean, the tokens it fires most on, the tokens it
                                   raises most; sorted by a click on a column, searched by number or token
    out/features/{i}.html          feature i: its numbers, histogram, logit effects, top examples and quantile bands
    out/assets/features.{js,css}   shared by them (package data in static/, copied once)

The markup, style and script are package data (static/features_index.html, feature.html, features.js,
features.css); this module fills in each page's data as JSON. The pages load only each other and their assets, by
relative paths, so the directory opens offline wherever it is copied.
"""

import html
import re
from pathlib import Path

from .display import page_file, script_json, write_atomically

PAGE_ROWS = 100  # rows of the index shown at first, and added by "show more"
INDEX_TOKENS = 6  # distinct tokens of the top examples (and of the logit effects) in an index row


def index_html(report, rows: list[list]) -> str:
    """The index: `rows` are index_row(...) of every feature."""
    data = {"columns": ["feature", "fired", "frequency", "max", "mean", "tokens", "raises"], "rows": rows,
            "page": PAGE_ROWS}
    return _filled("features_index.html", title(report), subtitle(report), data)


def feature_html(report, row: dict) -> str:
    """The page of the feature whose dataset row is `row` (FeatureReport.row)."""
    feature, count = row["feature"], report.sae.cfg.d_sae
    stats, before = report.stats, report.stats.before
    edges = report.edges
    start, counts = row["hist_start"], row["hist_counts"]
    data = {"feature": feature, "tokens": stats.tokens, "fired": row["fired"], "frequency": row["frequency"],
            "max": row["max"], "mean": row["mean"], "quantiles": [[q, v] for q, v in zip(report.quantile_levels,
                                                                                         row["quantiles"])],
            "hist": {"edges": edges[start:start + len(counts) + 1], "counts": counts},
            "logits": {"how": report.effects_reason, "top": _pairs(report, row["logit_top_ids"],
                                                                   row["logit_top_values"]),
                       "bottom": _pairs(report, row["logit_bottom_ids"], row["logit_bottom_values"])},
            "before": before, "top": _examples(report, row, "top"),
            "bands": _bands(report, row), "previous": feature - 1 if feature else None,
            "next": feature + 1 if feature + 1 < count else None}
    return _filled("feature.html", f"feature {feature}", subtitle(report), data)


def index_row(report, row: dict) -> list:
    """A feature's row of the index: number, fired, frequency, max, mean, the distinct tokens at its top examples'
    peaks, the tokens it raises most."""
    peaks = [ids[report.stats.before] for ids in row["top_ids"]]
    tokens = " · ".join(dict.fromkeys(report.strings(peaks)))
    raises = " · ".join(report.strings(row["logit_top_ids"][:INDEX_TOKENS]))
    return [row["feature"], row["fired"], row["frequency"], row["max"] if row["fired"] else 0.0, row["mean"],
            _cut(tokens), raises]


def write_assets(out: Path) -> None:
    (out / "assets").mkdir(parents=True, exist_ok=True)
    (out / "features").mkdir(exist_ok=True)
    for name in ("features.js", "features.css"):
        write_atomically(out / "assets" / name, page_file(name).encode())


def write_feature(out: Path, report, row: dict) -> None:
    write_atomically(out / "features" / f"{row['feature']}.html", feature_html(report, row).encode())


def write_index(out: Path, report, rows: list[list]) -> Path:
    return write_atomically(out / "index.html", index_html(report, rows).encode())


def title(report) -> str:
    return f"features of {report.sae.cfg.source or 'a dictionary'}"


def subtitle(report) -> str:
    cfg = report.sae.cfg
    return (f"{cfg.architecture} dictionary, {cfg.d_sae} features of {cfg.d_in}, reading {report.site.given}"
            + (f" (our {report.site.name})" if report.site.given != report.site.name else "")
            + f" of {report.source or 'the model'}; {report.stats.tokens} tokens")


def _pairs(report, ids: list[int], values: list[float]) -> list:
    return [[text, value] for text, value in zip(report.strings(ids), values)]


def _examples(report, row: dict, prefix: str, chosen=None) -> list[dict]:
    indices = range(len(row[f"{prefix}_value"])) if chosen is None else chosen
    found = []
    for i in indices:
        ids = row[f"{prefix}_ids"][i]
        found.append({"value": row[f"{prefix}_value"][i], "document": row[f"{prefix}_document"][i],
                      "position": row[f"{prefix}_position"][i],
                      "tokens": [text if token >= 0 else None for text, token in zip(report.strings(ids), ids)],
                      "acts": row[f"{prefix}_acts"][i]})
    return found


BAND_NAMES = {3: "the top quarter of its firings", 2: "the second quarter", 1: "the third quarter",
              0: "the lowest quarter"}


def _bands(report, row: dict) -> list[dict]:
    bands = []
    for band in sorted(set(row["sample_band"]), reverse=True):
        chosen = [i for i, b in enumerate(row["sample_band"]) if b == band]
        bands.append({"band": band, "label": BAND_NAMES.get(band, f"band {band}"),
                      "examples": _examples(report, row, "sample", chosen)})
    return bands


def _cut(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _filled(shell: str, title_text: str, subtitle_text: str, data) -> str:
    parts = {"TITLE": html.escape(title_text), "SUBTITLE": html.escape(subtitle_text), "DATA": script_json(data)}
    return re.sub(r"__(TITLE|SUBTITLE|DATA)__", lambda m: parts[m.group(1)], page_file(shell))
