"""No silent hang (grpo_cli/process/watchdog.py): real processes that stall, real runs that stall in a reward, across two
processes, and against a server that stops answering."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grpo_cli.process import watchdog

from helpers import ROOT, cli, read_jsonl, stable

STALL = "rewards=[{name: 'tests/stall_rewards.py:sleeps_forever'}]"


def python(folder: Path, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`code` as a script file (its stack frames show their source lines), run in a fresh interpreter."""
    script = folder / "script.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_a_thread_stalled_in_a_phase_stops_the_process_with_its_stack(tmp_path):
    t0 = time.monotonic()
    p = python(tmp_path, f"""
        import threading, time
        from grpo_cli.process.watchdog import Watchdog, phase

        def idle_helper():  # outside every phase: never watched, however long it waits
            time.sleep(3600)

        def reward_that_hangs():
            time.sleep(3600)

        threading.Thread(target=idle_helper, name="idle-helper", daemon=True).start()
        dog = Watchdog({str(tmp_path)!r}, 1.0, poll_s=0.05)
        dog.step = 7
        with dog, phase("score"), phase("reward 'slow'"):
            reward_that_hangs()
        """)
    took = time.monotonic() - t0
    assert p.returncode == watchdog.EXIT_CODE == 1, p.stderr
    assert took < 30  # one second without progress, not an hour
    err = p.stderr.strip()
    assert err.startswith("error: stalled: process 0 of 1")
    assert re.search(r"no progress for [12] s in score > reward 'slow' \(step 7, thread MainThread\)", err)
    assert "no checkpoint was written before it" in err and "train.stall_timeout_s (1 s)" in err
    report = (tmp_path / "stalls/process-0.txt").read_text()
    assert re.match(r"grpo stall report: stalled: no progress for [12] s in score > reward 'slow'", report)
    main = report.split("--- thread MainThread: ")[1].split("--- thread")[0]
    assert main.startswith("in score > reward 'slow' for ")
    assert "in reward_that_hangs" in main and "time.sleep(3600)" in main
    idle = report.split("--- thread idle-helper (daemon): ")[1].split("--- thread")[0]
    assert idle.startswith("outside every phase") and "in idle_helper" in idle
    marker = json.loads((tmp_path / "stalls/stalled.json").read_text())
    assert marker["process"] == 0 and marker["phase"] == "score > reward 'slow'" and marker["step"] == 7


def test_progress_keeps_a_long_phase_alive_and_nothing_runs_while_disarmed(tmp_path):
    p = python(tmp_path, f"""
        import time
        from grpo_cli.process import watchdog
        from grpo_cli.process.watchdog import Watchdog, phase

        with Watchdog({str(tmp_path)!r}, 0.5, poll_s=0.05), phase("generate"):
            for _ in range(30):  # 3 s in one phase, a tick every 0.1 s
                time.sleep(0.1)
                watchdog.tick()
            with phase("score"):  # entering and leaving phases is progress too
                time.sleep(0.3)
        with phase("after"):  # disarmed: phases cost nothing and nothing watches
            time.sleep(1.0)
        print("finished")
        """)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "finished"
    assert not (tmp_path / "stalls").exists()


def test_work_the_thread_cannot_see_progresses_while_its_measure_moves(tmp_path):
    # progress_of: a file growing in another thread's hands (as inside safetensors) keeps the phase alive; once it
    # stops growing the phase stalls after the limit
    p = python(tmp_path, f"""
        import threading, time
        from pathlib import Path
        from grpo_cli.process.watchdog import Watchdog, folder_bytes, phase, progress_of

        out = Path({str(tmp_path)!r}) / "out"
        out.mkdir()

        def write(blocks):
            with open(out / "model.safetensors", "ab") as f:
                for _ in range(blocks):
                    f.write(b"x" * 1000)
                    f.flush()
                    time.sleep(0.05)

        with Watchdog({str(tmp_path)!r}, 0.5, poll_s=0.05), phase("checkpoint"), progress_of(lambda: folder_bytes(out)):
            write(40)  # 2 s, four times the limit, growing all along
            print("slow write lived", flush=True)
            write(4)
            time.sleep(30)  # the write stopped: a stall
        print("never")
        """)
    assert p.returncode == 1, p.stderr
    assert p.stdout.strip() == "slow write lived"
    assert "made no progress for" in p.stderr and "in checkpoint" in p.stderr


def test_an_earlier_runs_stall_files_do_not_stop_a_resumed_one(tmp_path):
    stalls = tmp_path / "stalls"
    stalls.mkdir()
    old = {"process": 1, "pid": 1, "host": "h", "phase": "score", "thread": "MainThread", "idle_s": 5, "step": 2,
           "time": time.time() - 3600}
    (stalls / "process-1.json").write_text(json.dumps(old))
    p = python(tmp_path, f"""
        import time
        from grpo_cli.process.watchdog import Watchdog, phase

        with Watchdog({str(tmp_path)!r}, 30, process=0, processes=2, poll_s=0.05), phase("generate"):
            time.sleep(1.0)  # process 1's report is an hour old: not this run's
        print("finished")
        """)
    assert p.returncode == 0, p.stderr
    assert json.loads((stalls / "process-1.json").read_text()) == old


def train(run_dir: Path, *overrides: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return cli("train", "recipes/ci-tiny.yaml", "-o", str(run_dir), STALL, "train.max_steps=3",
               "checkpoint.every_steps=1", "checkpoint.keep_last=null", "eval=null", *overrides, timeout=timeout,
               env={**os.environ, **(env or {})})


@pytest.mark.usefixtures("model_cache")
def test_a_reward_that_never_returns_stops_the_run_and_it_resumes_exactly(tmp_path):
    straight = tmp_path / "straight"
    p = train(straight)
    assert p.returncode == 0, p.stderr[-3000:]

    run = tmp_path / "stalled"
    t0 = time.monotonic()
    p = train(run, "train.stall_timeout_s=5", env={"GRPO_TEST_STALL_CALL": "2"})  # the reward hangs in step 2
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stderr[-3000:]
    assert took < 120
    err = p.stderr
    assert "error: stalled: process 0 of 1" in err
    assert re.search(r"made no progress for [5-9] s in score > reward 'sleeps_forever' \(step 2, thread MainThread\)",
                     err)
    assert "the last checkpoint (step-1) is intact: fix the cause and resume with --resume auto" in err
    report = (run / "stalls/process-0.txt").read_text()
    assert "stall_rewards.py" in report and "time.sleep(3600)" in report and "in sleeps_forever" in report
    assert sorted(c.name for c in (run / "checkpoints").iterdir()) == ["step-1"]
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [1]

    p = train(run, "--resume", "auto", "train.stall_timeout_s=5")  # the cause fixed: the same run as straight
    assert p.returncode == 0, p.stderr[-3000:]
    assert [stable(m) for m in read_jsonl(run / "metrics.jsonl")] == \
        [stable(m) for m in read_jsonl(straight / "metrics.jsonl")]


@pytest.mark.multiprocess
@pytest.mark.usefixtures("model_cache")
def test_one_process_stalling_before_a_collective_stops_both_with_every_stack(tmp_path):
    run = tmp_path / "two"
    p = cli("train", "recipes/ci-tiny.yaml", "-o", str(run), "--num-processes", "2", STALL, "train.max_steps=3",
            "train.prompts_per_step=3", "train.micro_batch_size=3", "checkpoint.every_steps=1", "eval=null",
            "train.stall_timeout_s=6", timeout=300,
            env={**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "GRPO_TEST_STALL_CALL": "2",
                 "GRPO_TEST_STALL_RANK": "1"})
    assert p.returncode != 0, p.stderr[-3000:]
    err = p.stderr
    assert "error: stalled: process 1 of 2" in err and "in score > reward 'sleeps_forever' (step 2" in err
    assert "every process's stacks are in" in err and "(none from" not in err
    assert "error: process 0 stopped: process 1 " in err
    marker = json.loads((run / "stalls/stalled.json").read_text())
    assert marker["process"] == 1 and marker["phase"] == "score > reward 'sleeps_forever'"
    one = (run / "stalls/process-1.txt").read_text()
    assert "in sleeps_forever" in one and "time.sleep(3600)" in one
    # process 0 scored its rows and waits for process 1's: stopped by process 1's report, or by its own limit first
    # (it may have entered the gather before process 1 entered the reward); never named as the cause
    zero = (run / "stalls/process-0.txt").read_text()
    assert "collective: gather" in zero.splitlines()[0]
    assert "--- thread MainThread: in collective: gather for" in zero and "in gather" in zero
    assert (run / "checkpoints/step-1").is_dir()


SLOW_SAVES = str(ROOT / "tests/crash")  # its sitecustomize.py writes safetensors files slowly (GRPO_TEST_SLOW_SAVE)


@pytest.mark.slow
@pytest.mark.usefixtures("model_cache")
def test_a_checkpoint_written_slower_than_the_limit_lives_and_one_whose_write_stops_is_a_stall(tmp_path):
    # 16 KiB every 0.08 s: each checkpoint (0.5 MB of weights, 1 MB of AdamW moments) takes ~8 s, past the 3 s
    # limit, its files growing all along (a slow network file system): the run must live
    args = ("train", "recipes/ci-tiny.yaml", "train.max_steps=1", "checkpoint.every_steps=1", "eval=null",
            "train.stall_timeout_s=3")
    slow = tmp_path / "slow"
    p = cli(*args, "-o", str(slow), env={**os.environ, "PYTHONPATH": SLOW_SAVES, "GRPO_TEST_SLOW_SAVE": "16384:0.08"})
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = slow / "checkpoints/step-1"
    took = (ckpt / "trainer/manifest.json").stat().st_mtime - (ckpt / "config.json").stat().st_mtime
    assert took > 2 * 3, took  # the save outlasted the limit twice over, and nothing called it a stall
    assert not (slow / "stalls").exists()

    # the same write stopping for good after 200 KB of a file: a stall named in the checkpoint phase
    stuck = tmp_path / "stuck"
    p = cli(*args, "-o", str(stuck), env={**os.environ, "PYTHONPATH": SLOW_SAVES,
                                          "GRPO_TEST_SLOW_SAVE": "16384:0.08:200000"})
    assert p.returncode == 1, p.stderr[-3000:]
    assert re.search(r"made no progress for [3-9] s in checkpoint \(step 1", p.stderr), p.stderr[-3000:]
    assert "no checkpoint was written before it" in p.stderr
    assert not [c for c in (stuck / "checkpoints").iterdir() if not c.name.startswith(".tmp-")]
