"""Put on PYTHONPATH by the kill -9 and slow-write tests (tests/run/test_rewind.py, tests/run/test_watchdog.py).
With GRPO_TEST_KILL_ON_RENAME="TEXT:N" the process sends itself SIGKILL at the N-th `os.rename` whose source path
contains TEXT, before that rename happens, so a test can stop a real trainer at an exact point of a save or a
rewind. Without the variables below it does nothing."""

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

# GRPO_TEST_SLOW_SAVE="CHUNK:SECONDS[:STOP]": safetensors files are written CHUNK bytes at a time, SECONDS apart (a
# slow network file system: the file grows all the while), and with STOP the write hangs for good once STOP bytes
# of a file are written (a file system that stopped answering). Patched before transformers and grpo_cli import
# safetensors' save_file by name.
_slow = os.environ.get("GRPO_TEST_SLOW_SAVE")
if _slow:
    import time

    import safetensors.torch

    _chunk, _seconds, *_stop = _slow.split(":")

    def _slow_save_file(tensors, filename, metadata=None):
        data = safetensors.torch.save(tensors, metadata=metadata)
        with open(filename, "wb") as f:
            for start in range(0, len(data), int(_chunk)):
                if _stop and start >= int(_stop[0]):
                    while True:
                        time.sleep(3600)
                f.write(data[start : start + int(_chunk)])
                f.flush()
                time.sleep(float(_seconds))

    safetensors.torch.save_file = _slow_save_file
