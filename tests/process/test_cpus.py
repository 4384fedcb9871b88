"""CPU threads: the cores other processes keep busy (a real competitor process), what `auto` chooses from them, and
the line a far slower step prints (issue 22: with one other process on 2 cores, 2 pinned threads took a step from
~7 s to 145-178 s, and nothing said why)."""

import subprocess
import sys
import threading
import time

import pytest

from grpo_cli.process.cpus import SlowSteps, busy_elsewhere, choose_threads, cpu_times, usable_cores

SPIN = "import time\nt = time.time()\nwhile time.time() - t < 30: pass\n"


@pytest.fixture
def competitor():
    """Another process keeping one core busy."""
    p = subprocess.Popen([sys.executable, "-c", SPIN])
    time.sleep(0.5)
    yield p
    p.kill()
    p.wait()


def test_a_busy_core_elsewhere_is_seen_and_auto_leaves_it_alone(competitor):
    assert busy_elsewhere() >= 0.7  # one spinning process (other load only adds to it)
    chosen = choose_threads("auto")
    assert 1 <= chosen.count <= max(1, usable_cores() - 1)
    assert chosen.why.startswith("auto: ") and f"of {usable_cores()} cores free" in chosen.why


def test_this_process_own_work_is_not_counted():
    # This process spins a core while it samples: whatever else runs on the machine (issue 35: a bound on the
    # result failed when other jobs kept the cores busy), what it reports plus its own rate is the busy total of
    # the same window, and its own rate is more than measurement noise. Counted, its own work would appear twice.
    stop = time.time() + 1.5

    def spin():
        while time.time() < stop:
            pass

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    before, own0, t0 = cpu_times(), time.process_time(), time.perf_counter()
    busy = busy_elsewhere()
    after, own, wall = cpu_times(), time.process_time() - own0, time.perf_counter() - t0
    t.join()
    total = (after[0] - before[0]) / (after[1] - before[1]) * after[2]  # cores busy in the window, this one's included
    own_rate = own / wall
    assert own_rate > 0.2, own_rate  # the spinning thread ran
    # jiffies are 10 ms: over 0.3 s on N cores the totals are known to about N x 0.05 cores
    assert abs(busy + own_rate - total) <= 0.1 + 0.05 * after[2], (busy, own_rate, total)


def test_a_number_is_kept_and_split_auto_between_processes():
    assert choose_threads(3) == choose_threads(3) and choose_threads(3).count == 3
    assert choose_threads("auto", processes=64).count == 1  # never 0


def test_a_far_slower_step_says_why_once():
    slow = SlowSteps(threads=2, device="cpu", factor=3.0, every=20)
    lines = [slow(step, s) for step, s in enumerate([25.0, 7.0, 7.5, 6.8, 8.0, 20.0, 150.0, 160.0], start=1)]
    assert lines[:6] == [None] * 6  # step 1 warms up; 20 s is < 3x the first steps' 7.0 s
    assert "step 7 took 150.0 s, 21x the first steps' 7.0 s" in lines[6]
    assert "train.threads" in lines[6] and "2 torch threads" in lines[6]
    assert lines[7] is None  # at most once every 20 steps
    gpu = SlowSteps(threads=2, device="cuda")
    for step, s in enumerate([5.0, 1.0, 1.0, 1.0], start=1):
        gpu(step, s)
    assert "another job using this GPU" in gpu(5, 10.0)


PROBE = ("import os\nfrom grpo_cli.process.cpus import choose_threads, prepare_openmp\nbusy = prepare_openmp({setting!r})\n"
         "print(os.environ.get('OMP_WAIT_POLICY'), '|', choose_threads({setting!r}).why)\n")


def _probe(setting, **env):
    import os

    p = subprocess.run([sys.executable, "-c", PROBE.format(setting=setting)], capture_output=True, text=True,
                       env={**{k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}, **env})
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_a_shared_cpu_gets_the_passive_wait_policy_and_every_core(competitor):
    # bench/threads_contention.py: busy 2-core CPU, 2 spinning threads 43.9 s a step, 2 passive 15.6 s, 1 thread 17.6 s
    out = _probe("auto")
    assert out.startswith("PASSIVE | auto: shared CPU (") and f"{usable_cores()} cores, OMP_WAIT_POLICY=PASSIVE" in out
    assert _probe("auto", OMP_WAIT_POLICY="ACTIVE").startswith("ACTIVE | auto: ")  # a value set is never overridden
    assert _probe(2).startswith("None | train.threads: 2")  # a number: the user's own choice, nothing changed


def test_the_start_measurement_is_reused_not_taken_again(monkeypatch):
    # prepare_openmp sampled /proc/stat for 0.3 s, then choose_threads sampled it again (and every launched worker)
    import grpo_cli.process.cpus as cpus

    monkeypatch.setenv(cpus.BUSY_ENV, "1.2")  # what prepare_openmp saw (a launched worker inherits it)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(cpus, "busy_elsewhere", lambda *a: pytest.fail("measured again"))
    chosen = choose_threads("auto")
    assert chosen.why == f"auto: shared CPU (1.2 cores busy elsewhere): {usable_cores()} cores, OMP_WAIT_POLICY=PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    free = max(1, usable_cores() - 1)
    assert choose_threads("auto").why == f"auto: {free} of {usable_cores()} cores free (1.2 busy with other processes)"
    # a launched worker: prepare_openmp takes the launcher's figure (its siblings would count as busy)
    assert _probe("auto", GRPO_CPU_BUSY="1.5").startswith("PASSIVE | auto: shared CPU (1.5 cores busy elsewhere): ")
    assert _probe("auto", GRPO_CPU_BUSY="0.2").startswith("None | auto: ")
