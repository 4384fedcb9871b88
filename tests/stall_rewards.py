"""Rewards that hold a run. For the watchdog tests, `sleeps_forever` answers its first calls, then never returns
on the call GRPO_TEST_STALL_CALL (1-based; one call per step in these runs) of the process whose RANK is
GRPO_TEST_STALL_RANK (any process when unset); with GRPO_TEST_STALL_CALL unset it never sleeps. For the run-folder
lock test, `waits_at_gate` holds a run while a file exists."""

import os
import time

_calls = 0


def sleeps_forever(completions: list[str], **_) -> list[float]:
    global _calls
    _calls += 1
    stall_call = os.environ.get("GRPO_TEST_STALL_CALL")
    rank = os.environ.get("GRPO_TEST_STALL_RANK")
    if stall_call is not None and _calls == int(stall_call) and rank in (None, os.environ.get("RANK", "0")):
        while True:
            time.sleep(3600)
    return [float(len(c) % 3) for c in completions]


def waits_at_gate(completions: list[str], **_) -> list[float]:
    """Holds the run while the file GRPO_TEST_GATE names exists (touching `<gate>.reached` first): a trainer that
    keeps its run folder busy until the test opens the gate, however fast the machine."""
    gate = os.environ.get("GRPO_TEST_GATE")
    if gate and os.path.exists(gate):
        open(gate + ".reached", "w").close()
        while os.path.exists(gate):
            time.sleep(0.05)
    return [float(len(c) % 3) for c in completions]
