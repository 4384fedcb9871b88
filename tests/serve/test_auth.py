"""Who may use `grpo serve-vllm` and what its answers give away (issue 35, defect 5), without vLLM: the token file a
loopback server writes (only its user can read it) and a trainer finds; a full upload disk is a 507 before a byte is
stored; a bug's 500 names no exception text. The routes run in FastAPI's TestClient against a stand-in engine
holding only what these routes read: a full disk and a bug of the server cannot be brought about on demand in a
real one (the real server's tests: tests/serve/test_app.py, tests/rollout/test_vllm_rollouts.py)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_cli.serve.auth import client_token, make_token, remove_token, token_file

TOKEN = "t0ken"


def test_a_generated_token_is_private_and_the_same_users_trainer_finds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("GRPO_SERVER_TOKEN", raising=False)
    token, path = make_token(8123)
    assert path == token_file(8123) and path.read_text() == token and len(token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert client_token("127.0.0.1", 8123) == (token, str(path))
    assert client_token("localhost", 8123)[0] == token
    assert client_token("10.0.0.7", 8123)[0] is None  # another machine's server: its token is not in our file
    assert client_token("127.0.0.1", 8124)[0] is None  # another port's server
    monkeypatch.setenv("GRPO_SERVER_TOKEN", "explicit")
    assert client_token("127.0.0.1", 8123) == ("explicit", "$GRPO_SERVER_TOKEN")
    remove_token(path, "another server's token")  # the file was rewritten by a newer server: not ours to delete
    assert path.exists()
    remove_token(path, token)
    assert not path.exists()


def test_another_user_cannot_read_the_token(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os.chmod(tmp_path, 0o755)  # the runtime folder itself open, as /tmp would be: the token's own folder is not
    _, path = make_token(8125)
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", str(path)],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "Permission denied" in p.stderr, (p.returncode, p.stdout, p.stderr)


@pytest.fixture
def app_client(tmp_path):
    """The server's routes over a stand-in engine whose upload directory is `tmp_path/uploads`."""
    from fastapi.testclient import TestClient

    from grpo_cli.serve.app import build_app

    uploads = tmp_path / "uploads"
    uploads.mkdir()

    def info():
        raise RuntimeError("secret detail: /home/alice/.cache/token-store failed")

    engine = SimpleNamespace(model="m", version=0, activity=0, upload_dir=uploads, info=info, dead_reason=lambda: None,
                             limits=SimpleNamespace(max_upload_bytes=10**12, max_body_bytes=2**20),
                             update_weights=lambda *a: {"weight_version": 1, "updated": True})
    with TestClient(build_app(engine, TOKEN), raise_server_exceptions=False) as client:
        yield client


def test_a_bug_answers_500_without_its_exception_text(app_client, caplog):
    r = app_client.get("/info", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 500
    detail = r.json()["detail"]
    assert detail.startswith("internal error ") and "the server's log has the details" in detail
    assert "secret" not in r.text and "RuntimeError" not in r.text and "alice" not in r.text
    assert any("secret detail" in str(rec.exc_info[1]) for rec in caplog.records if rec.exc_info)  # logged instead
    assert app_client.get("/info").status_code == 401  # and no token, no answer


def test_an_upload_that_does_not_fit_the_disk_is_refused_before_a_byte_is_stored(app_client, tmp_path):
    import shutil

    free = shutil.disk_usage(tmp_path / "uploads").free
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/octet-stream", "X-Weight-Version": "1",
               "Content-Length": str(free + 1)}
    r = app_client.post("/update_weights", content=b"x", headers=headers)  # declares more than the disk holds
    assert r.status_code == 507, r.text
    assert f"an upload of {free + 1:,} bytes does not fit" in r.json()["detail"] and r.json()["field"] == "Content-Length"
    assert list((tmp_path / "uploads").iterdir()) == []
