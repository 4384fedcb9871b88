"""Checkpoints: exact round trip of model/optimizer/scheduler/RNG, manifest, corruption, retention, crashes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

torch.set_num_threads(1)

from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from grpo_cli.errors import CheckpointError  # noqa: E402
from grpo_cli.run import checkpoint_io as ck  # noqa: E402
from grpo_cli.run import statefiles  # noqa: E402
from grpo_cli.run.checkpoint_io import load_training_state, save_checkpoint  # noqa: E402
from grpo_cli.run.checkpoints import (  # noqa: E402
    atomic_write_text,
    latest_checkpoint,
    list_checkpoints,
    resolve_resume,
    verify_checkpoint,
)
from grpo_cli.run.statefiles import rng_state, set_rng_state  # noqa: E402

from helpers import RECIPE, batch, make_opt, tiny_model, tiny_tokenizer, train_step  # noqa: E402


def save(run: Path, step: int, model, opt=None, sched=None, keep_last=None, tokenizer=None) -> Path:
    return save_checkpoint(
        run, step, model=model, tokenizer=tokenizer, optimizer=opt, scheduler=sched,
        recipe_yaml=RECIPE, trainer_state={"step": step, "data_position": 3 * step}, keep_last=keep_last,
    )


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def assert_same(a, b) -> None:
    """Exact structural equality of state dicts: tensors by value, dtype and shape; tuples stay tuples."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_round_trip_resumes_bit_exactly(tmp_path):
    model = tiny_model()
    opt, sched = make_opt(model)
    for s in range(2):
        train_step(model, opt, sched, batch(s))
    path = save(tmp_path, 2, model, opt, sched, tokenizer=tiny_tokenizer())
    assert path == tmp_path / "checkpoints" / "step-2"

    model2 = AutoModelForCausalLM.from_pretrained(path)
    opt2, sched2 = make_opt(model2)
    state = load_training_state(path, optimizer=opt2, scheduler=sched2)
    assert state == {"step": 2, "data_position": 6, "rng_restored": True}
    assert (path / "trainer/recipe.yaml").read_text() == RECIPE
    assert_same(opt.state_dict(), opt2.state_dict())  # step is a float32 0-dim tensor equal to 2.0
    assert opt2.state_dict()["state"][0]["step"].dtype == torch.float32
    assert float(opt2.state_dict()["state"][0]["step"]) == 2.0
    assert opt2.param_groups[0]["betas"] == (0.9, 0.95)
    assert sched2.last_epoch == 2 and sched2.get_last_lr() == sched.get_last_lr() == [1e-2 * 3 / 4]

    train_step(model, opt, sched, batch(7))
    train_step(model2, opt2, sched2, batch(7))
    for (n, p), (n2, p2) in zip(model.named_parameters(), model2.named_parameters()):
        assert n == n2 and torch.equal(p, p2), n
    assert sched.get_last_lr() == sched2.get_last_lr() == [1e-2]  # warmup(3) = 1.0
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in opt2.param_groups] == [1e-2]

    tok = PreTrainedTokenizerFast.from_pretrained(path)
    assert tok("2 + 2 = 4")["input_ids"] == tiny_tokenizer()("2 + 2 = 4")["input_ids"]


def test_scheduler_with_callable_object_round_trips(tmp_path, model):
    class Warmup:  # LambdaLR saves a callable object's __dict__
        def __init__(self, n: int) -> None:
            self.n = n

        def __call__(self, step: int) -> float:
            return min(1.0, (step + 1) / self.n)

    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, Warmup(10))
    opt.step(), sched.step()
    path = save(tmp_path, 1, model, opt, sched)
    assert json.loads((path / "trainer/scheduler.json").read_text())["state"]["lr_lambdas"] == [{"n": 10}]
    opt2 = torch.optim.AdamW(model.parameters(), lr=0.5)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, Warmup(4))
    load_training_state(path, optimizer=opt2, scheduler=sched2)
    assert sched2.lr_lambdas[0].n == 10
    assert sched2.get_last_lr() == [0.5 * 2 / 10]
    opt.step(), sched.step(), opt2.step(), sched2.step()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.5 * 3 / 10


def draws() -> tuple:
    return torch.rand(4).tolist(), random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.randn()


def test_rng_restore_repeats_every_draw():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.randn()  # leave a cached gaussian in both states
    state = json.loads(json.dumps(rng_state()))  # plain JSON, through text and back
    first = draws()
    set_rng_state(state)
    assert draws() == first
    assert draws() != first  # the state moved on: the comparison above can fail


def test_rng_restored_by_load_training_state(tmp_path, model):
    torch.manual_seed(5), random.seed(6), np.random.seed(7)
    path = save(tmp_path, 1, model)
    expected = draws()
    state = load_training_state(path, optimizer=None, scheduler=None)
    assert state["step"] == 1 and state["data_position"] == 3 and state["rng_restored"]
    assert draws() == expected
    assert not (path / "trainer/rng.json").exists()  # one format: trainer_state.json's rng_per_rank


def test_each_process_gets_its_own_rng_back(tmp_path, model):
    states = []
    for seed in (11, 12):  # what two processes would hold
        torch.manual_seed(seed), random.seed(seed), np.random.seed(seed)
        states.append((rng_state(), draws()))
    path = save_checkpoint(tmp_path, 1, model=model, tokenizer=None, optimizer=None, scheduler=None, recipe_yaml=RECIPE,
                           trainer_state={"step": 1, "rng_per_rank": [s for s, _ in states]}, keep_last=None)
    for rank, (_, expected) in enumerate(states):
        assert load_training_state(path, optimizer=None, scheduler=None, rank=rank, world=2)["rng_restored"]
        assert draws() == expected
    # another process count: nothing to restore, the caller reseeds
    assert not load_training_state(path, optimizer=None, scheduler=None, rank=0, world=3)["rng_restored"]


def test_checkpoints_with_the_older_rng_files_still_restore(tmp_path, model):
    # before: rank 0's python/numpy/torch in rng.safetensors + rng.json, only torch's per rank
    from safetensors.torch import save_file

    torch.manual_seed(21), random.seed(22), np.random.seed(23)
    full = rng_state()
    expected = draws()
    path = save(tmp_path, 1, model)
    state_file = path / "trainer/trainer_state.json"
    state = json.loads(state_file.read_text())
    state["rng_per_rank"] = [{"cpu": full["cpu"]}]
    state_file.write_text(json.dumps(state))
    import base64

    cpu = torch.frombuffer(bytearray(base64.b64decode(full["cpu"])), dtype=torch.uint8)
    save_file({"torch.cpu": cpu}, str(path / "trainer/rng.safetensors"))
    (path / "trainer/rng.json").write_text(json.dumps({"format": 1, "python": full["python"], "numpy": full["numpy"],
                                                       "cuda_devices": 0}))
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    assert load_training_state(path, optimizer=None, scheduler=None)["rng_restored"]
    assert draws() == expected


def test_manifest_lists_every_file_and_comes_last(tmp_path, model):
    opt, sched = make_opt(model)
    path = save(tmp_path, 3, model, opt, sched)
    manifest = json.loads((path / "trainer/manifest.json").read_text())
    files = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())
    assert manifest["step"] == 3 and manifest["format"] == 2
    assert sorted(manifest["files"]) == [f for f in files if f != "trainer/manifest.json"]
    for name in ("model.safetensors", "config.json", "trainer/optimizer.safetensors", "trainer/optimizer.json",
                 "trainer/scheduler.json", "trainer/trainer_state.json",
                 "trainer/recipe.yaml"):
        assert name in manifest["files"]
    assert all(len(h) == 64 for h in manifest["files"].values())
    verify_checkpoint(path)

    # every file but the manifest: not a checkpoint yet
    (path / "trainer/manifest.json").unlink()
    assert list_checkpoints(tmp_path) == [] and latest_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError, match="incomplete"):
        verify_checkpoint(path)
    with pytest.raises(CheckpointError, match="incomplete"):
        resolve_resume(tmp_path, str(path))
    assert resolve_resume(tmp_path, "auto") is None


def test_no_pickle_files(tmp_path):
    model = tiny_model()
    opt, sched = make_opt(model)
    train_step(model, opt, sched, batch(0))
    path = save(tmp_path, 1, model, opt, sched, tokenizer=tiny_tokenizer())
    suffixes = {p.suffix for p in path.rglob("*") if p.is_file()}
    assert not suffixes & {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"}
    assert ".safetensors" in suffixes


def test_corruption_is_named_and_refused(tmp_path, model):
    save(tmp_path, 5, model)
    path = save(tmp_path, 7, model)
    assert resolve_resume(tmp_path, "auto") == path
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"step-7 is corrupted: model\.safetensors does not match its sha256"):
        verify_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        resolve_resume(tmp_path, "auto")  # no silent fallback to step-5
    data[-1] ^= 0xFF  # repair the weights, then lose another file
    weights.write_bytes(bytes(data))
    verify_checkpoint(path)
    (path / "trainer/trainer_state.json").unlink()
    with pytest.raises(CheckpointError, match=r"trainer/trainer_state\.json is missing"):
        verify_checkpoint(path)
    assert resolve_resume(tmp_path, str(tmp_path / "checkpoints" / "step-5")) == tmp_path / "checkpoints" / "step-5"
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        resolve_resume(tmp_path, str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="run folder, not a checkpoint"):
        resolve_resume(tmp_path, str(tmp_path))


def test_retention_keeps_newest_complete(tmp_path, model):
    from grpo_cli.run import lock as runlock
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / ".tmp-step-9-123").mkdir()
    (root / ".tmp-step-9-123" / "model.safetensors").write_bytes(b"half")
    save(tmp_path, 1, model, keep_last=2)
    assert (root / ".tmp-step-9-123").exists()  # another process's save in progress: not ours to delete
    key = runlock.acquire(tmp_path)  # the lock holder owns the folder: leftovers are a dead run's
    try:
        for step in range(2, 6):
            save(tmp_path, step, model, keep_last=2)
    finally:
        runlock.release(key)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-4", "step-5"]
    assert not (root / ".tmp-step-9-123").exists()

    (root / "step-6").mkdir()  # an interrupted copy: no manifest
    (root / "step-6" / "model.safetensors").write_bytes(b"x")
    assert latest_checkpoint(tmp_path) == root / "step-5"
    # an older step saved later is kept, and retention deletes nothing newer than it: those are not its branch's past
    save(tmp_path, 3, model, keep_last=1)
    assert sorted(p.name for p in root.iterdir()) == ["step-3", "step-4", "step-5", "step-6"]
    save(tmp_path, 5, model, keep_last=1)  # replacing an existing step: the old one is set aside, never deleted
    assert sorted(p.name for p in root.iterdir()) == ["step-5", "step-6"]
    verify_checkpoint(root / "step-5")
    (aside,) = (tmp_path / "abandoned").iterdir()
    assert aside.name.endswith("-replaced-step-5")
    verify_checkpoint(aside / "checkpoints/step-5")
    with pytest.raises(CheckpointError, match="keep_last"):
        save(tmp_path, 8, model, keep_last=0)


def test_a_complete_save_left_under_a_tmp_name_is_kept_and_recovered(tmp_path, model):
    from grpo_cli.run import lock as runlock
    from grpo_cli.run.checkpoints import recover_saves

    root = tmp_path / "checkpoints"
    for step in (2, 3, 7):
        save(tmp_path, step, model)
    (root / "step-7").rename(root / ".tmp-step-7-999")  # killed before its rename into place
    (root / "step-3").rename(root / ".tmp-old-step-2-999")  # a complete copy whose step-2 exists (an older version's)
    (root / ".tmp-step-8-999").mkdir()  # an interrupted save: no manifest
    key = runlock.acquire(tmp_path)
    try:
        save(tmp_path, 4, model, keep_last=1)  # retention, as the lock holder: only the folder without a manifest goes
        assert sorted(p.name for p in root.iterdir()) == [".tmp-old-step-2-999", ".tmp-step-7-999", "step-4"]
        said = []
        recover_saves(tmp_path, said.append)
    finally:
        runlock.release(key)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-4", "step-7"]
    verify_checkpoint(root / "step-7")
    assert "step-7: its save was complete when the run stopped (.tmp-step-7-999); moved into place" in said
    (aside,) = (tmp_path / "abandoned").iterdir()
    verify_checkpoint(aside / "checkpoints/.tmp-old-step-2-999")
    assert any(f"kept in {aside / 'checkpoints/.tmp-old-step-2-999'}" in line for line in said), said


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, model, monkeypatch):
    good = save(tmp_path, 1, model)

    class BrokenTokenizer:
        def save_pretrained(self, folder: str) -> None:
            (Path(folder) / "tokenizer.json").write_text("{")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model=model, tokenizer=BrokenTokenizer(), optimizer=None, scheduler=None,
                        recipe_yaml=RECIPE, trainer_state={}, keep_last=1)

    def disk_full(folder: Path, step: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "_write_manifest", disk_full)
    with pytest.raises(CheckpointError, match="could not save checkpoint step-2.*No space left"):
        save(tmp_path, 2, model, keep_last=1)
    assert list_checkpoints(tmp_path) == [good] and latest_checkpoint(tmp_path) == good
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-1"]
    verify_checkpoint(good)


def test_atomic_write_text_replaces(tmp_path):
    target = tmp_path / "state.json"
    atomic_write_text(target, "old")
    atomic_write_text(target, '{"step": 2}')
    assert target.read_text() == '{"step": 2}'
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_state_files_keep_dtype_and_shape(tmp_path):
    state = {
        "state": {0: {"step": torch.tensor(7.0, dtype=torch.float64),
                      "m": torch.arange(6, dtype=torch.bfloat16).view(2, 3)},
                  3: {"count": torch.tensor([1, 2], dtype=torch.int64), "mask": torch.tensor([3], dtype=torch.uint8)}},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 3], "foreach": None, "name": "all"}],
    }
    statefiles.save_state(tmp_path, "opt", state, tensor_file=True)
    assert_same(statefiles.load_state(tmp_path, "opt"), state)
    assert (tmp_path / "opt.safetensors").is_file()


def test_unsupported_state_is_refused(tmp_path, model):
    with pytest.raises(CheckpointError, match="without pickle"):
        statefiles.encode_value({"f": object()}, "param_groups", {})
    tensors: dict = {}
    enc = statefiles.encode_value({"state": {0: {"step": torch.tensor(3.0)}}, "betas": (0.9, 0.99)}, "x", tensors)
    assert json.loads(json.dumps(enc)) == enc and list(tensors) == ["x.state.0.step"]
    assert_same(statefiles.decode_value(enc, tensors), {"state": {0: {"step": torch.tensor(3.0)}}, "betas": (0.9, 0.99)})


def test_peft_model_saves_its_adapter(tmp_path):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_model(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    opt, sched = make_opt(model)  # only the LoRA weights train; the rest carry no optimizer state
    train_step(model, opt, sched, batch(0))
    path = save(tmp_path, 1, model, opt, sched)
    files = json.loads((path / "trainer/manifest.json").read_text())["files"]
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(files)
    opt2, sched2 = make_opt(model)
    load_training_state(path, optimizer=opt2, scheduler=sched2)
    assert_same(opt.state_dict(), opt2.state_dict())
