"""What a step reports: the console's step line, and the peak memory of this process."""

import subprocess
import sys

from grpo_cli.train.reporting import format_step_line


def test_step_line_shows_rewards_and_eval():
    line = format_step_line(3, 10, {"reward": 0.5, "rewards/accuracy/mean": 0.25, "eval/accuracy": 0.75, "time/step": 2.0})
    assert line == "step 3/10 | reward 0.500 | s/step 2.0 | eval acc 0.750 | accuracy 0.250"


def test_peak_memory_is_this_process_not_the_one_that_launched_it():
    """Linux's ru_maxrss keeps the launcher's peak across fork and exec: a run started from a 1 GiB process (a
    pytest worker, a notebook) reported at least 1 GiB however small it was. memory/peak_gib is the process's own."""
    held = bytearray(1 << 30)
    held[::4096] = b"\1" * len(held[::4096])  # touched: resident
    code = ("import torch; from grpo_cli.run.memory import peak_memory_gib; "
            "x = torch.ones(64 * 2**20, dtype=torch.uint8); print(peak_memory_gib(torch.device('cpu')))")
    own = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    del held
    assert 0.06 < own < 0.9  # torch and a 64 MiB tensor, not the 1 GiB held here
