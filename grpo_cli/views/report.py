"""`grpo report`: plots and one self-contained HTML page from the metrics.jsonl of one or more runs.

Three layers, each testable alone:
  data      grpo_cli/views/run_metrics.py: the records, series, reward windows, summary, resumes
  panels    candidate_panels / select_panels: which plots exist, as data (keys, labels, axis names)
  output    plot_panel returns a matplotlib Figure (tests read every line back from it);
            write_report saves one PNG per panel and report.html with the PNGs as base64 data URIs.
matplotlib is imported lazily, with the headless Agg backend, so `grpo --help` stays fast.
"""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_cli.views.run_metrics import (
    TIME_KEYS,
    Run,
    aligned,
    fmt_number,
    fmt_seconds,
    moving_average,
    present_keys,
    reward_window,
    series,
    stack_layers,
    summary,
)

_LINESTYLES = ("-", "--", ":", "-.")


# --------------------------------------------------------------------------------------- panels


@dataclass(frozen=True)
class Axis:
    """One subplot: a line per (run, key)."""

    ylabel: str
    keys: tuple[str, ...]
    labels: tuple[str, ...]
    bands: tuple[tuple[str, str], ...] = ()  # (mean key, std key): shade mean ± std
    sci: bool = False  # scientific tick labels (learning rates)
    from_zero: bool = False  # a quantity that cannot be negative: the y axis starts at 0
    wide: tuple[str, ...] = ()  # keys drawn wide and translucent, so an identical line on top stays visible
    smooth: tuple[str, ...] = ()  # per-step keys drawn thin, with their moving average (`reward_window` steps) on top


@dataclass(frozen=True)
class Panel:
    """One figure, one PNG file (`name`.png)."""

    name: str
    title: str
    axes: tuple[Axis, ...]
    stacked: bool = False  # the step-time breakdown: stacked areas, one subplot per run


def _eval_order(key: str) -> tuple[int, int]:
    kind, _, k = key.removeprefix("eval/").partition("@")
    return ({"accuracy": 0, "pass": 1, "maj": 2}[kind], int(k or 0))


def _reward_fn_panel(fn: str, keys: set[str]) -> Panel:
    mean, std, ev = f"rewards/{fn}/mean", f"rewards/{fn}/std", f"eval/rewards/{fn}/mean"
    band = ((mean, std),) if std in keys else ()
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", fn)
    title = f"Reward function: {fn}" + (" (band: ± std over completions)" if band else "")
    return Panel(f"reward_fn_{safe}", title,
                 (Axis("reward", (mean, ev), ("train mean", "eval mean"), band, smooth=(mean,)),))


def candidate_panels(keys: set[str]) -> list[Panel]:
    """Every panel a report can hold, given the metric names the runs logged."""
    fns = sorted({m.group(1) for k in keys if (m := re.fullmatch(r"(?:eval/)?rewards/(.+)/mean", k))})
    evals = sorted((k for k in keys if re.fullmatch(r"eval/(accuracy|pass@\d+|maj@\d+)", k)), key=_eval_order)
    reward_keys = ("reward", *(f"rewards/{f}/mean" for f in fns), *evals)
    reward_labels = ("reward (weighted sum)", *fns, *(k.replace("/", " ") for k in evals))
    clip = ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")
    return [
        Panel("reward", "Reward and accuracy (train per step; eval where logged)",
              # with one reward function of weight 1 the sum equals it: drawn wide so it is not hidden
              (Axis("reward / accuracy", reward_keys, reward_labels, wide=("reward",),
                    smooth=reward_keys[:1 + len(fns)]),)),
        *(_reward_fn_panel(f, keys) for f in fns),
        Panel("kl", "KL divergence to the reference model", (Axis("KL", ("kl",), ("kl",)),)),
        Panel("entropy", "Policy entropy of completion tokens",
              (Axis("entropy (nats/token)", ("entropy",), ("entropy",), from_zero=True),)),
        Panel("clip_ratio", "Fraction of tokens clipped by the policy ratio",
              (Axis("fraction of tokens", clip, ("low", "high", "region"), from_zero=True),)),
        Panel("completion_length", "Completion length", (
            Axis("tokens", ("completions/mean_length", "completions/max_length"), ("mean", "max")),
            Axis("fraction clipped", ("completions/clipped_ratio",), ("clipped at max length",), from_zero=True))),
        Panel("grad_norm", "Gradient norm (before clipping)",
              (Axis("grad norm", ("grad_norm",), ("grad norm",), from_zero=True),)),
        Panel("learning_rate", "Learning rate",
              (Axis("learning rate", ("learning_rate",), ("lr",), sci=True, from_zero=True),)),
        Panel("step_time", "Time per step: generate / score / train",
              (Axis("seconds", TIME_KEYS, ("generate", "score", "train")),), stacked=True),
    ]


def _keep(axis: Axis, keys: set[str]) -> Optional[Axis]:
    pairs = [(k, lab) for k, lab in zip(axis.keys, axis.labels) if k in keys]
    if not pairs:
        return None
    return Axis(axis.ylabel, tuple(k for k, _ in pairs), tuple(lab for _, lab in pairs), axis.bands, axis.sci,
                axis.from_zero, axis.wide, axis.smooth)


def select_panels(panels: list[Panel], keys: set[str]) -> tuple[list[Panel], list[Panel]]:
    """(panels with data, each reduced to the lines that exist; panels skipped because no run logged them)."""
    kept, skipped = [], []
    for p in panels:
        axes = tuple(a for a in (_keep(ax, keys) for ax in p.axes) if a is not None)
        if axes:
            kept.append(Panel(p.name, p.title, p.axes if p.stacked else axes, p.stacked))
        else:
            skipped.append(p)
    return kept, skipped


# ------------------------------------------------------------------------------------- plotting


def _line_label(run: str, label: str, n_runs: int, n_keys: int) -> str:
    if n_runs == 1:
        return label
    return run if n_keys == 1 else f"{run}: {label}"


def _legend(ax: Any) -> None:
    n = len(ax.get_legend_handles_labels()[1])
    if n > 5:  # many lines: legend beside the plot, never over the data
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    elif n > 1:
        ax.legend(fontsize="small", loc="best")


def _mark_resumes(ax: Any, runs: list[Run]) -> None:
    """A dotted vertical line before each step a resume started at, labelled once per run."""
    for run in runs:
        for i, step in enumerate(run.resumes):
            label = ("resumed" if len(runs) == 1 else f"{run.label}: resumed") if i == 0 else "_nolegend_"
            ax.axvline(step - 0.5, color="0.45", linestyle=":", linewidth=1.2, label=label)


def _draw_axis(ax: Any, spec: Axis, runs: list[Run]) -> None:
    n_keys, bands = len(spec.keys), dict(spec.bands)
    drawn: list[float] = []
    for ri, run in enumerate(runs):
        for ki, (key, label) in enumerate(zip(spec.keys, spec.labels)):
            x, y = series(run.records, key)
            if not x:
                continue
            drawn += y
            # one key: a colour per run; several keys: a colour per key and a line style per run
            color = f"C{(ri if n_keys == 1 else ki) % 10}"
            style = "-" if n_keys == 1 else _LINESTYLES[ri % len(_LINESTYLES)]
            marker = dict(marker="o", markersize=4) if key.startswith("eval/") else {}
            wide = dict(linewidth=4.5, alpha=0.4) if key in spec.wide else dict(linewidth=2.2)
            w = reward_window(len(y)) if key in spec.smooth else 1
            name = _line_label(run.label, label, len(runs), n_keys)
            # averaged: the per-step values thin and faint under their average, which takes the line's width
            ax.plot(x, y, linestyle=style, color=color, label=name, **marker,
                    **(dict(linewidth=1.0, alpha=0.3) if w > 1 else wide if key in spec.wide else dict(linewidth=1.5)))
            if w > 1:
                ax.plot(*moving_average(x, y, w), linestyle=style, color=color, **wide,
                        label=f"{name}, mean of {w} steps")
            if key in bands:
                steps, (mean, std) = aligned(run.records, [key, bands[key]])
                ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                color=color, alpha=0.15, linewidth=0)
    _mark_resumes(ax, runs)
    ax.set_ylabel(spec.ylabel)
    ax.grid(alpha=0.3)
    if drawn and not any(drawn):  # a flat line on the axis edge reads as an empty plot: centre it and say so
        ax.set_ylim(-1.0, 1.0)
        ax.text(0.5, 0.62, "0 at every step", ha="center", va="center", transform=ax.transAxes, color="0.3")
    elif spec.from_zero:
        ax.set_ylim(bottom=0)
    if spec.sci:
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    _legend(ax)


def _plot_stacked(fig: Any, panel: Panel, runs: list[Run]) -> None:
    # no shared y: runs on different hardware differ by orders of magnitude
    axs = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, run in zip(axs, runs):
        steps, layers = stack_layers(run.records)
        if steps:
            colors = [f"C{i}" for i in range(len(layers))]
            ax.stackplot(steps, *layers.values(), labels=list(layers), colors=colors, alpha=0.75)
        x, y = series(run.records, "time/step")
        if x:
            ax.plot(x, y, color="black", linewidth=1, label="total (time/step)")
        if not steps and not x:
            ax.text(0.5, 0.5, "no step times logged", ha="center", va="center", transform=ax.transAxes)
        _mark_resumes(ax, [run])
        if len(runs) > 1:
            ax.set_title(run.label, fontsize="medium")
        ax.set_ylabel(panel.axes[0].ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axs[-1].set_xlabel("step")


def plot_panel(panel: Panel, runs: list[Run]) -> Any:
    """A matplotlib Figure (not attached to pyplot, so nothing leaks between calls)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    n = len(runs) if panel.stacked else len(panel.axes)
    fig = Figure(figsize=(9, 1.0 + 3.0 * n), layout="constrained")
    fig.suptitle(panel.title)
    if panel.stacked:
        _plot_stacked(fig, panel, runs)
        return fig
    axs = fig.subplots(n, 1, sharex=True, squeeze=False)[:, 0]
    for ax, spec in zip(axs, panel.axes):
        _draw_axis(ax, spec, runs)
    axs[-1].set_xlabel("step")
    return fig


def figure_png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


# ---------------------------------------------------------------------------------- runs, output

SUMMARY_COLUMNS = ("run", "steps", "mean reward, start", "mean reward, end", "best mean reward",
                   "last eval accuracy", "total time", "mean step time")


def summary_row(label: str, s: dict[str, Any]) -> list[str]:
    """One table row, as text, in the order of SUMMARY_COLUMNS."""
    windows = [("-" if s[k] is None else str(s[k])) for k in ("start_reward", "end_reward", "best_reward")]
    return [label, str(s["steps"]), *windows, fmt_number(s["last_eval_accuracy"]), fmt_seconds(s["total_time_s"]),
            fmt_seconds(s["mean_step_time_s"])]


def skipped_text(skipped: list[Panel]) -> str:
    return "; ".join(f"{p.title} ({', '.join(k for a in p.axes for k in a.keys)})" for p in skipped)


_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}td:first-child,th:first-child{text-align:left}"
        "th{background:#f3f3f3}figure{margin:2em 0}img{max-width:100%}.note{color:#666}"
        ".fail td{background:#fde8e8}.warn td{background:#fff6dd}.ok td{color:#666}td.evidence{text-align:left;"
        "font-size:90%}")


def audit_html(audits: list[tuple[str, list]]) -> str:
    """`grpo audit`'s verdicts of each run (grpo_cli/views/audit.py), worst first; checks without data left out."""
    e = html.escape
    rows = []
    for label, verdicts in audits:
        for v in verdicts:
            if v.severity == "skip":
                continue
            detail = "<br>".join(e(x) for x in v.evidence) + (f"<br><b>try:</b> {e(v.advice)}" if v.advice else "")
            rows.append(f"<tr class='{e(v.severity)}'><td>{e(label)}</td><td>{e(v.severity.upper())}</td>"
                        f"<td>{e(v.check)}</td><td>{e(v.finding)}</td><td class='evidence'>{detail}</td></tr>")
    return ("<h2>Audit</h2><table><tr><th>run</th><th>verdict</th><th>check</th><th>finding</th><th>evidence</th></tr>"
            + "".join(rows) + "</table>") if rows else ""


def render_html(rows: list[list[str]], images: list[tuple[Panel, bytes]], skipped: list[Panel],
                sources: list[Path], audits: list[tuple[str, list]] | None = None) -> str:
    """One page, no external files: the audit's verdicts, the summary table, then every PNG as a base64 data URI."""
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in SUMMARY_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>grpo report</title>",
             f"<style>{_CSS}</style></head><body><h1>grpo report</h1>",
             "<p class='note'>" + "<br>".join(e(str(p / "metrics.jsonl")) for p in sources) + "</p>",
             audit_html(audits or []),
             f"<h2>Summary</h2><table><tr>{head}</tr>{body}</table>"]
    if skipped:
        parts.append(f"<p class='note'>Not plotted, no run logged them: {e(skipped_text(skipped))}</p>")
    for panel, png in images:
        data = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure id='{e(panel.name)}'><img alt='{e(panel.title)}' src=\"data:image/png;base64,{data}\">"
                     f"<figcaption>{e(panel.title)}</figcaption></figure>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def text_table(rows: list[list[str]]) -> str:
    table = [list(SUMMARY_COLUMNS), *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(SUMMARY_COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in table)


def write_report(runs: list[Run], out: Path, audits: list[tuple[str, list]] | None = None
                 ) -> tuple[list[Path], list[Panel], list[list[str]]]:
    """Write one PNG per panel and report.html into `out` (`audits`: each run's label and `grpo audit` verdicts, shown
    first); return (files written, skipped panels, table rows)."""
    keys = present_keys(runs)
    kept, skipped = select_panels(candidate_panels(keys), keys)
    rows = [summary_row(r.label, summary(r.records)) for r in runs]
    out.mkdir(parents=True, exist_ok=True)
    images, files = [], []
    for panel in kept:
        png = figure_png(plot_panel(panel, runs))
        files.append(out / f"{panel.name}.png")
        files[-1].write_bytes(png)
        images.append((panel, png))
    files.append(out / "report.html")
    files[-1].write_text(render_html(rows, images, skipped, [r.path for r in runs], audits), encoding="utf-8")
    return files, skipped, rows
