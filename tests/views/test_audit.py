"""`grpo audit`: run folders planted with each pathology, a real run with a reward a tiny model can game, and the
quickstart's real run (tests/fixtures/quickstart-run: its metrics and rollouts, the prompts left out)."""

import json
import math
import random
from pathlib import Path

import pytest

from grpo_cli.views.audit import audit
from grpo_cli.views.verdicts import exit_code

from helpers import ROOT, cli

QUICKSTART = ROOT / "tests/fixtures/quickstart-run"


def write_run(folder: Path, steps: int = 40, groups: list | None = None, **columns) -> Path:
    """A run folder: metrics.jsonl with `columns` (name -> f(step) or constant), and rollouts.jsonl from `groups`
    (f(step) -> per group, a list of (completion, reward))."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    base = {"reward": lambda s: 0.4 + 0.01 * s + rng.uniform(-0.05, 0.05), "entropy": lambda s: 1.0 - 0.01 * s,
            "completions/mean_length": 50.0, "completions/clipped_ratio": 0.05, "frac_reward_zero_std": 0.1,
            "clip_ratio/region_mean": 0.01, "grad_norm": 1.0, "nonfinite/skipped_updates": 0}
    base.update(columns)
    with open(folder / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            record = {"step": s}
            for k, v in base.items():
                value = v(s) if callable(v) else v
                if value is not None:
                    record[k] = value
            f.write(json.dumps(record) + "\n")
    if groups is not None:
        with open(folder / "rollouts.jsonl", "w") as f:
            for s in range(1, steps + 1):
                for g, rows in enumerate(groups(s)):
                    for k, (text, reward) in enumerate(rows):
                        f.write(json.dumps({"step": s, "group": g, "sample": k, "completion": text, "reward": reward}) + "\n")
    return folder


def by_check(folder: Path) -> dict:
    return {v.check: v for v in audit(folder)}


def test_a_healthy_run_passes_every_check(tmp_path):
    run = write_run(tmp_path / "ok", groups=lambda s: [[(f"answer {s} {k}", float(k % 2)) for k in range(4)]] * 2,
                    **{"rewards/accuracy/mean": lambda s: 0.3 + 0.01 * s, "rewards/format/mean": lambda s: 0.5 + 0.005 * s,
                       "eval/accuracy": lambda s: 0.3 + 0.005 * s if s % 10 == 0 else None,
                       "eval/num_problems": lambda s: 100 if s % 10 == 0 else None})
    verdicts = audit(run)
    assert {v.severity for v in verdicts} == {"ok"}, [(v.check, v.finding) for v in verdicts]
    assert exit_code(verdicts) == 0


def test_reward_rising_while_eval_falls_fails(tmp_path):
    evals = {10: 0.60, 20: 0.50, 30: 0.40, 40: 0.30}  # 200 problems each: every later eval far below the first
    run = write_run(tmp_path / "hack", **{"eval/accuracy": evals.get, "eval/num_problems": lambda s: 200 if s in evals else None,
                                          "reward": lambda s: 0.2 + 0.015 * s})
    v = by_check(run)["reward vs eval accuracy"]
    assert v.severity == "fail", v
    assert v.finding.startswith("eval accuracy fell 0.600 (step 10) -> 0.300 (step 40)") and "reward rose" in v.finding
    assert "step 10: 0.600, step 20: 0.500, step 30: 0.400, step 40: 0.300 (eval/accuracy, 200 problems)" in v.evidence
    # one eval after the best: a warning, not a verdict
    two = write_run(tmp_path / "two", **{"eval/accuracy": {10: 0.6, 40: 0.3}.get,
                                         "eval/num_problems": lambda s: 200 if s in (10, 40) else None,
                                         "reward": lambda s: 0.2 + 0.015 * s})
    assert by_check(two)["reward vs eval accuracy"].severity == "warn"
    # within noise (20 problems: a 0.1 fall is under two standard errors)
    noisy = write_run(tmp_path / "noisy", **{"eval/accuracy": {10: 0.6, 20: 0.55, 30: 0.5}.get,
                                             "eval/num_problems": lambda s: 20 if s in (10, 20, 30) else None})
    assert by_check(noisy)["reward vs eval accuracy"].severity == "ok"


def test_a_format_reward_rising_while_accuracy_stays_flat_is_flagged(tmp_path):
    rng = random.Random(1)
    run = write_run(tmp_path / "format", **{"rewards/accuracy/mean": lambda s: 0.2 + rng.uniform(-0.03, 0.03),
                                            "rewards/format/mean": lambda s: min(1.0, 0.1 + 0.03 * s)})
    v = by_check(run)["reward components"]
    assert v.severity == "warn" and v.finding.startswith("format rose while accuracy stayed flat"), v
    falling = write_run(tmp_path / "falling", **{"rewards/accuracy/mean": lambda s: 0.5 - 0.01 * s,
                                                 "rewards/format/mean": lambda s: 0.1 + 0.02 * s})
    assert by_check(falling)["reward components"].severity == "fail"
    both = write_run(tmp_path / "both", **{"rewards/accuracy/mean": lambda s: 0.1 + 0.01 * s,
                                           "rewards/format/mean": lambda s: 0.1 + 0.02 * s})
    assert by_check(both)["reward components"].severity == "ok"


def test_entropy_collapse_is_told_apart_from_learning(tmp_path):
    falling = {"entropy": lambda s: 1.0 * math.exp(-s / 5)}  # 1.0 -> ~0.0005 nats
    learning = write_run(tmp_path / "learning", **falling, reward=lambda s: 0.1 + 0.02 * s)
    v = by_check(learning)["entropy"]
    assert v.severity == "ok" and "confidence from learning, not collapse" in v.finding, v
    collapse = write_run(tmp_path / "collapse", **falling, reward=0.3, frac_reward_zero_std=lambda s: min(1.0, s / 20))
    v = by_check(collapse)["entropy"]
    assert v.severity == "fail" and v.finding.startswith("entropy collapsed") and "groups without signal" in v.finding, v


def test_length_drift_and_truncation(tmp_path):
    drift = write_run(tmp_path / "drift", **{"completions/mean_length": lambda s: 40 + 5 * s})
    v = by_check(drift)["completion length"]
    assert v.severity == "warn" and v.finding.startswith("mean length drifted"), v
    cut = write_run(tmp_path / "cut", **{"completions/clipped_ratio": lambda s: min(0.8, 0.02 * s)})
    assert by_check(cut)["completion length"].finding.startswith("the truncated share rose to")
    full = write_run(tmp_path / "full", **{"completions/clipped_ratio": 0.97})
    assert by_check(full)["completion length"].severity == "fail"


def test_groups_without_signal_solved_or_failed(tmp_path):
    def rows(value):
        return [(f"text {k}", value) for k in range(4)]

    mixed = [(f"text {k}", float(k % 2)) for k in range(4)]
    failed = write_run(tmp_path / "failed", frac_reward_zero_std=lambda s: 0.9 if s > 20 else 0.2,
                       groups=lambda s: [rows(0.0), rows(0.0)] if s > 20 else [mixed, rows(1.0)])
    v = by_check(failed)["groups without signal"]
    assert v.severity == "fail" and "mostly failed" in v.finding, v
    solved = write_run(tmp_path / "solved", frac_reward_zero_std=lambda s: 0.6 if s > 20 else 0.2,
                       groups=lambda s: [rows(1.0), mixed] if s > 20 else [mixed, rows(0.0)])
    v = by_check(solved)["groups without signal"]
    assert v.severity == "ok" and "mostly solved: the task is saturating" in v.finding, v


def test_ratios_and_kl_out_of_range(tmp_path):
    run = write_run(tmp_path / "ratios", **{"sampling/importance_sampling_ratio/min": lambda s: 0.5 if s < 20 else 0.02,
                                            "sampling/importance_sampling_ratio/max": 1.5, "kl": lambda s: 0.05 * s})
    v = by_check(run)["clipping, importance ratios, KL"]
    assert v.severity == "warn" and "smallest importance ratio" in v.finding and "KL to the reference" in v.finding, v
    # what the trainer writes for a step whose update it skipped (a NaN or infinite loss or gradient)
    nan = write_run(tmp_path / "nan", **{"nonfinite/skipped_updates": lambda s: 1 if s in (30, 31, 35) else 0})
    v = by_check(nan)["non-finite updates"]
    assert v.severity == "fail" and "non-finite loss or gradient at 3 step(s)" in v.finding, v
    assert "nonfinite/skipped_updates at steps 30-31, step 35: 3 optimizer steps skipped" in v.evidence[-1], v


def test_identical_completions_collapsed_or_converged(tmp_path):
    same = [("the same text", 0.0)] * 4
    right = [("42", 1.0)] * 4
    mixed = [(f"text {k}", float(k % 2)) for k in range(4)]
    collapsed = write_run(tmp_path / "collapsed", groups=lambda s: [same, same] if s > 25 else [mixed, mixed])
    v = by_check(collapsed)["identical completions in a group"]
    assert v.severity == "fail" and v.finding.startswith("mode collapse: 100% of groups"), v
    converged = write_run(tmp_path / "converged", groups=lambda s: [right, right] if s > 25 else [mixed, mixed])
    v = by_check(converged)["identical completions in a group"]
    assert v.severity == "ok" and "converged" in v.finding, v


def test_the_quickstart_run_learns_and_is_not_called_a_collapse():
    verdicts = by_check(QUICKSTART)
    entropy = verdicts["entropy"]  # 1.01 nats at step 1, 0.04 at step 37, while accuracy rose
    assert entropy.severity == "ok" and "confidence from learning, not collapse" in entropy.finding
    assert verdicts["groups without signal"].severity == "ok"
    assert "saturating" in verdicts["groups without signal"].finding
    assert verdicts["identical completions in a group"].severity == "ok"
    assert verdicts["completion length"].severity == "ok"
    # its eval fell from 0.750 (step 20) to 0.516 (step 40), 2.8 standard errors, the reward not rising since
    ev = verdicts["reward vs eval accuracy"]
    assert ev.severity == "warn" and "not a gamed reward" in ev.finding
    assert exit_code(list(verdicts.values())) == 1  # warnings, no failure


@pytest.mark.usefixtures("model_cache")
def test_a_real_run_gaming_its_format_reward_is_flagged_through_the_cli(tmp_path):
    # ci-tiny's digit_fraction pays for digits whatever the answer: at lr 2e-2 the tiny model learns to emit digits
    # and its entropy collapses (6.1 -> 0.001 nats; at 1e-2 it stopped anywhere from below 0.3 to 0.76, as the float
    # rounding of its first steps went, once every group paid the same and the updates stopped)
    run = tmp_path / "gamed"
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(run), "train.max_steps=60", "train.learning_rate=2e-2", "eval=null",
            "checkpoint.every_steps=0")
    assert p.returncode == 0, p.stderr[-3000:]
    p = cli("audit", str(run), "--json")
    out = json.loads(p.stdout)
    assert p.returncode == out["exit_code"] >= 1
    verdicts = {v["check"]: v for v in out["verdicts"]}
    components = verdicts["reward components"]
    assert components["severity"] in ("warn", "fail")
    assert components["finding"].startswith("digit_fraction rose while accuracy")
    assert any(e.startswith("digit_fraction: ") for e in components["evidence"])
    assert verdicts["entropy"]["severity"] == "warn" and "not the task's" in verdicts["entropy"]["finding"]
    text = cli("audit", str(run))
    assert text.returncode == p.returncode
    assert text.stdout.startswith(f"audit of {run} (60 steps): ")
    assert "reward components: digit_fraction rose while accuracy" in text.stdout and "try: " in text.stdout


def test_grpo_report_shows_the_verdicts_first(tmp_path):
    p = cli("report", str(QUICKSTART), "--out", str(tmp_path / "report"))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("audit: WARN reward vs eval accuracy: eval accuracy fell 0.750 (step 20) -> 0.516")
    assert lines[1] == f"audit: the evidence and what to try: grpo audit {QUICKSTART}"
    assert lines[2].startswith("run ")  # then the summary table
    page = (tmp_path / "report/report.html").read_text()
    assert page.index("<h2>Audit</h2>") < page.index("<h2>Summary</h2>")
    audit_table = page[page.index("<h2>Audit</h2>"):page.index("<h2>Summary</h2>")]
    assert audit_table.count("<tr class='warn'>") == 1 and "<tr class='fail'>" not in audit_table
    assert "confidence from learning, not collapse" in audit_table  # the ok verdicts too, greyed


def test_a_run_under_8_steps_is_too_short_to_judge_but_single_steps_still_count(tmp_path):
    # issue 35: verdicts on a 5-step run compared step 1 with step 5 (windows of one step)
    run = write_run(tmp_path / "short", steps=5, entropy=lambda s: 1.0 / s, reward=lambda s: 0.3,
                    **{"nonfinite/skipped_updates": lambda s: int(s == 4)})
    verdicts = by_check(run)
    windowed = [v for k, v in verdicts.items() if k != "non-finite updates"]
    assert len(windowed) == 7 and all(v.severity == "skip" and v.finding.startswith("too short to judge: 5 step(s)")
                                      for v in windowed), windowed
    assert verdicts["non-finite updates"].severity == "fail"  # a fact of one step, judged at any length


def test_a_reward_that_never_paid_is_flagged(tmp_path):
    # issue 35: `grpo audit` said "reward components: OK" for a reward at 0.000 every step (the report's plot saw it)
    for steps in (40, 5):
        run = write_run(tmp_path / f"zero{steps}", steps=steps, **{"rewards/accuracy/mean": 0.0,
                                                                   "rewards/format/mean": lambda s: 0.5 + 0.005 * s})
        v = by_check(run)["reward components"]
        assert v.severity == "warn" and v.finding.startswith(f"accuracy paid 0 at every step ({steps} steps)"), v
        assert "grpo doctor" in v.advice

