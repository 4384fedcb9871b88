"""logging.trackers, read back with each tracker's own reader: TensorBoard's event files (its EventAccumulator),
MLflow's SQLite store (MlflowClient), W&B's offline run folders (its protobuf records) and Trackio's local store
(its SQLiteStorage). A run of 2 steps, then a resume to 4: every tracker holds one run with metrics.jsonl's 4 steps
and the resolved recipe as its config."""

import json
import os
import struct
from pathlib import Path

import pytest

from helpers import cli, read_jsonl

pytestmark = pytest.mark.slow
TRACKERS = "logging.trackers=[tensorboard,mlflow,wandb,trackio]"
KEYS = ("reward", "reward_std", "loss", "grad_norm", "entropy", "rewards/digit_fraction/mean", "completions/mean_length")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("trackers")
    env = {**os.environ, "GRPO_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "grpo-cache"),
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_TRACKING_URI": f"sqlite:///{base}/mlflow.db",
           "TRACKIO_DIR": str(base / "trackio")}
    folder = base / "run"
    common = ["recipes/ci-tiny.yaml", "-o", str(folder), "eval=null", TRACKERS]
    p = cli("train", *common, "train.max_steps=2", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    first = json.loads((folder / "trackers.json").read_text())
    p = cli("train", *common, "train.max_steps=4", "--resume", "auto", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((folder / "trackers.json").read_text()) == first  # the resume ran under the same ids
    return folder, env


def expected(folder: Path) -> dict[str, list[tuple[int, float]]]:
    records = read_jsonl(folder / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    return {k: [(r["step"], r[k]) for r in records] for k in KEYS}


def same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    """Steps equal; values equal as float32 (TensorBoard stores float32) or exactly."""
    return [s for s, _ in got] == [s for s, _ in want] and all(
        struct.pack("f", a) == struct.pack("f", b) for (_, a), (_, b) in zip(got, want))


def test_tensorboard(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder, _ = run
    events = EventAccumulator(str(folder / "tensorboard" / "ci-tiny"))
    events.Reload()
    for key, want in expected(folder).items():
        assert same([(e.step, e.value) for e in events.Scalars(key)], want), key
    hparams = list((folder / "tensorboard" / "ci-tiny").glob("*/events.out.tfevents.*"))
    assert len(hparams) == 2  # the recipe as hyper-parameters, at the start and at the resume
    config = EventAccumulator(str(hparams[0].parent))
    config.Reload()
    assert config.summary_metadata  # add_hparams' plugin data: the recipe's keys


def test_mlflow(run):
    from mlflow.tracking import MlflowClient

    folder, env = run
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("ci-tiny").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == json.loads((folder / "trackers.json").read_text())["mlflow"]
    for key, want in expected(folder).items():
        history = client.get_metric_history(runs[0].info.run_id, key)
        assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == want, key
    params, tags = runs[0].data.params, runs[0].data.tags
    assert params["algorithm.loss_type"] == "dapo" and params["rewards.1.name"].endswith("toy.py:digit_fraction")
    assert params["train.max_steps"] == "2" and tags["resumed.train.max_steps"] == "4"  # MLflow keeps the first


def wandb_records(path: Path):
    """The records of a .wandb transaction log, parsed with W&B's own protobuf schema. The file is a LevelDB-style
    log (a 7-byte header ':W&B', 0xBEE1, version 0; 32 KiB blocks of records: crc32c, length, type, payload); wandb
    0.31 reads it in its Go core and no longer ships a Python reader."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        payload = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def test_wandb(run):
    folder, _ = run
    run_id = json.loads((folder / "trackers.json").read_text())["wandb"]
    logs = sorted((folder / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(logs) == 2  # the first start and the resume, one run id
    history, config, ids = [], {}, set()
    for log in logs:
        for record in wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "run":
                ids.add(record.run.run_id)
    assert ids == {run_id}
    for key, want in expected(folder).items():
        assert [(h["_step"], h[key]) for h in history if key in h] == want, key
    assert config["algorithm.loss_type"] == "dapo" and config["train.max_steps"] == 4  # the resume's value


TRACKIO_READ = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
project, run = sys.argv[1:]
print(json.dumps({"runs": SQLiteStorage.get_runs(project), "logs": SQLiteStorage.get_logs(project, run),
                  "config": SQLiteStorage.get_run_config(project, run)}, default=str))
"""


def test_trackio(run):
    import subprocess
    import sys

    folder, env = run
    # trackio reads TRACKIO_DIR when imported: read the store in a process of its own, as `trackio show` would
    p = subprocess.run([sys.executable, "-c", TRACKIO_READ, "ci-tiny", folder.name], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    store = json.loads(p.stdout.strip().splitlines()[-1])
    assert store["runs"] == [folder.name]  # one run, continued by the resume
    for key, want in expected(folder).items():
        assert [(entry["step"], entry[key]) for entry in store["logs"] if key in entry] == want, key
    assert store["config"]["algorithm.loss_type"] == "dapo" and store["config"]["train.max_steps"] == 4


def test_a_start_over_starts_a_new_trackio_run(run, tmp_path):
    """Issue 35: --start-over deleted trackers.json but Trackio, resumed by run name, appended the new run's steps
    to the old run's."""
    import subprocess
    import sys

    _, env = run
    folder = tmp_path / "again"
    common = ["recipes/ci-tiny.yaml", "-o", str(folder), "eval=null", "logging.trackers=[trackio]", "train.max_steps=2"]
    for extra in ([], ["--start-over"]):
        p = cli("train", *common, *extra, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
    read = TRACKIO_READ.replace("SQLiteStorage.get_logs(project, run)", "SQLiteStorage.get_logs(project, run, "
                                "run_id=SQLiteStorage.get_latest_run_record_by_name(project, run)['id'])")
    p = subprocess.run([sys.executable, "-c", read, "ci-tiny", folder.name], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    store = json.loads(p.stdout.strip().splitlines()[-1])
    assert store["runs"].count(folder.name) == 2  # the first run and the one --start-over began, apart
    assert [entry["step"] for entry in store["logs"] if "reward" in entry] == [1, 2]  # only the new run's steps
