"""A process that has imported what every `grpo` command imports (torch, transformers, accelerate, datasets, the
trainer) and forks one child per command the tests run, so that a test's `python -m grpo_cli ...` does not pay
the 5-7 s of imports again (tests/helpers.py's `cli`; about half of the suite's time was imports).

The child is a real process of the real CLI: its own pid, environment, working directory, argv, stdin from
/dev/null, stdout and stderr to the caller's files, `grpo_cli`'s __main__ run as `python -m grpo_cli` runs it,
atexit handlers at its end, its exit status (or the signal that killed it) reported. What a fork cannot give, a
fresh interpreter's import-time state, is why a zygote is started with the environment its commands have where
libraries read it at import (HF_*, OMP_*, VLLM_*, ...: one zygote per such environment, tests/helpers.py's
Zygote), and why a test that measures a process's own memory asks for a new interpreter (`fresh=True`).

    python tests/zygote.py SOCKET [--vllm]     serve until the socket's caller goes away (its parent process exits);
                                              --vllm: vLLM and grpo's vLLM paths imported too (serve-vllm, vllm rollouts)

Protocol, one Unix-socket connection per command: the caller sends {"argv", "env", "cwd"} as JSON with the
stdout and stderr file descriptors attached; the zygote answers {"pid"} when the child runs and {"status"} (as
os.waitpid reports it) when it has ended.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import sys


def preload(with_vllm: bool = False) -> None:
    import torch  # noqa: F401
    import transformers
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401  (the tiny test model's)

    import grpo_cli.cli  # noqa: F401
    import grpo_cli.preflight.prepare  # noqa: F401
    import grpo_cli.trainer.engine  # noqa: F401

    transformers.AutoModelForCausalLM, transformers.AutoTokenizer  # noqa: B018  (resolves the lazy modules)
    transformers.Qwen2TokenizerFast if hasattr(transformers, "Qwen2TokenizerFast") else None  # noqa: B018
    if with_vllm:  # what a colocated engine, `grpo serve-vllm` and `grpo eval --backend vllm` import before they start one
        import vllm  # noqa: F401
        import vllm.entrypoints.llm  # noqa: F401
        import vllm.v1.core.sched.scheduler  # noqa: F401
        import vllm.v1.engine.async_llm  # noqa: F401
        import vllm.v1.engine.core  # noqa: F401
        import vllm.v1.engine.llm_engine  # noqa: F401
        import vllm.v1.worker.cpu_model_runner  # noqa: F401
        import vllm.v1.worker.cpu_worker  # noqa: F401

        import grpo_cli.rollout.vllm_colocate  # noqa: F401
        import grpo_cli.serve.app  # noqa: F401
        import grpo_cli.serve.engine  # noqa: F401


def child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the command, run it, exit with its status (never returns)."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (null, *fds):
            os.close(fd)
        import random

        random.seed()  # a fresh interpreter's draws, not the zygote's
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        import runpy

        sys.path[0] = request["cwd"]  # as `python -m` puts the working directory first
        sys.argv = ["grpo_cli", *request["argv"]]
        try:
            runpy.run_module("grpo_cli", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught exception
            import traceback

            traceback.print_exc()
            code = 1
        import atexit

        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(path: str, with_vllm: bool = False) -> None:
    preload(with_vllm)
    sys.stdout.flush(), sys.stderr.flush()  # nothing buffered is written again by each child
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    parent = os.getppid()
    running: dict[int, socket.socket] = {}
    with selectors.DefaultSelector() as sel:
        sel.register(server, selectors.EVENT_READ)
        while os.getppid() == parent:  # the test worker that started it is alive
            for _ in sel.select(timeout=0.05):
                conn, _ = server.accept()
                message, fds, _, _ = socket.recv_fds(conn, 2**20, 2)
                while message and not message.endswith(b"\n"):
                    more = conn.recv(2**20)
                    message = message + more if more else b""
                if not message or len(fds) != 2:  # the caller went away before its request was whole
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    server.close()
                    conn.close()
                    child(json.loads(message), fds)
                for fd in fds:
                    os.close(fd)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                running[pid] = conn
            while running:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                conn = running.pop(pid, None)
                if conn is not None:
                    try:
                        conn.sendall(json.dumps({"status": status}).encode() + b"\n")
                    except OSError:
                        pass
                    conn.close()


if __name__ == "__main__":
    try:
        serve(sys.argv[1], with_vllm="--vllm" in sys.argv[2:])
    finally:  # its folder (the socket, the log) goes with it
        import shutil

        shutil.rmtree(os.path.dirname(sys.argv[1]), ignore_errors=True)
