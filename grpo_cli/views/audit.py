"""`grpo audit RUN`: verdicts on a run folder, finished or running, from metrics.jsonl and rollouts.jsonl.

Each check compares the run's first and last windows of steps (`reward_window` steps each, the span the summary
table uses) and says ok, warn or fail, with the steps and values it read and what to try. A change counts when it
is larger than both a floor (what matters) and twice its standard error (what a run of a few prompts a step can
show by chance). The checks tell apart what looks alike in one curve: entropy falling while the reward rises is a
policy growing confident as it learns; entropy falling with the reward flat and groups without signal is
collapse. Likewise groups without signal because every completion was right (the task is saturating) or wrong
(too hard, or a reward that never pays), and identical completions that are all right or not.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from grpo_cli.run.logs import ROLLOUTS
from grpo_cli.views.verdicts import Verdict, verdicts_text, worst_first
from grpo_cli.views.rollouts import load_records
from grpo_cli.views.run_metrics import load_run_records, reward_window, series, step_span

ACCURACY_WORDS = ("accuracy", "correct")  # a reward function so named measures the task itself
NONFINITE = "nonfinite/skipped_updates"  # optimizer steps the trainer skipped for a NaN or infinite loss or gradient


@dataclass
class Windows:
    """A metric's first and last windows: means, standard errors, spans."""

    first: float
    last: float
    se: float  # of last - first
    first_span: str
    last_span: str

    @property
    def change(self) -> float:
        return self.last - self.first

    def moved(self, floor: float) -> int:
        """+1 risen, -1 fallen, 0 neither (by more than `floor` and twice the standard error)."""
        if abs(self.change) <= max(floor, 2 * self.se):
            return 0
        return 1 if self.change > 0 else -1

    def __str__(self) -> str:
        return f"{self.first:.3f} ({self.first_span}) -> {self.last:.3f} ({self.last_span})"


def windows(records: list[dict], key: str) -> Optional[Windows]:
    steps, values = series(records, key)
    if len(values) < 2:
        return None
    w = reward_window(len(values))
    a, b = values[:w], values[-w:]

    def var(xs: list[float]) -> float:
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0

    se = math.sqrt(var(a) / len(a) + var(b) / len(b))
    return Windows(sum(a) / len(a), sum(b) / len(b), se, step_span(int(steps[0]), int(steps[w - 1])),
                   step_span(int(steps[-w]), int(steps[-1])))


def read_groups(run_dir: Path) -> dict[int, list[list[dict]]]:
    """rollouts.jsonl -> per step, its groups' records (completion, reward); {} without the file."""
    groups: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for r in load_records(run_dir / ROLLOUTS)[0]:  # a line being written, or not a record, is skipped
        groups[(r["step"], r["group"])].append(r)
    out: dict[int, list[list[dict]]] = defaultdict(list)
    for (step, _), rows in sorted(groups.items()):
        out[step].append(rows)
    return out


# ------------------------------------------------------------------------------------------------ the checks

def check_reward_vs_eval(records: list[dict]) -> Verdict:
    name = "reward vs eval accuracy"
    evals = [(int(r["step"]), float(r["eval/accuracy"]), int(r.get("eval/num_problems") or 0))
             for r in records if isinstance(r.get("eval/accuracy"), (int, float))]
    if len(evals) < 2:
        return Verdict(name, "skip", f"{len(evals)} eval step(s) in the run: two are needed (eval.every_steps)")
    best = max(evals, key=lambda e: e[1])
    last = evals[-1]
    after = [e for e in evals if e[0] > best[0]]
    n = last[2] or best[2] or 1
    p = (best[1] + last[1]) / 2
    se = math.sqrt(2 * max(p * (1 - p), 1e-6) / n)
    drop = best[1] - last[1]
    evidence = [", ".join(f"step {s}: {a:.3f}" for s, a, _ in evals) + f" (eval/accuracy, {n} problems)"]
    since = windows([r for r in records if r["step"] >= best[0]], "reward")
    rose = since is not None and since.moved(0.05) > 0
    if since is not None:
        evidence.append(f"reward since the best eval: {since}")
    if drop <= max(0.05, 2 * se):
        return Verdict(name, "ok", f"eval accuracy {evals[0][1]:.3f} -> {last[1]:.3f} (best {best[1]:.3f} at step "
                                   f"{best[0]}): no significant fall", evidence)
    keep = f"the best model is near step {best[0]} (keep that checkpoint)"
    if not rose:
        return Verdict(name, "warn", f"eval accuracy fell {best[1]:.3f} (step {best[0]}) -> {last[1]:.3f} (step "
                                     f"{last[0]}), {drop / se:.1f} standard errors, with the training reward not rising "
                                     "since: the later policy generalizes worse, not a gamed reward", evidence,
                       f"{keep}; a lower learning rate, or fewer steps")
    consistent = len(after) >= 2 and all(a < best[1] - 2 * se for _, a, _ in after)
    return Verdict(
        name, "fail" if consistent else "warn",
        f"eval accuracy fell {best[1]:.3f} (step {best[0]}) -> {last[1]:.3f} (step {last[0]}), {drop / se:.1f} standard "
        f"errors, while the training reward rose" + ("" if consistent else "; one eval after the best: may be noise"),
        evidence,
        f"{keep}; read the rewarded completions for a gamed "
        "reward (grpo inspect-rollouts RUN); a lower learning rate or a KL term (algorithm.beta) holds the policy closer")


def never_paid(records: list[dict]) -> list[str]:
    """The reward functions whose mean was 0 at every step that logged it: no completion ever earned anything."""
    keys = sorted({k for r in records for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    return [k.split("/")[1] for k in keys if all(r[k] == 0 for r in records if isinstance(r.get(k), (int, float)))]


def check_components(records: list[dict]) -> Verdict:
    name = "reward components"
    keys = sorted({k for r in records for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    fns = {k.split("/")[1]: k for k in keys}
    if zero := never_paid(records):
        return Verdict(name, "warn", f"{', '.join(zero)} paid 0 at every step ({len(records)} steps): "
                                     f"{'it gives' if len(zero) == 1 else 'they give'} the policy no signal",
                       [f"rewards/{f}/mean: 0.000 at every step" for f in zero],
                       "check the reward on known answers (grpo doctor RECIPE probes each reward on the data's own "
                       "answers); if it is right, the task is too hard for the model: easier problems, or a larger "
                       "algorithm.num_generations")
    task = [f for f in fns if any(w in f.lower() for w in ACCURACY_WORDS)]
    others = [f for f in fns if f not in task]
    if not task or not others:
        return Verdict(name, "skip", "needs an accuracy reward and another one to compare" if fns else
                       "no per-function rewards logged")
    moves = {f: windows(records, fns[f]) for f in fns}
    evidence = [f"{f}: {moves[f]}" for f in fns if moves[f] is not None]
    acc = [moves[f].moved(0.05) for f in task if moves[f] is not None]
    rising = [f for f in others if moves[f] is not None and moves[f].moved(0.1) > 0]
    if not rising or any(a > 0 for a in acc):
        return Verdict(name, "ok", "no reward rose without the accuracy reward", evidence)
    fell = any(a < 0 for a in acc)
    return Verdict(
        name, "fail" if fell else "warn",
        f"{', '.join(rising)} rose while {', '.join(task)} {'fell' if fell else 'stayed flat'}: the policy learns what "
        "that reward pays for, not the task", evidence,
        f"read completions that score high on {rising[0]} and low on {task[0]} (grpo inspect-rollouts RUN); lower its "
        "weight (rewards[].weight) or make it pay only with a correct answer")


def check_entropy(records: list[dict], reward: Optional[Windows], signal: Optional[Windows],
                  components: Verdict) -> Verdict:
    name = "entropy"
    ent = windows(records, "entropy")
    if ent is None:
        return Verdict(name, "skip", "no entropy logged")
    evidence = [f"entropy (nats a token): {ent}"] + ([f"reward: {reward}"] if reward else [])
    if ent.last >= 0.2 * ent.first or ent.last >= 0.3:
        return Verdict(name, "ok", f"entropy {ent.first:.3f} -> {ent.last:.3f}: the policy still explores", evidence)
    if reward is not None and reward.moved(0.05) > 0 and components.severity in ("warn", "fail"):
        return Verdict(name, "warn", f"entropy fell {ent.first:.3f} -> {ent.last:.3f} while the reward rose, but the "
                                     f"rise is not the task's (reward components): {components.finding}", evidence,
                       components.advice)
    if reward is not None and reward.moved(0.05) > 0:
        return Verdict(name, "ok", f"entropy fell {ent.first:.3f} -> {ent.last:.3f} while the reward rose "
                                   f"{reward.first:.3f} -> {reward.last:.3f}: confidence from learning, not collapse",
                       evidence)
    if signal is not None:
        evidence.append(f"groups without signal: {signal}")
    collapsed = signal is not None and signal.last >= 0.5
    return Verdict(
        name, "fail" if collapsed else "warn",
        f"entropy collapsed {ent.first:.3f} -> {ent.last:.3f} with the reward flat"
        + (f" and {signal.last:.0%} of groups without signal" if collapsed else ""), evidence,
        "raise rollout.temperature, add an entropy bonus (algorithm.entropy_coef, or algorithm.use_adaptive_entropy "
        "with algorithm.entropy_target near the first steps' entropy) or clip higher (algorithm.epsilon_high); resume "
        "from a checkpoint before the fall")


def check_length(records: list[dict]) -> Verdict:
    name = "completion length"
    length, clipped = windows(records, "completions/mean_length"), windows(records, "completions/clipped_ratio")
    if length is None:
        return Verdict(name, "skip", "no completion lengths logged")
    evidence = [f"mean length (tokens): {length}"] + ([f"truncated share: {clipped}"] if clipped else [])
    advice = ("raise rollout.max_completion_length, or mask truncated completions "
              "(algorithm.mask_truncated_completions); a length reward or loss_type dr_grpo against drift")
    if clipped is not None and clipped.last >= 0.9:
        return Verdict(name, "fail", f"{clipped.last:.0%} of completions are cut at the limit: rewards score cut "
                                     "answers", evidence, advice)
    drift = length.last / max(length.first, 1e-9)
    if clipped is not None and clipped.last >= 0.5 and clipped.moved(0.2) > 0:
        return Verdict(name, "warn", f"the truncated share rose to {clipped.last:.0%}", evidence, advice)
    if drift >= 2 or drift <= 0.5:
        return Verdict(name, "warn", f"mean length drifted {drift:.1f}x", evidence, advice)
    return Verdict(name, "ok", f"mean length {length.first:.1f} -> {length.last:.1f} tokens"
                               + (f", truncated {clipped.first:.0%} -> {clipped.last:.0%}" if clipped else ""), evidence)


def group_outcomes(groups: dict[int, list[list[dict]]], steps: list[int]) -> dict[str, float]:
    """Over `steps`: shares of groups without signal whose rewards all sit at the run's top or bottom, and of
    groups whose completions are all the same text (and of those, solved)."""
    rewards = [r.get("reward") for gs in groups.values() for g in gs for r in g if isinstance(r.get("reward"), (int, float))]
    if not rewards:
        return {}
    top, bottom = max(rewards), min(rewards)
    counts = defaultdict(int)
    for s in steps:
        for g in groups.get(s, []):
            values = [r.get("reward") for r in g]
            counts["groups"] += 1
            if len(set(values)) == 1 and len(g) > 1:
                counts["top" if values[0] == top else "bottom" if values[0] == bottom else "middle"] += 1
            if len(g) > 1 and len({r.get("completion") for r in g}) == 1:
                counts["identical"] += 1
                counts["identical_solved"] += values[0] == top
    n = counts["groups"] or 1
    return {k: counts[k] / n for k in ("top", "bottom", "middle", "identical")} | {
        "identical_solved": counts["identical_solved"] / max(counts["identical"], 1), "groups": counts["groups"]}


def check_signal(records: list[dict], groups: dict[int, list[list[dict]]]) -> tuple[Verdict, Optional[Windows]]:
    name = "groups without signal"
    sig = windows(records, "frac_reward_zero_std")
    if sig is None:
        return Verdict(name, "skip", "no frac_reward_zero_std logged"), None
    evidence = [f"share of groups whose completions all scored the same: {sig}"]
    steps = [int(s) for s in series(records, "frac_reward_zero_std")[0]][-reward_window(len(records)):]
    out = group_outcomes(groups, steps)
    if out:
        evidence.append(f"last window ({len(steps)} steps, {out['groups']} groups): {out['top']:.0%} all at the run's "
                        f"top reward, {out['bottom']:.0%} all at its bottom, {out['middle']:.0%} all at one value between")
    if sig.last < 0.5:
        return Verdict(name, "ok", f"{sig.last:.0%} of groups without signal in the last steps", evidence), sig
    silent = out["top"] + out["bottom"] + out["middle"] if out else 0.0
    if out and out["top"] > max(out["bottom"], out["middle"]):
        return Verdict(name, "ok" if sig.last < 0.8 else "warn",
                       f"{sig.last:.0%} of groups without signal, mostly solved: the task is saturating", evidence,
                       "" if sig.last < 0.8 else "harder problems, or algorithm.dynamic_sampling to train on groups "
                       "with signal"), sig
    if out and out["middle"] >= out["bottom"] and silent:
        return Verdict(name, "fail" if sig.last >= 0.8 else "warn",
                       f"{sig.last:.0%} of groups without signal, most at one score below the top: every completion "
                       "earns the same partial reward", evidence,
                       "a reward that pays for something the policy now always does (a format, a length) and not for "
                       "the answer: see the reward components"), sig
    return Verdict(name, "fail" if sig.last >= 0.8 else "warn",
                   f"{sig.last:.0%} of groups without signal" + (", mostly failed" if out else ""), evidence,
                   "the task is too hard for the model or a reward never pays: check the rewards on known answers; "
                   "easier problems, a larger G, or algorithm.dynamic_sampling"), sig


def check_ranges(records: list[dict]) -> Verdict:
    name = "clipping, importance ratios, KL"
    problems, evidence = [], []
    limits = [("clip_ratio/region_mean", "clipped share of tokens", lambda v: v > 0.2),
              ("sampling/importance_sampling_ratio/min", "smallest importance ratio", lambda v: v < 0.1),
              ("sampling/importance_sampling_ratio/max", "largest importance ratio", lambda v: v > 10),
              ("sampling/sampling_logp_difference/mean", "sampler vs trainer log-prob difference", lambda v: v > 0.1),
              ("kl", "KL to the reference", lambda v: v > 1.0)]
    for key, what, bad in limits:
        w = windows(records, key)
        if w is None:
            continue
        evidence.append(f"{key}: {w}")
        if bad(w.last):
            problems.append(f"{what} {w.last:.3g} in the last steps")
    if not evidence:
        return Verdict(name, "skip", "none of these metrics logged")
    if not problems:
        return Verdict(name, "ok", "within range", evidence)
    return Verdict(name, "warn", "; ".join(problems), evidence,
                   "a lower learning rate; for importance ratios, check the sampler's weights sync "
                   "(sync/bytes) and rollout.importance_sampling; for KL, a larger algorithm.beta")


def check_nonfinite(records: list[dict]) -> Verdict:
    """The updates the trainer skipped for a NaN or infinite loss or gradient (grpo_cli/trainer/nonfinite.py): a
    fact of single steps, judged however short the run."""
    name = "non-finite updates"
    logged = [r for r in records if isinstance(r.get(NONFINITE), (int, float))]
    if not logged:
        return Verdict(name, "skip", f"no {NONFINITE} logged (a run of an older grpo)")
    skipped = [(r["step"], r[NONFINITE]) for r in logged if r[NONFINITE]]
    if not skipped:
        return Verdict(name, "ok", f"every update of {len(logged)} steps had a finite loss and gradient")
    return Verdict(name, "fail", f"non-finite loss or gradient at {len(skipped)} step(s): their updates were skipped",
                   [f"{NONFINITE} at {spans([s for s, _ in skipped])}: {sum(n for _, n in skipped):g} optimizer steps "
                    "skipped (the warnings in the run's log name the loss or the parameter)"],
                   "a lower train.learning_rate; keep train.max_grad_norm set; with algorithm.scale_rewards none the "
                   "rewards' scale is the advantages'")


def spans(steps: list[int]) -> str:
    """[2, 3, 4, 9] -> 'steps 2-4, step 9'."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(step_span(r[0], r[-1]) for r in runs)


def check_identical(records: list[dict], groups: dict[int, list[list[dict]]]) -> Verdict:
    name = "identical completions in a group"
    if not groups:
        return Verdict(name, "skip", "no rollouts.jsonl (logging.rollouts)")
    steps = sorted(groups)
    w = reward_window(len(steps))
    first, last = group_outcomes(groups, steps[:w]), group_outcomes(groups, steps[-w:])
    evidence = [f"groups whose G completions are one text: {first['identical']:.0%} ({step_span(steps[0], steps[w - 1])})"
                f" -> {last['identical']:.0%} ({step_span(steps[-w], steps[-1])}), {last['identical_solved']:.0%} of "
                "the last ones solved"]
    if last["identical"] < 0.25:
        return Verdict(name, "ok", f"{last['identical']:.0%} of groups identical in the last steps", evidence)
    if last["identical_solved"] >= 0.9:
        return Verdict(name, "ok", f"{last['identical']:.0%} of groups give one answer, and it is right: converged",
                       evidence)
    return Verdict(name, "fail" if last["identical"] >= 0.5 else "warn",
                   f"mode collapse: {last['identical']:.0%} of groups are one completion repeated, "
                   f"{1 - last['identical_solved']:.0%} of those not solved", evidence,
                   "raise rollout.temperature or algorithm.epsilon_high; resume from a checkpoint before it set in")


MIN_STEPS = 8  # a first and a last window of 2 steps each, apart: fewer, and a verdict would rest on single steps
WINDOW_CHECKS = ("reward vs eval accuracy", "reward components", "entropy", "completion length",
                 "groups without signal", "clipping, importance ratios, KL", "identical completions in a group")


def audit(run_dir: Path) -> list[Verdict]:
    """Every check on the run folder, worst first. Under MIN_STEPS steps the checks that compare the first and the
    last steps say the run is too short to judge; what single steps show (non-finite updates, a reward that never
    paid) is still judged."""
    records = load_run_records(run_dir)
    if len(records) < MIN_STEPS:
        short = f"too short to judge: {len(records)} step(s) logged; the first and last steps compared need {MIN_STEPS}"
        verdicts = [Verdict(check, "skip", short) for check in WINDOW_CHECKS]
        if never_paid(records):
            verdicts[1] = check_components(records)
        return worst_first([*verdicts, check_nonfinite(records)])
    groups = read_groups(run_dir)
    reward = windows(records, "reward")
    signal_verdict, signal = check_signal(records, groups)
    components = check_components(records)
    verdicts = [check_reward_vs_eval(records), components, check_entropy(records, reward, signal, components),
                check_length(records), signal_verdict, check_ranges(records), check_identical(records, groups),
                check_nonfinite(records)]
    return worst_first(verdicts)


def audit_text(verdicts: list[Verdict], run_dir: Path, steps: int) -> str:
    return verdicts_text(f"audit of {run_dir} ({steps} steps)", verdicts)


def headline(verdicts: list[Verdict], label: str | None, run_dir: Path) -> str:
    """`grpo report`'s lines about the audit: each warning and failure in one line, and where the evidence is."""
    bad = [v for v in verdicts if v.severity in ("warn", "fail")]
    who = f"{label}: " if label else ""
    if not bad:
        return f"audit: {who}no problem found"
    lines = [f"audit: {who}{v.severity.upper()} {v.check}: {v.finding}" for v in bad]
    return "\n".join(lines + [f"audit: the evidence and what to try: grpo audit {run_dir}"])
