"""Rewards for the watchdog tests: `sleeps_forever` answers its first calls, then never returns on the call
GRPO_TEST_STALL_CALL (1-based; one call per step in these runs) of the process whose RANK is GRPO_TEST_STALL_RANK
(any process when unset); with GRPO_TEST_STALL_CALL unset it never sleeps."""

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
