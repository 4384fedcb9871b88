"""Freed host memory kept for reuse (grpo_cli/process/allocator.py, train.keep_freed_memory): a freed block below 32
MiB stays resident for the next one instead of going back to the kernel, a larger one still goes back; `auto` only
where the policy trains on a CPU in `grpo train`'s own process, never over an allocator the user chose. Each case runs
in a new interpreter: the setting is the process's for good."""

import ast
import os
import platform
import subprocess
import sys

import pytest

from grpo_cli.process.allocator import USER_SETTINGS
from helpers import ROOT

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc")


def after(setting, device: str, own_process: bool, env: dict | None = None) -> tuple[str | None, float, float]:
    """-> (keep_freed_memory's words, MiB of a freed 24 MiB block still resident, of a freed 64 MiB block) in a new
    process that applied the setting first."""
    code = ("import sys; sys.path.insert(0, 'tests'); from helpers import kept_after_free; "
            "from grpo_cli.process.allocator import keep_freed_memory; "
            f"print(repr(keep_freed_memory({setting!r}, {device!r}, {own_process!r}))); "
            "print(kept_after_free(24)); print(kept_after_free(64))")
    untuned = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}  # whatever this machine has set
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**untuned, **(env or {})})
    assert p.returncode == 0, p.stderr[-2000:]
    words, small, large = p.stdout.splitlines()[-3:]
    return ast.literal_eval(words), float(small), float(large)


def test_a_cpu_run_of_its_own_keeps_freed_blocks_up_to_32_mib():
    words, small, large = after("auto", "cpu", True)
    assert words == "freed memory kept for reuse (train.keep_freed_memory)"
    assert small > 20, small  # the 24 MiB block's pages wait for the next block
    assert large < 4, large  # above 32 MiB a block has its own mapping, returned when freed: what stays is bounded


@pytest.mark.parametrize("case", ["off", "gpu", "python program", "user's allocator"])
def test_glibc_keeps_its_defaults_where_auto_or_false_says_so(case):
    setting, device, own, env = {"off": (False, "cpu", True, None), "gpu": ("auto", "cuda", True, None),
                                 "python program": ("auto", "cpu", False, None),
                                 "user's allocator": ("auto", "cpu", True, {"MALLOC_ARENA_MAX": "2"})}[case]
    words, small, large = after(setting, device, own, env)
    assert words is None
    assert small < 4 and large < 4, (small, large)  # glibc's default: a first block this large goes straight back


def test_true_keeps_freed_memory_on_a_gpu_and_in_a_python_program():
    words, small, _ = after(True, "cuda", False)
    assert words is not None and small > 20, small
