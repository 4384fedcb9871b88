"""`grpo inspect-rollouts --format markdown`: GitHub markdown of a run's rollouts (the records and statistics of
grpo_cli/views/rollouts.py), per step and group, or with --prompt one prompt's groups across steps."""

from __future__ import annotations

from typing import Any

from grpo_cli.views.rollouts import (
    Record,
    best_worst,
    compact,
    group_line,
    group_stats,
    group_title,
    num,
    prompt_history,
    reward_names,
    score_cells,
    short_prompt,
    views,
    visible,
    with_steps,
)


def md_text(text: Any) -> str:
    """Escape HTML so <think> tags show up instead of vanishing in GitHub's renderer."""
    return visible(str(text).replace("\r\n", "\n")).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def md_cell(text: Any) -> str:
    """Text safe inside a markdown table cell: pipes escaped, newlines as <br>."""
    return md_text(text).replace("|", "\\|").replace("\n", "<br>")


def md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def md_quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in md_text(text).split("\n"))


def render_markdown(shown: list[Record], records: list[Record], metrics: dict[int, Record]) -> str:
    """GitHub markdown of `shown` (already arranged): per step a header line, per group a heading,
    the prompt, the answer, group stats (over the whole group in `records`) and a completions table."""
    names, out = reward_names(shown), []
    for header, groups in views(shown, records, metrics):
        out += [f"# Step {groups[0][0][0]['step']}", "", header, ""]
        for rows, group in groups:
            best, worst = best_worst(group)
            first = rows[0]
            out += [f"## {group_title(first)}", "", md_quote(short_prompt(str(first.get("prompt", "")))), "",
                    f"**Answer:** {md_cell(first.get('answer'))} · {group_line(group_stats(group))}", "",
                    md_row(["sample", "reward", *names, "advantage", "length", "truncated", "completion"]),
                    "|" + "---:|" * (4 + len(names)) + ":--|:--|"]
            out += [md_row([*score_cells(r, names, best, worst), md_cell(with_steps(r))]) for r in rows]
            out.append("")
    return "\n".join(out)


def render_prompt_markdown(shown: list[Record], records: list[Record]) -> str:
    """--prompt as markdown: per distinct prompt, one table row per step with compact completions."""
    out = []
    for (index, prompt), steps in prompt_history(shown, records).items():
        answer = steps[0][3][0].get("answer")
        out += [f"## Prompt data_index {index}", "", md_quote(short_prompt(prompt)), "",
                f"**Answer:** {md_cell(answer)}", "",
                "| step | group | mean reward | std | completions (reward: text) |", "|---:|---:|---:|---:|:--|"]
        for s, g, st, rows in steps:
            done = "<br>".join(md_cell(f"{num(r.get('reward'))}: {compact(r.get('completion', ''))}") for r in rows)
            out.append(f"| {s} | {g} | {num(st.mean)} | {num(st.std)} | {done} |")
        out.append("")
    return "\n".join(out)
