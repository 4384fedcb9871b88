""""""

import json

from grpo_cli.run.logs import JsonlLog


def test_resume_keeps_records_through_step_and_drops_a_cut_line(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    log = JsonlLog(path, keep_through_step=0)
    # a completion holding characters that str.splitlines() would split on
    log.write_many([{"step": 1, "completion": "a\u2028b\u0085c"}, {"step": 2, "x": float("nan")}, {"step": 3}])
    log.close()
    with open(path, "a") as f:
        f.write('{"step": 4, "compl')  # a crash cut the last line
    log = JsonlLog(path, keep_through_step=2)
    log.write({"step": 3, "again": True})
    log.close()
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]
    assert records == [{"step": 1, "completion": "a\u2028b\u0085c"}, {"step": 2, "x": None}, {"step": 3, "again": True}]
