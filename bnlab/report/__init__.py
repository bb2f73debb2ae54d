"""The report: ``runs/report/index.html`` and ``index.md`` built from the store alone.

For each stored entry: its figures, our numbers beside the paper's, the verdict on the claim,
the exact run configs and the environment. Nothing is trained here; figures are redrawn from
stored metrics and computation results.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from bnlab.experiments.base import PAPERS
from bnlab.experiments.runner import iter_outcomes
from bnlab.formatting import fmt


def write_report(runs_dir: str | Path = "runs", out_dir: str | Path | None = None) -> Path:
    """(Re)write ``index.html`` and ``index.md`` in ``out_dir`` (default ``<runs_dir>/report``);
    returns the HTML path. The runs dir must hold a store (``FileNotFoundError`` otherwise: a
    mistyped folder never yields an empty report); a read-only one is read without a write, and
    then needs an ``out_dir`` elsewhere (``PermissionError`` naming it otherwise)."""
    runs_dir = Path(runs_dir)
    if not (runs_dir / "bnlab.db").is_file():
        raise FileNotFoundError(f"no run store at {runs_dir / 'bnlab.db'}; pass the --runs-dir "
                                "that `bnlab reproduce` or `bnlab train` wrote to")
    out = Path(out_dir) if out_dir is not None else runs_dir / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PermissionError(f"cannot write the report to {out} ({err.strerror}); the runs dir is "
                              "read-only? pass --out DIR (bnlab report --out DIR)") from None
    if not os.access(out, os.W_OK):
        raise PermissionError(f"cannot write the report to {out}; pass --out DIR (bnlab report "
                              "--out DIR)")
    sections = []
    for experiment_id, preset, ctx, outcome in iter_outcomes(runs_dir, out):
        sections.append(_section(experiment_id, preset, ctx, outcome, out))
    md = ["# bnlab report", "",
          f"{len(sections)} entries. Generated from `{runs_dir}` (no training was run to draw "
          "this).", ""]
    md += [s["md"] for s in sections]
    (out / "index.md").write_text("\n".join(md))
    body = "\n".join(s["html"] for s in sections)
    toc = "".join(f'<li><a href="#{s["anchor"]}">{html.escape(s["title"])}</a> — '
                  f'<b>{s["verdict"]}</b></li>'
                  for s in sections)
    page = _PAGE.format(count=len(sections), toc=toc, body=body,
                        runs_dir=html.escape(str(runs_dir)))
    (out / "index.html").write_text(page)
    return out / "index.html"


def _section(experiment_id: str, preset: str, ctx, outcome, out: Path) -> dict:
    exp = ctx.experiment
    anchor = f"{experiment_id}-{preset}"
    paper = PAPERS[exp.paper].split(",")[0]
    tiny = ", tiny" if ctx.tiny else ""
    title = f"{experiment_id} [{preset}{tiny}] — {paper} {exp.target}: {exp.title}"
    if isinstance(outcome, Exception):
        failure = f"analysis failed: {type(outcome).__name__}: {outcome}"
        verdict, summary, figures, table = "error", failure, [], []
    else:
        verdict, summary = outcome.verdict, outcome.summary
        figures, table = outcome.figures, outcome.table
    rel = [os.path.relpath(f, out) for f in figures]
    status = {}
    for r in ctx.runs:
        status[r.status] = status.get(r.status, 0) + 1
    configs = [{"label": r.label, "id": r.id, "status": r.status,
                "config": _short_config(r.record.get("config") or {})} for r in ctx.runs]
    env = next((r.record.get("env") for r in ctx.runs if r.record.get("env")), {})
    cols = _columns(table)
    # stated in the entry before the runs, for the smoke preset it describes
    decidable = exp.resolution.text() if exp.resolution is not None and preset == "smoke" else None
    md = [f"## {title}", "", f"**Claim.** {exp.claim}", ""]
    if decidable:
        md += [f"**What the smoke can decide.** {decidable}", ""]
    md += [f"**Verdict: {verdict}.** {summary}", ""]
    md += [f"[![{Path(f).stem}]({f})]({f})" for f in rel] + [""]  # a click: full size
    if table:
        md += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        md += ["| " + " | ".join(fmt(row.get(c), 4) for c in cols) + " |" for row in table]
        md.append("")
    preset_note = exp.smoke_changes if preset == "smoke" else "the paper configuration."
    runs_note = ", ".join(f"{v} {k}" for k, v in status.items()) or "none"
    md += [f"*Preset {preset}:* {preset_note}", f"Runs: {len(ctx.runs)} ({runs_note}).", ""]
    h = [f'<section id="{anchor}"><h2>{html.escape(title)}</h2>',
         f"<p><b>Claim.</b> {html.escape(exp.claim)}</p>",
         *([f"<p><b>What the smoke can decide.</b> {html.escape(decidable)}</p>"]
           if decidable else []),
         f'<p class="verdict {verdict.replace(" ", "-")}"><b>Verdict: {html.escape(verdict)}.</b> '
         f"{html.escape(summary)}</p>"]
    h += [_figure(f, out / f) for f in rel]
    if table:
        h.append("<table><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>")
        h += ["<tr>" + "".join(f"<td>{html.escape(fmt(row.get(c), 4))}</td>"
                               for c in cols) + "</tr>" for row in table]
        h.append("</table>")
    h.append(f"<p><i>Preset {preset}:</i> {html.escape(preset_note)} "
             f"Runs: {len(ctx.runs)} ({html.escape(runs_note)}).</p>")
    h += [_details("Run configs", configs), _details("Environment", env)]
    h.append("</section>")
    return {"md": "\n".join(md), "html": "\n".join(h), "anchor": anchor, "title": title,
            "verdict": verdict}


# The page's column (``body`` in _PAGE): a figure wider than this breaks out of it.
COLUMN_PX = 1100
# A wide figure is never shown below this share of its size (its own box scrolls instead): its
# legends (7 pt at 110 dpi, 10.7 px) stay ≥ 8 px high.
MIN_SCALE = 0.75


def _figure(rel: str, path: Path) -> str:
    """A figure as a link to its full-size image; one wider than the column (``COLUMN_PX``) spans
    the window, at ``MIN_SCALE`` of its size at least."""
    src, alt = html.escape(rel), html.escape(Path(rel).stem)
    size = png_size(path)
    if size is None:
        return f'<figure class="fig"><a href="{src}"><img src="{src}" alt="{alt}"></a></figure>'
    width, height = size
    wide = width > COLUMN_PX
    style = (f' style="--w: {width}px; --min: {round(width * MIN_SCALE)}px"' if wide else "")
    return (f'<figure class="fig{" wide" if wide else ""}"{style}>'
            f'<a href="{src}" title="full size: {width}×{height} px">'
            f'<img src="{src}" alt="{alt}" width="{width}" height="{height}"></a>'
            f'<figcaption><a href="{src}">full size</a> ({width}×{height} px)</figcaption>'
            "</figure>")


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) in pixels from a PNG's header; None for another or an unreadable file."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _details(summary: str, value: Any) -> str:
    text = html.escape(json.dumps(value, indent=1, default=str))
    return f"<details><summary>{summary}</summary><pre>{text}</pre></details>"


def _columns(table: list[dict]) -> list[str]:
    cols: list[str] = []
    for row in table:
        for key in row:
            if key not in cols:
                cols.append(key)
    return cols


def _short_config(config: dict) -> dict:
    return {k: v for k, v in config.items() if v not in (None, [], {}) and k not in ("runs_dir",)}


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>bnlab report</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       color: #222; }}
figure.fig {{ margin: 0.6em 0; }}
figure.fig img {{ display: block; max-width: 100%; height: auto; border: 1px solid #ddd; }}
figure.fig figcaption {{ font-size: 0.8em; color: #666; }}
/* wider than the column: as wide as the window allows, centred on it, never below --min
   (the figure's own box scrolls sideways instead) */
figure.wide {{ width: min(var(--w), calc(100vw - 3em)); position: relative; left: 50%;
              transform: translateX(-50%); overflow-x: auto; }}
figure.wide img {{ width: 100%; min-width: var(--min); }}
table {{ border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; }}
.verdict.held {{ color: #17632a; }} .verdict.not-held {{ color: #a11; }}
.verdict.inconclusive, .verdict.error {{ color: #a60; }}
section {{ border-top: 2px solid #eee; padding-top: 0.5em; }}
pre {{ font-size: 0.8em; background: #f7f7f7; padding: 0.5em; overflow-x: auto; }}
</style></head><body>
<h1>bnlab report</h1>
<p>{count} entries, generated from <code>{runs_dir}</code> alone
(nothing re-trained to draw this).</p>
<ul>{toc}</ul>
{body}
</body></html>
"""
