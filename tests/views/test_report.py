"""`grpo report`: every plotted line equals the numbers in metrics.jsonl; the summary equals hand arithmetic."""

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.errors import ReportError
from grpo_cli.views.report import candidate_panels, plot_panel, select_panels, write_report
from grpo_cli.views.run_metrics import (
    Run,
    load_metrics,
    load_runs,
    moving_average,
    present_keys,
    run_labels,
    series,
    stack_layers,
    summary,
)

import helpers

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# run A: 14 training steps; reward null at step 3 and absent at step 7; no kl (beta = 0);
# eval-only records at steps 7 and 14, maj@4 only at 14; time/step 17 at step 2, null at step 9
REWARD = {1: 0.0, 2: 0.5, 3: None, 4: 1.0, 5: 0.25, 6: 0.75, 8: 0.5, 9: 1.0, 10: 0.0, 11: 1.0, 12: 1.5,
          13: 0.25, 14: 0.5}
REWARD_STEPS = [1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14]
REWARD_VALUES = [0.0, 0.5, 1.0, 0.25, 0.75, 0.5, 1.0, 0.0, 1.0, 1.5, 0.25, 0.5]
EVAL = [{"step": 7, "eval/accuracy": 0.25, "eval/pass@4": 0.5},
        {"step": 14, "eval/accuracy": 0.5, "eval/pass@4": 0.75, "eval/maj@4": 0.5}]


def train_record(step: int) -> dict:
    rec = {"step": step, "rewards/accuracy/mean": step / 16, "rewards/accuracy/std": 0.25,
           "rewards/fmt/mean": 1.0 - step / 32, "entropy": None if step == 5 else 3.0 - step / 8,
           "completions/mean_length": 10.0 + step, "completions/max_length": 16.0, "completions/clipped_ratio": 0.5,
           "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": step / 64, "clip_ratio/region_mean": step / 64,
           "grad_norm": 1.5, "learning_rate": 1e-5, "time/generate": 2.0, "time/score": 0.5,
           "time/train": 14.5 if step == 2 else 1.0, "time/step": {2: 17.0, 9: None}.get(step, 4.0)}
    if step in REWARD:
        rec["reward"] = REWARD[step]
    return rec


def records_a() -> list[dict]:
    recs = [train_record(s) for s in range(1, 15)]
    return recs[:7] + [EVAL[0]] + recs[7:] + [EVAL[1]]


def records_b() -> list[dict]:
    return [{"step": s, "reward": r, "kl": kl, "entropy": e, "time/generate": 1.0, "time/score": 0.25,
             "time/train": 2.0, "time/step": 3.25} for s, r, kl, e in
            ((1, 0.5, 0.0, 2.5), (2, 0.5, 0.01, 2.25), (3, 1.0, 0.02, 2.0))]


def write_run(folder: Path, records: list[dict], recipe_name: str = "toy", tail: str = "") -> Path:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    (folder / "recipe.yaml").write_text(f"name: {recipe_name}\nmodel:\n  name_or_path: builtin:tiny-qwen2\n")
    return folder


def lines_by_label(ax) -> dict[str, tuple[list, list]]:
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.get_lines()}


def panel(name: str, runs: list[Run]):
    keys = present_keys(runs)
    kept, _ = select_panels(candidate_panels(keys), keys)
    return next(p for p in kept if p.name == name)


# ------------------------------------------------------------------------------------------ data


def test_load_metrics_skips_a_cut_last_line_but_not_a_bad_middle_line(tmp_path):
    run = write_run(tmp_path / "run", records_a(), tail='{"step": 15, "rew')
    records = load_metrics(run / "metrics.jsonl")
    assert len(records) == 16 and records[-1] == EVAL[1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "reward": 0.5}\n{"step": 2, \n{"step": 3, "reward": 1.0}\n')
    with pytest.raises(ReportError, match="line 2"):
        load_metrics(bad)


def test_series_drops_missing_and_null_values():
    recs = records_a()
    assert series(recs, "reward") == (REWARD_STEPS, REWARD_VALUES)
    assert series(recs, "eval/accuracy") == ([7, 14], [0.25, 0.5])
    assert series(recs, "eval/maj@4") == ([14], [0.5])
    assert series(recs, "entropy")[0] == [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    assert series(recs, "kl") == ([], [])


def test_summary_matches_hand_arithmetic():
    s = summary(records_a())
    assert s["steps"] == 14
    # 12 rewards: windows of 12 // 4 = 3 steps. First: (0 + .5 + 1) / 3 at steps 1, 2, 4; last: (1.5 + .25 + .5) / 3
    # at steps 12-14; best: (1 + 1.5 + .25) / 3 = 0.9167 at steps 11-13 (no other window of three comes near)
    assert (s["start_reward"].mean, s["start_reward"].first_step, s["start_reward"].last_step) == (0.5, 1, 4)
    assert (s["end_reward"].mean, s["end_reward"].first_step, s["end_reward"].last_step) == (0.75, 12, 14)
    best = s["best_reward"]
    assert best.mean == pytest.approx(2.75 / 3) and (best.first_step, best.last_step) == (11, 13)
    assert str(best) == "0.9167 (steps 11-13)"
    assert s["last_eval_accuracy"] == 0.5
    # 13 step times (step 9 is null): 12 * 4.0 + 17.0 = 65.0, mean 65 / 13 = 5.0
    assert s["total_time_s"] == pytest.approx(65.0) and s["mean_step_time_s"] == pytest.approx(5.0)
    assert summary([{"step": 3, "eval/accuracy": 0.5}])["start_reward"] is None
    # one reward: its own window, one step
    assert str(summary([{"step": 3, "reward": 1.0}])["best_reward"]) == "1 (step 3)"


def test_moving_average_is_the_mean_of_full_windows_at_their_last_step():
    assert moving_average([1, 2, 4, 5, 6], [0.0, 0.5, 1.0, 0.25, 0.75], 3) == ([4, 5, 6], [0.5, 1.75 / 3, 2.0 / 3])
    assert moving_average([1, 2], [1.0, 0.0], 3) == ([], [])


def test_stack_layers_add_the_rest_of_the_step_as_other():
    steps, layers = stack_layers(records_a())
    assert steps == list(range(1, 15))  # eval-only records hold no times
    assert list(layers) == ["generate", "score", "train", "other"]
    assert layers["train"][:3] == [1.0, 14.5, 1.0]
    # 4.0 - (2 + 0.5 + 1) = 0.5; step 2: 17 - 17 = 0; step 9: no time/step, nothing to add
    assert layers["other"][:3] == [0.5, 0.0, 0.5] and layers["other"][8] == 0.0


def test_run_labels_fall_back_to_recipe_names_then_parents():
    assert run_labels([Path("/r/a"), Path("/r/b")], ["x", "x"]) == ["a", "b"]
    assert run_labels([Path("/1/run"), Path("/2/run")], ["alpha", "beta"]) == ["alpha", "beta"]
    assert run_labels([Path("/1/run"), Path("/2/run")], ["x", "x"]) == ["1/run", "2/run"]
    assert run_labels([Path("/1/run"), Path("/1/run")], [None, None]) == ["1/run (1)", "1/run (2)"]


def test_panels_without_data_are_skipped_and_named():
    run = Run("a", Path("a"), records_a())
    keys = present_keys([run])
    kept, skipped = select_panels(candidate_panels(keys), keys)
    assert [p.name for p in skipped] == ["kl"]
    assert [p.name for p in kept] == ["reward", "reward_fn_accuracy", "reward_fn_fmt", "entropy", "clip_ratio",
                                      "completion_length", "grad_norm", "learning_rate", "step_time"]
    assert kept[0].axes[0].keys == ("reward", "rewards/accuracy/mean", "rewards/fmt/mean",
                                    "eval/accuracy", "eval/pass@4", "eval/maj@4")


# -------------------------------------------------------------------------------------- plotting


def test_plotted_lines_equal_the_jsonl_numbers():
    runs = [Run("a", Path("a"), records_a())]
    lines = lines_by_label(plot_panel(panel("reward", runs), runs).axes[0])
    assert lines["reward (weighted sum)"] == (REWARD_STEPS, REWARD_VALUES)
    assert lines["accuracy"] == (list(range(1, 15)), [s / 16 for s in range(1, 15)])
    assert lines["eval accuracy"] == ([7, 14], [0.25, 0.5])
    assert lines["eval pass@4"] == ([7, 14], [0.5, 0.75])
    assert lines["eval maj@4"] == ([14], [0.5])
    # the per-step train series carry their moving average over 12 // 4 = 3 steps; eval series do not
    avg_steps, avg = moving_average(REWARD_STEPS, REWARD_VALUES, 3)
    assert lines["reward (weighted sum), mean of 3 steps"] == (avg_steps, avg) and avg_steps[0] == 4
    assert lines["accuracy, mean of 3 steps"][1][0] == pytest.approx((1 + 2 + 3) / 16 / 3)
    assert "fmt, mean of 3 steps" in lines and len(lines) == 9
    fn = lines_by_label(plot_panel(panel("reward_fn_accuracy", runs), runs).axes[0])
    assert fn["train mean, mean of 3 steps"][0] == list(range(3, 15))

    entropy = lines_by_label(plot_panel(panel("entropy", runs), runs).axes[0])
    steps = [s for s in range(1, 15) if s != 5]  # null at step 5
    assert entropy == {"entropy": (steps, [3.0 - s / 8 for s in steps])}

    top, bottom = plot_panel(panel("completion_length", runs), runs).axes
    assert lines_by_label(top)["mean"] == (list(range(1, 15)), [10.0 + s for s in range(1, 15)])
    assert lines_by_label(bottom) == {"clipped at max length": (list(range(1, 15)), [0.5] * 14)}
    assert bottom.get_xlabel() == "step" and top.get_ylabel() == "tokens"


def test_step_time_stack_tops_out_at_the_step_time():
    runs = [Run("a", Path("a"), records_a())]
    ax = plot_panel(panel("step_time", runs), runs).axes[0]
    assert [c.get_label() for c in ax.collections] == ["generate", "score", "train", "other"]
    # the top layer's upper edge is generate + score + train + other = time/step; highest at step 2
    assert ax.collections[-1].get_paths()[0].vertices[:, 1].max() == pytest.approx(17.0)
    total_steps = [s for s in range(1, 15) if s != 9]
    assert lines_by_label(ax)["total (time/step)"] == (total_steps, [17.0 if s == 2 else 4.0 for s in total_steps])


def test_two_runs_overlay_with_one_labelled_line_each(tmp_path):
    a = write_run(tmp_path / "1" / "run", records_a(), recipe_name="alpha")
    b = write_run(tmp_path / "2" / "run", records_b(), recipe_name="beta")
    runs = load_runs([a, b])  # the folder names collide: labels are the recipe names
    assert [r.label for r in runs] == ["alpha", "beta"]

    entropy = lines_by_label(plot_panel(panel("entropy", runs), runs).axes[0])
    assert set(entropy) == {"alpha", "beta"}
    assert entropy["beta"] == ([1, 2, 3], [2.5, 2.25, 2.0])
    assert entropy["alpha"][0] == [s for s in range(1, 15) if s != 5]
    assert lines_by_label(plot_panel(panel("kl", runs), runs).axes[0]) == {"beta": ([1, 2, 3], [0.0, 0.01, 0.02])}

    reward = lines_by_label(plot_panel(panel("reward", runs), runs).axes[0])
    assert reward["alpha: reward (weighted sum)"] == (REWARD_STEPS, REWARD_VALUES)
    assert reward["beta: reward (weighted sum)"] == ([1, 2, 3], [0.5, 0.5, 1.0])
    # 6 series of alpha and the averages of its 3 train series; only the weighted reward for beta (3 steps: too
    # short for an average)
    assert len(reward) == 10 and "alpha: reward (weighted sum), mean of 3 steps" in reward
    assert len(plot_panel(panel("step_time", runs), runs).axes) == 2  # one stacked subplot per run


def test_a_metric_at_0_every_step_is_drawn_centred_and_says_so():
    runs = [Run("b", Path("b"), [dict(r, kl=0.0) for r in records_b()])]
    ax = plot_panel(panel("kl", runs), runs).axes[0]
    assert lines_by_label(ax) == {"kl": ([1, 2, 3], [0.0, 0.0, 0.0])}
    assert ax.get_ylim() == (-1.0, 1.0)  # not a line on the plot's lower edge
    assert [t.get_text() for t in ax.texts] == ["0 at every step"]
    # a panel with a value other than 0 draws as before
    runs = [Run("b", Path("b"), records_b())]
    ax = plot_panel(panel("kl", runs), runs).axes[0]
    assert len(ax.texts) == 0 and ax.get_ylim() != (-1.0, 1.0)


def test_resumes_are_marked_on_every_plot(tmp_path):
    run = write_run(tmp_path / "run", records_a())
    (run / "resumes.jsonl").write_text('{"from_step": 6, "checkpoint": "c/step-5"}\n'
                                       '{"from_step": 11, "checkpoint": "c/step-10", "recipe_changes": []}\n')
    runs = load_runs([run])
    assert runs[0].resumes == (6, 11)
    for name in ("reward", "entropy", "step_time"):
        ax = plot_panel(panel(name, runs), runs).axes[0]
        marks = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":" and ln.get_color() == "0.45"]
        assert [list(m.get_xdata()) for m in marks] == [[5.5, 5.5], [10.5, 10.5]], name
        assert [m.get_label() for m in marks] == ["resumed", "_nolegend_"]


# ---------------------------------------------------------------------------------------- output


def test_html_embeds_one_png_per_panel_and_the_summary(tmp_path):
    runs = load_runs([write_run(tmp_path / "run", records_a())])
    files, skipped, _ = write_report(runs, tmp_path / "out")
    pngs = sorted(p for p in files if p.suffix == ".png")
    assert len(pngs) == 9 and [p.name for p in skipped] == ["kl"]
    page = (tmp_path / "out" / "report.html").read_text()
    uris = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page.replace("'", '"'))
    assert len(uris) == 9
    assert {base64.b64decode(u) for u in uris} == {p.read_bytes() for p in pngs}
    for p in pngs:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, p.name
    cells = re.findall(r"<td>([^<]*)</td>", page)
    assert cells == ["run", "14", "0.5 (steps 1-4)", "0.75 (steps 12-14)", "0.9167 (steps 11-13)", "0.5", "65.0 s",
                     "5.0 s"]
    assert "KL divergence" in page and "(kl)" in page  # the skipped panel is named


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return helpers.cli(*args, cwd=cwd)


@pytest.mark.parametrize("case, message", [("missing", "no such run folder"), ("no_metrics", "has no metrics.jsonl"),
                                           ("empty", "holds no step records")])
def test_bad_run_folders_exit_2_with_a_message(tmp_path, case, message):
    run = tmp_path / "run"
    if case != "missing":
        run.mkdir()
    if case == "empty":
        (run / "metrics.jsonl").write_text("")
    p = cli("report", str(run))
    assert p.returncode == 2, p.stderr
    assert message in p.stderr and p.stderr.startswith("error:") and "Traceback" not in p.stderr


def test_report_module_imports_neither_torch_nor_matplotlib():
    code = "import sys, grpo_cli.views.report; print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.stdout.strip() == "[]", p.stderr


@pytest.mark.slow
def test_report_of_a_real_tiny_run(tmp_path):
    run = tmp_path / "tiny"
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(run), "train.max_steps=2", "checkpoint.every_steps=100")
    assert p.returncode == 0, p.stderr[-2000:]
    assert not (run / "resumes.jsonl").exists()
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(run), "--resume", "auto", "train.max_steps=3",
            "checkpoint.every_steps=100")
    assert p.returncode == 0, p.stderr[-2000:]
    [resume] = [json.loads(line) for line in (run / "resumes.jsonl").read_text().splitlines()]
    assert resume["from_step"] == 3 and resume["checkpoint"].endswith("step-2")
    assert resume["recipe_changes"] == ["train.max_steps"]
    assert load_runs([run])[0].resumes == (3,)
    p = cli("report", str(run), "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out"
    # ci-tiny logs two reward functions, no kl (beta = 0)
    for name in ("reward", "reward_fn_accuracy", "reward_fn_digit_fraction", "step_time"):
        assert (out / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
    assert "not plotted" in p.stdout and "(kl)" in p.stdout
    assert re.search(r"^tiny\s+3\s", p.stdout, re.M), p.stdout
    # reward, 2 reward functions, entropy, clip ratio, length, grad norm, lr, step time
    assert len(list(out.glob("*.png"))) == 9
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 9
