"""`grpo inspect-rollouts` on a terminal (rich): one panel per group, completions wrapped to the width.

A wide terminal shows each group as a table, one row per completion; when the scores leave fewer
than TABLE_MIN_TEXT columns for the completion (an 80-column terminal, several reward functions)
each completion is stacked instead: a line of scores, then its text wrapped to the whole width.
Piped output has no terminal to measure: $COLUMNS when set, else PIPED_WIDTH columns.

rich is imported inside the functions, like everything heavy in the CLI.
"""

from __future__ import annotations

import os
import shutil
import sys

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

PIPED_WIDTH = 100
TABLE_MIN_TEXT = 40  # fewer columns than this for the completion: stacked layout
SCORE_COLUMNS = ("sample", "reward", "adv", "len", "trunc")  # the table's headers, reward names after "reward"


def shown_text(text: str):
    """A completion as the console draws it (a rich Text): control characters visible, tabs expanded to spaces (rich
    measures a tab as one cell and draws up to eight, which wrapped table cells mid-word)."""
    from rich.text import Text

    return Text(visible(text).expandtabs(4))


def output_width() -> int:
    """$COLUMNS when set, else the terminal's width, else PIPED_WIDTH (piped or redirected)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((PIPED_WIDTH, 24)).columns
    return PIPED_WIDTH


def make_console(width: int | None = None):
    from rich.console import Console

    return Console(highlight=False, width=width or output_width())


def text_room(rows: list[Record], names: list[str], width: int) -> int:
    """Columns the table layout leaves for the completion: the width minus the panel's borders (4) and
    each score column (its widest cell or header, the sample's "(worst)" tag counted, plus the two
    spaces rich puts between columns)."""
    headers = [SCORE_COLUMNS[0], SCORE_COLUMNS[1], *names, *SCORE_COLUMNS[2:]]
    cells = [score_cells(r, names, None, None) for r in rows]
    cells = [[c[0] + " (worst)", *c[1:]] for c in cells]
    widest = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(headers)]
    return width - 4 - sum(w + 2 for w in widest)


def score_line(r: Record, names: list[str], best: int | None, worst: int | None) -> str:
    """'sample 1 (best)  reward=1.500  accuracy=1.000  adv=1.000  len=9  trunc=no': the table's cells,
    each name=value one word, so that wrapping never parts a number from its name."""
    sample, *values = score_cells(r, names, best, worst)
    labels = ["reward", *names, "adv", "len", "trunc"]
    return "  ".join([f"sample {sample}", *(f"{k}={v}" for k, v in zip(labels, values))])


def group_panel(rows: list[Record], group: list[Record], names: list[str], width: int):
    """A rich Panel: prompt, answer, group stats, then the completions (best green, worst red) as a
    table, or stacked when the table would leave the completion too narrow a column."""
    from rich import box
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    best, worst = best_worst(group)
    first = rows[0]

    def style(r: Record) -> str | None:
        return "green" if r["sample"] == best else "red" if r["sample"] == worst else None

    if text_room(rows, names, width) >= TABLE_MIN_TEXT:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for col in ("sample", "reward", *names, "adv", "len", "trunc"):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_column("completion", overflow="fold")
        for r in rows:
            table.add_row(*score_cells(r, names, best, worst), shown_text(with_steps(r)),
                          style=style(r))
        completions = [table]
    else:
        completions = []
        for r in rows:
            completions += [Text(score_line(r, names, best, worst), style=f"bold {style(r) or ''}".strip()),
                            Padding(shown_text(with_steps(r)), (0, 0, 0, 2))]
    answer = Text(f"answer: {visible(first.get('answer'))}   {group_line(group_stats(group))}", style="bold")
    body = Group(Text(visible(short_prompt(str(first.get("prompt", ""))))), answer, *completions)
    return Panel(body, title=group_title(first).lower(), title_align="left")


def print_table(console, shown: list[Record], records: list[Record], metrics: dict[int, Record]) -> None:
    """The default view: a header line per step, then one panel per group."""
    names = reward_names(shown)
    for header, groups in views(shown, records, metrics):
        console.print(header, style="bold")
        for rows, group in groups:
            console.print(group_panel(rows, group, names, console.width))


def print_prompt_table(console, shown: list[Record], records: list[Record]) -> None:
    """--prompt view: per distinct prompt, one row per step: mean reward, std, compact completions."""
    from rich import box
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    for (index, prompt), steps in prompt_history(shown, records).items():
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for col in ("step", "group", "mean", "std"):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_column("completions (reward: text)", overflow="fold")
        for s, g, st, rows in steps:
            lines = "\n".join(f"{num(r.get('reward'))}: {compact(r.get('completion', ''))}" for r in rows)
            table.add_row(str(s), str(g), num(st.mean), num(st.std), Text(lines))
        title = f"data_index {index} · answer {visible(steps[0][3][0].get('answer'))}"
        console.print(Panel(table, title=title, title_align="left", subtitle=compact(short_prompt(prompt), 100)))
