"""`grpo inspect-rollouts`: read a run's rollouts.jsonl and show what the policy actually wrote.

One record per completion (written by `grpo train`, see grpo_cli/trainer/reporting.py): step, group (the
prompt's index within the step), sample (0..G-1), prompt, answer, completion, rewards (one score per
reward function, null when it failed), reward (the weighted total; a step-level reward counts its mean step
reward), advantage (as trained: with step rewards, the mean over the completion's tokens), length, truncated.

Statistics are computed from the rollouts themselves, over non-null rewards. "std" is the sample
standard deviation (n - 1, statistics.stdev, like torch.std), the same estimator the trainer uses for
frac_reward_zero_std; a group is zero-std when it has >= 2 rewards and their std is below 1e-6.
Group statistics always use the whole group, even when --where hides some of its completions.

Only the standard library is imported: `grpo inspect-rollouts` never imports torch.
"""

from __future__ import annotations

import math
import operator
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from grpo_cli.errors import InspectError
from grpo_cli.run.logs import METRICS, ROLLOUTS, read_records

REQUIRED = ("step", "group")  # what makes a line of rollouts.jsonl a record
FIELDS = ("reward", "advantage", "length", "step", "group", "sample", "truncated", "data_index")
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "==": lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12),
    "!=": lambda a, b: not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12), "<": operator.lt, ">": operator.gt,
}
SORT_KEYS = ("reward", "advantage", "length")
FORMATS = ("table", "json", "markdown")
ZERO_STD = 1e-6
# the last user turn of common chat templates; anything else is shown as the raw prompt
USER_TURNS = (
    re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S),  # ChatML (Qwen, SmolLM)
    re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", re.S),  # Llama 3
    re.compile(r"<start_of_turn>user\n(.*?)<end_of_turn>", re.S),  # Gemma
)
Record = dict[str, Any]


# ----- reading ------------------------------------------------------------------------------------
def load_records(path: Path | str) -> tuple[list[Record], int]:
    """Every complete record of a rollouts.jsonl file, and how many lines were skipped (a line cut by a crash,
    or any line that is not a JSON object with integer `step` and `group`)."""
    lines = read_records(path, REQUIRED)
    return lines.records, len(lines.bad)


def read_from(path: Path, offset: int) -> tuple[list[Record], int, int]:
    """Records of the complete lines after byte `offset` -> (records, skipped, new offset).
    A last line without its newline (still being written) is left for the next call."""
    lines = read_records(path, REQUIRED, offset=offset, complete_only=True)
    return lines.records, len(lines.bad), lines.end


def metrics_by_step(path: Path) -> dict[int, Record]:
    """metrics.jsonl -> {step: metrics}; {} when the file is missing."""
    return {r["step"]: r for r in read_records(path).records}


def rollouts_path(run_dir: Path) -> Path:
    """The run folder's rollouts.jsonl (a path to the file itself is accepted too)."""
    if run_dir.is_file():
        return run_dir
    if not run_dir.exists():
        raise InspectError(f"run folder not found: {run_dir}")
    path = run_dir / ROLLOUTS
    if not path.exists():
        raise InspectError(f"{run_dir} has no {ROLLOUTS}: not a run folder written by `grpo train` "
                           "(or the run set logging.rollouts=false)")
    return path


def follow_path(run_dir: Path) -> Path:
    """The rollouts.jsonl --follow reads, which may not exist yet (a run folder about to be created)."""
    return run_dir if run_dir.is_file() or (run_dir.name == ROLLOUTS and not run_dir.is_dir()) else run_dir / ROLLOUTS


def skipped_note(n: int) -> str:
    return f"skipped {n} incomplete line" if n == 1 else f"skipped {n} incomplete or malformed lines"


# ----- filters ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Filter:
    field: str
    op: str
    value: float


def reward_names(records: Iterable[Record]) -> list[str]:
    """Names of the reward functions, in first-seen order."""
    names: dict[str, None] = {}
    for r in records:
        names.update(dict.fromkeys(r.get("rewards") or {}))
    return list(names)


def parse_where(text: str, names: list[str]) -> Filter:
    """'reward < 0.5' -> Filter('reward', '<', 0.5); fields are FIELDS and rewards.<name>; no eval()."""
    m = re.fullmatch(r"\s*([^\s<>=!]+)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*", text)
    fields = [*FIELDS, *(f"rewards.{n}" for n in names or ["<name>"])]
    hint = f"fields: {', '.join(fields)}; operators: {' '.join(OPERATORS)}"
    if not m:
        raise InspectError(f"bad --where {text!r}: expected FIELD OP NUMBER, e.g. 'reward < 0.5' or "
                           f"'rewards.accuracy == 1'; {hint}")
    field, op, raw = m.groups()
    if field not in FIELDS and not (field.startswith("rewards.") and field[len("rewards."):] in names):
        raise InspectError(f"unknown field {field!r} in --where {text!r}; {hint}")
    value = {"true": 1.0, "false": 0.0}.get(raw.lower())
    if value is None:
        try:
            value = float(raw)
        except ValueError:
            raise InspectError(f"bad number {raw!r} in --where {text!r} (truncated also takes true/false)") from None
    return Filter(field, op, value)


def field_value(record: Record, field: str) -> float | None:
    """A record's numeric value of `field` (truncated as 0/1); None when missing, null or not a number."""
    if field.startswith("rewards."):
        v = (record.get("rewards") or {}).get(field[len("rewards."):])
    else:
        v = record.get(field)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def matches(record: Record, filters: Iterable[Filter]) -> bool:
    """All filters hold (AND); a null value never matches."""
    return all((v := field_value(record, f.field)) is not None and OPERATORS[f.op](v, f.value) for f in filters)


# ----- selection ----------------------------------------------------------------------------------
def resolve_step(records: list[Record], text: Optional[str]) -> int | None:
    """--step: 'last' (or None) -> the latest step; 'all' -> None (every step); a number must be in the file."""
    steps = sorted({r["step"] for r in records})
    if text in (None, "last", "all"):
        return steps[-1] if text != "all" and steps else None
    if not re.fullmatch(r"-?\d+", text):
        raise InspectError(f"bad --step {text!r}: expected a step number, 'last' or 'all'")
    if int(text) not in steps:
        have = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps yet"
        raise InspectError(f"step {text} is not in {ROLLOUTS} ({have})")
    return int(text)


def select(records: list[Record], step: int | None = None, group: int | None = None,
           where: Iterable[Filter] = ()) -> list[Record]:
    """Records of `step` (None: all steps) and `group` (None: all groups) that pass every filter."""
    where = list(where)
    return [r for r in records if (step is None or r["step"] == step) and (group is None or r["group"] == group)
            and matches(r, where)]


def by_group(records: Iterable[Record]) -> dict[tuple[int, int], list[Record]]:
    """{(step, group): records}, keys in (step, group) order."""
    groups: dict[tuple[int, int], list[Record]] = {}
    for r in sorted(records, key=lambda r: (r["step"], r["group"])):
        groups.setdefault((r["step"], r["group"]), []).append(r)
    return groups


def sort_group(records: list[Record], key: str) -> list[Record]:
    """Descending by `key`; nulls last; ties by sample."""
    return sorted(records, key=lambda r: ((v := field_value(r, key)) is None, -(v or 0.0), r.get("sample", 0)))


def arrange(records: list[Record], sort: str = "reward", limit: int | None = None) -> list[Record]:
    """Order by (step, group), each group sorted by `sort` and cut to its first `limit` completions."""
    return [r for g in by_group(records).values() for r in sort_group(g, sort)[:limit]]


def match_prompt(records: list[Record], key: str) -> list[Record]:
    """--prompt: an integer matches data_index, anything else a case-insensitive substring of the prompt."""
    if re.fullmatch(r"\s*\d+\s*", key):
        return [r for r in records if r.get("data_index") == int(key)]
    needle = key.casefold()
    return [r for r in records if needle in str(r.get("prompt", "")).casefold()]


# ----- statistics ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupStats:
    n: int  # completions in the group
    mean: float | None  # over non-null rewards
    std: float | None  # sample std (n - 1); None with fewer than 2 rewards


@dataclass(frozen=True)
class StepStats:
    step: int
    n: int
    groups: int
    mean: float | None
    std: float | None  # sample std (n - 1) of all the step's rewards
    mean_group_std: float | None  # what metrics.jsonl logs as reward_std
    zero_std_groups: int
    truncated: int


def _rewards(records: Iterable[Record]) -> list[float]:
    return [v for v in (field_value(r, "reward") for r in records) if v is not None]


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    return (statistics.fmean(xs) if xs else None), (statistics.stdev(xs) if len(xs) > 1 else None)


def group_stats(records: list[Record]) -> GroupStats:
    return GroupStats(len(records), *_mean_std(_rewards(records)))


def step_stats(records: list[Record]) -> StepStats:
    """Header numbers of one step, from all of its records."""
    stds = [s.std for s in map(group_stats, by_group(records).values()) if s.std is not None]
    return StepStats(
        records[0]["step"], len(records), len({r["group"] for r in records}), *_mean_std(_rewards(records)),
        mean_group_std=_mean_std(stds)[0], zero_std_groups=sum(s < ZERO_STD for s in stds),
        truncated=sum(bool(r.get("truncated")) for r in records),
    )


def best_worst(records: list[Record]) -> tuple[int | None, int | None]:
    """Samples of the best and worst completion by reward; (None, None) when all rewards tie."""
    scored = [(v, r["sample"]) for r in records if (v := field_value(r, "reward")) is not None]
    if len(scored) < 2 or min(scored)[0] == max(scored)[0]:
        return None, None
    best = min(scored, key=lambda t: (-t[0], t[1]))
    worst = max(scored, key=lambda t: (-t[0], t[1]))
    return best[1], worst[1]


# ----- text ---------------------------------------------------------------------------------------
def short_prompt(prompt: str) -> str:
    """The last user turn of a chat-templated prompt, else the prompt itself, stripped."""
    for pattern in USER_TURNS:
        turns = pattern.findall(prompt)
        if turns:
            return turns[-1].strip()
    return prompt.strip()


def visible(text: Any) -> str:
    """Control characters (C0 but newline and tab, DEL, C1) as \\xNN so they cannot garble a terminal."""
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", str(text))


def num(v: Any, digits: int = 3) -> str:
    return f"{v:.{digits}f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "n/a"


def compact(text: str, width: int = 72) -> str:
    one = " ".join(visible(text).split())
    return one if len(one) <= width else one[: width - 1] + "…"


def step_header(s: StepStats, metrics: Record | None = None) -> str:
    """One line: reward mean ± std, zero-std groups, truncated ratio (and the trainer's clip ratio)."""
    parts = [
        f"step {s.step}", f"{s.n} completions in {s.groups} groups",
        f"reward {num(s.mean)} ± {num(s.std)} (std n-1)", f"mean group std {num(s.mean_group_std)}",
        f"zero-std groups {s.zero_std_groups}/{s.groups}",
        f"truncated {s.truncated}/{s.n} ({num(s.truncated / s.n if s.n else None, 2)})",
    ]
    if metrics and isinstance(metrics.get("clip_ratio/region_mean"), (int, float)):
        parts.append(f"clip_ratio/region_mean {num(metrics['clip_ratio/region_mean'])}")
    return " | ".join(parts)


def group_line(g: GroupStats) -> str:
    return f"group reward {num(g.mean)} ± {num(g.std)} (std n-1, {g.n} completions)"


def score_cells(r: Record, names: list[str], best: int | None, worst: int | None) -> list[str]:
    """sample (best/worst marked), reward, each reward function, advantage, length, truncated."""
    tag = " (best)" if r["sample"] == best else " (worst)" if r["sample"] == worst else ""
    per_function = [num((r.get("rewards") or {}).get(n)) for n in names]
    return [f"{r['sample']}{tag}", num(r.get("reward")), *per_function, num(r.get("advantage")),
            str(r.get("length", "n/a")), "yes" if r.get("truncated") else "no"]


def with_steps(r: Record) -> str:
    """The completion (a multi-turn episode: each turn on its own line, `[assistant] ...` and the observations
    as `[environment] ...` / `[tool] ...`), then its step rewards (process supervision) a line per step-level
    reward: `steps NAME: reward@token ...` (token: the step's last token in the completion)."""
    lines = [f"steps {name}: " + (" ".join(f"{num(rw)}@{t}" for t, rw in pairs) or "none")
             for name, pairs in (r.get("steps") or {}).items()]
    if r.get("turns"):
        body = [f"[{t.get('role', '?')}] {t.get('text', '')}" for t in r["turns"]]
    else:
        body = [str(r.get("completion", ""))]
    return "\n".join([*body, *lines])


def views(shown: list[Record], records: list[Record], metrics: dict[int, Record]):
    """Per step of `shown`: (header line, [(shown rows, whole group), ...]); rows keep their arranged
    order (by_group sorts stably), statistics use the whole group and step from `records`."""
    full, shown_groups = by_group(records), by_group(shown)
    for step in sorted({s for s, _ in shown_groups}):
        header = step_header(step_stats([r for r in records if r["step"] == step]), metrics.get(step))
        yield header, [(rows, full[key]) for key, rows in shown_groups.items() if key[0] == step]


def group_title(r: Record) -> str:
    return f"Step {r['step']} · group {r['group']} · data_index {r.get('data_index', 'n/a')}"


History = dict[tuple[Any, str], list[tuple[int, int, GroupStats, list[Record]]]]


def prompt_history(shown: list[Record], records: list[Record]) -> History:
    """{(data_index, prompt): [(step, group, stats of the whole group, shown completions), ...]}."""
    full, out = by_group(records), {}
    for (s, g), rows in by_group(shown).items():
        key = (rows[0].get("data_index"), str(rows[0].get("prompt", "")))
        out.setdefault(key, []).append((s, g, group_stats(full[(s, g)]), rows))
    return out


# ----- follow -------------------------------------------------------------------------------------
def complete_steps(records: list[Record], metric_steps: Iterable[int]) -> set[int]:
    """Steps whose rollouts are all written: any step before the latest, and the latest once
    metrics.jsonl has it (the trainer writes a step's metrics after its rollouts)."""
    steps = {r["step"] for r in records}
    latest = max(steps, default=None)
    return {s for s in steps if s != latest or s in set(metric_steps)}


def follow(path: Path, emit: Callable[[int, list[Record]], None], records: list[Record], offset: int,
           printed: set[int], poll_s: float = 1.0, timeout: float | None = None,
           note: Callable[[str], None] = print) -> None:
    """Poll `path` and call emit(step, its records) once for every step that completes, until
    `timeout` seconds have passed (None: until Ctrl-C)."""
    metrics_path = path.parent / METRICS
    deadline = None if timeout is None else time.monotonic() + timeout
    waiting = not path.exists()
    while deadline is None or time.monotonic() < deadline:
        time.sleep(poll_s)
        if path.exists() and path.stat().st_size < offset:  # rewritten (a resume drops steps after its checkpoint)
            records.clear()
            offset = 0
        new, skipped, offset = read_from(path, offset)
        if waiting and path.exists():  # after the read: the file it read from is announced before its steps print
            waiting = False
            note(f"following {path}")
        records.extend(new)
        if skipped:
            note(skipped_note(skipped))
        for s in sorted(complete_steps(records, metrics_by_step(metrics_path)) - printed):
            printed.add(s)
            emit(s, [r for r in records if r["step"] == s])


# ----- the command --------------------------------------------------------------------------------
def check_options(sort: str, fmt: str, follow_: bool, prompt: Optional[str]) -> None:
    for option, value, allowed in (("--sort", sort, SORT_KEYS), ("--format", fmt, FORMATS)):
        if value not in allowed:
            raise InspectError(f"bad {option} {value!r}: choose one of {', '.join(allowed)}")
    if follow_ and prompt is not None:
        raise InspectError("--follow and --prompt do not combine: --prompt looks back over finished steps")
