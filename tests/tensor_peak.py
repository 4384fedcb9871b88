"""The peak of live tensor bytes in this process, the quantity a GPU's allocator reports
(torch.cuda.max_memory_allocated: tensors only), measured on the CPU: every op's new storage is counted from its
creation until it is freed. The C allocator's retention and fragmentation, which a CPU's resident memory adds, are
not in it. Used by tests/doctor/test_memory.py and bench/doctor_memory.py to check the doctor's tensor parts."""

from __future__ import annotations

import gc
import weakref
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def live_tensor_bytes() -> tuple[int, set[int]]:
    """The bytes of every CPU tensor storage reachable from Python now, and their addresses."""
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.is_meta:
                for t in (obj, obj.grad) if obj.grad is not None else (obj,):
                    s = t.untyped_storage()
                    if s.data_ptr() and s.nbytes():
                        seen[s.data_ptr()] = s.nbytes()
        except Exception:  # a tensor subclass or a half-built object
            continue
    return sum(seen.values()), set(seen)


class TensorPeak(TorchDispatchMode):
    """`with TensorPeak() as p: ...` -> p.peak: the most bytes of tensors alive at once inside the block, those alive
    before it included (found through the garbage collector); p.top: what was new at that moment, by op and shape."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[int, str]] = {}
        self.base, self.known = live_tensor_bytes()
        self.now = self.new_peak = 0
        self.at_peak: Counter = Counter()

    @property
    def peak(self) -> int:
        return self.base + self.new_peak

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.layout != torch.strided:
                continue  # a sparse tensor's indices and values are counted as the ops that make them
            s = t.untyped_storage()
            key, n = s.data_ptr(), s.nbytes()
            if not n or key in self.live or key in self.known:
                continue
            self.live[key] = (n, f"{func} {tuple(t.shape)}")
            weakref.finalize(s, self._free, key)
            self.now += n
            if self.now > self.new_peak:
                self.new_peak = self.now
                self.at_peak = Counter()
                for size, what in self.live.values():
                    self.at_peak[what] += size
        return out

    def _free(self, key: int) -> None:
        size, _ = self.live.pop(key, (0, ""))
        self.now -= size
        self.known.discard(key)


def main(argv: list[str]) -> None:
    """`python tests/tensor_peak.py RUN_DIR RECIPE [key=value ...]`: a run of RECIPE into RUN_DIR in this process
    (torch on one thread), under TensorPeak -> one JSON line: the peak in GiB and what was new at that moment."""
    import json
    from pathlib import Path

    from grpo_cli.recipe.files import load_recipe
    from grpo_cli.trainer.engine import Engine

    torch.set_num_threads(1)
    engine = Engine(load_recipe(Path(argv[1]), argv[2:]), Path(argv[0]))
    with TensorPeak() as p:
        engine.fit()
    print(json.dumps({"tensors_gib": p.peak / 2**30,
                      "top": [[what, n / 2**20] for what, n in p.at_peak.most_common(12)]}))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
