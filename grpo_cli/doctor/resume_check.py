"""`grpo doctor --resume-check`: proof, on the user's own recipe and machine, that a run stopped and resumed is the
run that was not: N steps straight against N/2, a resume, N/2 more; the metrics and the final weights compared."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from grpo_cli.views.verdicts import Verdict

VOLATILE = ("time/", "throughput/", "memory/")  # wall-clock and memory differ between two identical runs


def _train(recipe: Path, out: Path, overrides: list[str], *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_cli", "train", str(recipe), "-o", str(out), *overrides, *extra],
                          capture_output=True, text=True)


def _metrics(run: Path) -> list[dict]:
    from grpo_cli.run.logs import METRICS
    from grpo_cli.views.run_metrics import load_metrics

    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in load_metrics(run / METRICS)]


def _weights(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    from grpo_cli.models.lora import weights_file

    path = weights_file(checkpoint)
    return load_file(str(path)) if path is not None else {}


def resume_check(recipe: Path, overrides: list[str], steps: int, work: Path | None = None) -> Verdict:
    import torch

    half = max(1, steps // 2)
    common = [*overrides, f"train.max_steps={steps}", f"checkpoint.every_steps={half}", "checkpoint.keep_last=null",
              "eval=null", "logging.trackers=[]", "logging.replay=false"]
    with tempfile.TemporaryDirectory(prefix="grpo-resume-check-") as tmp:
        root = work or Path(tmp)
        straight, cut = root / "straight", root / "cut"
        runs = [_train(recipe, straight, common), _train(recipe, cut, common, f"train.max_steps={half}"),
                _train(recipe, cut, common, "--resume", "auto")]
        failed = next((p for p in runs if p.returncode != 0), None)
        if failed is not None:
            return Verdict("resume check", "fail", f"a training run failed (exit {failed.returncode})",
                           failed.stderr.strip().splitlines()[-5:], "run `grpo train` on the recipe to see why")
        a, b = _metrics(straight), _metrics(cut)
        differ = [f"step {x['step']}: {k} {x.get(k)} straight, {y.get(k)} resumed" for x, y in zip(a, b)
                  for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
        wa, wb = _weights(straight / "checkpoints" / f"step-{steps}"), _weights(cut / "checkpoints" / f"step-{steps}")
        unequal = [k for k in wa if k not in wb or not torch.equal(wa[k], wb[k])]
    evidence = [f"{steps} steps straight against {half} + resume + {steps - half}: {len(a)} and {len(b)} metric records, "
                f"{len(wa)} weight tensors compared"]
    if differ or unequal or len(a) != len(b) or not wa:
        return Verdict("resume check", "fail", f"a resumed run differs from a straight one: {len(differ)} metric values, "
                       f"{len(unequal)} weight tensors", evidence + differ[:5] + unequal[:5],
                       "a source of randomness outside the checkpoint (a reward or environment with its own RNG, a "
                       "nondeterministic kernel on GPU): report it with these lines")
    return Verdict("resume check", "ok", f"exact: the same metrics at every step and the same weights after step {steps}",
                   evidence)
