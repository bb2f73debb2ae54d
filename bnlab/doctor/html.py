"""The doctor's report as one self-contained HTML page: the findings, then per-layer plots.

Everything is inside the file: the style sheet inline, every plot a PNG embedded as
``data:image/png;base64`` (drawn with matplotlib's Agg backend), no script, no font, no link: the
page opens in a browser with no network. Plots, each drawn from the report's ``measurements``
(:mod:`bnlab.doctor.report` documents the keys) and left out, with a line saying so, when its
series was not measured:

- running against population statistics, per BN layer (``running_vs_population``): a layer on the
  diagonal has running statistics that match the network as it is (stale-running-stats);
- batch-statistic noise against batch size (``noise_vs_batch``): the measured variance of ξ_μ
  against Yong et al.'s 1/m (Theorem 1);
- the effective learning rate η/‖w‖² of each scale-invariant weight over steps (``effective_lr``,
  Arora, Li & Lyu);
- the top Hessian eigenvalue against the optimizer's stability threshold 2/η (``sharpness``,
  Santurkar et al.);
- the running statistics' lag behind the batch statistics over steps, with the learning rate
  (``running_lag``, ``lr``: the watcher's series).
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# The report is a bnlab.doctor.Report, not imported: report.py imports this module to render.
Report = Any

MAX_LAYERS = 8  # per-layer panels per plot (the most suspicious first)

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;
max-width:70em;color:#222;line-height:1.4;padding:0 1em}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;width:100%}td,th{border:1px solid #ddd;
padding:.3em .6em;text-align:left;vertical-align:top;overflow-wrap:break-word}th{background:#f4f4f4}
.warn{color:#a40000;font-weight:bold}.info{color:#555}.ok{color:#2a7a2a;font-weight:bold}
figure{margin:1em 0}figcaption{font-size:.9em;color:#444}img{max-width:100%}
.missing{color:#777;font-style:italic}
table.findings{table-layout:fixed}table.findings td{overflow-wrap:anywhere}
pre{white-space:pre-wrap;font-size:.85em}
"""


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _png(fig: Any) -> str:
    """The figure as a base64 PNG (and closed)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _grid(count: int, width: float = 3.2, height: float = 2.6) -> tuple[Any, list[Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(count, 4)
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False,
                             constrained_layout=True)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _running_vs_population(data: Mapping[str, Any]) -> str:
    layers = sorted(data, key=lambda n: -abs(_number(data[n].get("mean_shift_sd", 0.0))))
    layers = layers[:MAX_LAYERS]
    fig, axes = _grid(len(layers))
    for ax, name in zip(axes, layers):
        entry = data[name]
        for key, colour in (("mean", "tab:blue"), ("var", "tab:orange")):
            run = [_number(v) for v in entry.get(f"running_{key}", [])]
            pop = [_number(v) for v in entry.get(f"population_{key}", [])]
            ax.scatter(pop, run, s=9, color=colour, label=key)
        lims = [v for v in ax.get_xlim() + ax.get_ylim() if math.isfinite(v)]
        if lims:
            ax.plot([min(lims), max(lims)], [min(lims), max(lims)], color="#999", lw=0.8)
        ax.set_title(f"{name}\nshift {_number(entry.get('mean_shift_sd')):.2g} SD", fontsize=8)
        ax.set_xlabel("population", fontsize=8)
        ax.set_ylabel("running", fontsize=8)
        ax.legend(fontsize=7)
    return _png(fig)


def _noise_vs_batch(data: Mapping[str, Any], curve: Mapping[str, Any] | None) -> str:
    fig, (ax,) = _grid(1, 5.5, 3.6)
    if curve and curve.get("batch"):
        ax.plot([_number(b) for b in curve["batch"]],
                [_number(v) for v in curve.get("theory_xi_mu_var", [])], color="#444", lw=1,
                label="theory 1/m (Yong et al., Thm 1)")
    for name, entry in data.items():
        power = entry.get("xi_mu_power", entry.get("xi_mu_var"))  # E[ξ_μ²] (mean 0: its variance)
        ax.scatter([_number(entry.get("m"))], [_number(power)], s=18, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("m (values per channel in a batch)")
    ax.set_ylabel("E[ξ_μ²]")
    if len(data) <= 12:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return _png(fig)


def _lines(series: Mapping[str, Sequence[Any]], ylabel: str, log: bool = True) -> str:
    fig, (ax,) = _grid(1, 5.5, 3.6)
    for name, points in list(series.items())[:12]:
        steps = [_number(p[0]) for p in points]
        values = [_number(p[1]) for p in points]
        ax.plot(steps, values, marker=".", lw=1, label=name)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return _png(fig)


def _sharpness(points: Sequence[Sequence[Any]]) -> str:
    fig, (ax,) = _grid(1, 5.5, 3.6)
    steps = [_number(p[0]) for p in points]
    ax.plot(steps, [_number(p[1]) for p in points], marker="o", label="top eigenvalue λ_max")
    ax.plot(steps, [_number(p[2]) for p in points], ls="--", marker="_", markersize=14,
            color="tab:red", label="stability threshold (2/η, or (2+2μ)/η)")
    ax.set_xlabel("step")
    ax.set_ylabel("curvature")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    return _png(fig)


def _lag(lag: Mapping[str, Sequence[Any]], lr: Sequence[Sequence[Any]] | None) -> str:
    fig, (ax,) = _grid(1, 5.5, 3.6)
    for name, points in list(lag.items())[:12]:
        ax.plot([_number(p[0]) for p in points], [_number(p[1]) for p in points], lw=1,
                marker=".", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("|running − batch mean| (batch SDs)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.18, 1.0), frameon=False)
    if lr:
        twin = ax.twinx()
        twin.step([_number(p[0]) for p in lr], [_number(p[1]) for p in lr], color="#999",
                  where="post", lw=1)
        twin.set_ylabel("learning rate", color="#777")
        twin.set_yscale("log")
    return _png(fig)


# (title, caption, measurement key, drawer(measurements) -> base64 PNG)
PLOTS: list[tuple[str, str, str, Callable[[Mapping[str, Any]], str]]] = [
    ("Running against population statistics",
     "Each point is one channel: its running statistic (what eval mode uses) against the "
     "population statistic of the network as it is now. Off the diagonal: stale running "
     "statistics.", "running_vs_population",
     lambda m: _running_vs_population(m["running_vs_population"])),
    ("Batch-statistic noise against batch size",
     "The measured power E[ξ_μ²] of the batch mean's noise ξ_μ = (μ − μ_B)/σ of each BN layer "
     "at its m, against Yong et al.'s Theorem 1 (ξ_μ ~ N(0, 1/m)).", "noise_vs_batch",
     lambda m: _noise_vs_batch(m["noise_vs_batch"], m.get("noise_vs_batch/_curve"))),
    ("Effective learning rate over steps",
     "η/‖w‖² of each scale-invariant weight (Arora, Li & Lyu): the step its direction takes. "
     "Without weight decay it falls as ‖w‖ grows; weight decay holds ‖w‖ in equilibrium.",
     "effective_lr", lambda m: _lines(m["effective_lr"], "η/‖w‖²")),
    ("Sharpness against 2/lr",
     "Top eigenvalue of the train-mode loss's Hessian against the optimizer's stability "
     "threshold (Santurkar et al.; gradient descent on a quadratic diverges above it).",
     "sharpness", lambda m: _sharpness(m["sharpness"])),
    ("Running statistics' lag over steps",
     "How far each BN layer's running mean is behind the batch it normalizes, in batch standard "
     "deviations, with the learning rate (grey).", "running_lag",
     lambda m: _lag(m["running_lag"], m.get("lr"))),
]


def _findings_table(report: Report) -> str:
    if not report.findings:
        return '<p class="ok">No findings: no warnings.</p>'
    rows = []
    for f in report.findings:
        layers = ", ".join(f.layers[:6]) + (f" (+{len(f.layers) - 6})" if len(f.layers) > 6 else "")
        rows.append(
            f'<tr><td class="{f.severity}">{f.severity}</td><td><code>{f.code}</code></td>'
            f"<td>{html.escape(layers)}</td><td>{f.value:.4g}</td><td>{f.threshold:.4g}</td>"
            f"<td>{html.escape(f.detail)}</td><td>{html.escape(f.remedy)}</td>"
            f"<td>{html.escape(f.why)}</td><td>{html.escape(f.paper)}</td></tr>")
    head = ("<tr><th>severity</th><th>code</th><th>layers</th><th>value</th><th>threshold</th>"
            "<th>measured</th><th>remedy</th><th>why this threshold</th><th>paper</th></tr>")
    verdict = ("" if report.warnings else '<p class="ok">No warnings.</p>')
    widths = "".join(f'<col style="width:{w}%">' for w in (6, 9, 9, 6, 6, 17, 17, 16, 14))
    return (f'{verdict}<table class="findings"><colgroup>{widths}</colgroup>{head}'
            f"{''.join(rows)}</table>")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {_cell(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell(v) for v in value)
    return str(value)


def _context_table(context: Mapping[str, Any]) -> str:
    if not context:
        return ""
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_cell(v))}</td></tr>"
                   for k, v in context.items())
    return f"<table>{rows}</table>"


def page(report: Report) -> str:
    """The HTML text of ``report`` (see the module docstring)."""
    data = report.to_dict()
    measurements = data["measurements"]
    sections = []
    for title, caption, key, draw in PLOTS:
        value = measurements.get(key)
        if not value:
            sections.append(f'<h2>{title}</h2><p class="missing">Not measured in this run.</p>')
            continue
        image = draw(measurements)
        sections.append(f'<h2>{title}</h2><figure><img alt="{html.escape(title)}" '
                        f'src="data:image/png;base64,{image}"><figcaption>{caption}'
                        "</figcaption></figure>")
    terminal = html.escape(str(report))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>bnlab doctor</title><style>{STYLE}</style></head><body>"
            "<h1>bnlab doctor</h1>"
            f"<h2>Findings</h2>{_findings_table(report)}"
            f"<pre>{terminal}</pre>"
            f"<h2>Run</h2>{_context_table(data['context'])}"
            f"{''.join(sections)}</body></html>\n")


def render(report: Report, path: str | Path) -> Path:
    """Write ``report`` as one self-contained HTML page to ``path`` (see the module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(report), encoding="utf-8")
    return path
