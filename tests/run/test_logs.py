"""JSON-lines logs: what a resume keeps, and what it costs."""

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


def test_a_resume_cuts_the_tail_in_place_whatever_the_blocks(tmp_path):
    """Issue 35: a resume read the whole file into memory and rewrote it (without fsync). The tail after the
    checkpoint's step is now found reading backwards and cut in place: the same lines kept as reading it whole."""
    import random

    from grpo_cli.run.logs import tail_after

    rng = random.Random(0)
    for trial in range(60):
        lines, step = [], 0
        for _ in range(rng.randint(0, 25)):
            step += rng.randint(0, 2)
            kind = rng.random()
            if kind < 0.1:
                lines.append("")  # blank
            elif kind < 0.15:
                lines.append("not json {")  # garbage a reader skips
            else:
                lines.append(json.dumps({"step": step, "text": "x" * rng.randint(0, 40) + "\u2028"}, ensure_ascii=False))
        data = "".join(line + "\n" for line in lines)
        if rng.random() < 0.3:
            data += '{"step": 99, "cut'  # a crash cut the last line
        path = tmp_path / f"log{trial}.jsonl"
        path.write_text(data, encoding="utf-8")
        keep = rng.randint(0, step + 1)
        raw = path.read_bytes()
        for block in (1, 3, 7, 64, 1 << 20):
            cut, dropped = tail_after(path, keep, block=block)
            # what reading it whole keeps: everything up to the last record of a step <= keep
            pieces = raw.split(b"\n")
            last = max((i for i, p in enumerate(pieces[:-1]) if _step(p) is not None and _step(p) <= keep), default=-1)
            want = sum(len(p) + 1 for p in pieces[: last + 1])
            later = sum(1 for p in pieces[last + 1 : -1] if _step(p) is not None)
            assert (cut, dropped) == (want, later), (trial, block, keep, data)


def _step(line: bytes):
    try:
        r = json.loads(line)
    except ValueError:
        return None
    return r["step"] if isinstance(r, dict) and type(r.get("step")) is int else None


def test_a_resume_holds_the_tail_not_the_file(tmp_path):
    import tracemalloc

    path = tmp_path / "rollouts.jsonl"
    line = json.dumps({"step": 0, "completion": "y" * 1000})
    with open(path, "w") as f:  # ~50 MB of step 1 .. 50, the tail of step 50 to drop
        for step in range(1, 51):
            kept = f.tell()
            f.write("".join(line.replace('"step": 0', f'"step": {step}') + "\n" for _ in range(1000)))
    size = path.stat().st_size
    tracemalloc.start()
    log = JsonlLog(path, keep_through_step=49)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    log.close()
    assert log.dropped == 1000 and path.stat().st_size == kept
    assert peak < size / 10, (peak, size)  # the tail's blocks, not the file: reading it whole held all 50 MB
