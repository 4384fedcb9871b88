"""Put on PYTHONPATH by the kill -9 tests (tests/run/test_rewind.py): with GRPO_TEST_KILL_ON_RENAME="TEXT:N" the
process sends itself SIGKILL at the N-th `os.rename` whose source path contains TEXT, before that rename happens,
so a test can stop a real trainer at an exact point of a save or a rewind. Without the variable it does nothing."""

import os
import signal

_spec = os.environ.get("GRPO_TEST_KILL_ON_RENAME")
if _spec:
    _text, _n = _spec.rsplit(":", 1)
    _seen = [0]
    _rename = os.rename

    def _killing_rename(src, dst, *args, **kwargs):
        if _text in os.fspath(src):
            _seen[0] += 1
            if _seen[0] == int(_n):
                os.kill(os.getpid(), signal.SIGKILL)
        return _rename(src, dst, *args, **kwargs)

    os.rename = _killing_rename
