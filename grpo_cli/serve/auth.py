"""Who may use a `grpo serve-vllm`: every route but /health needs `Authorization: Bearer <token>`, always.

The token is $GRPO_SERVER_TOKEN when set (required to listen beyond loopback: the trainer on another machine gets
the same variable). A loopback server without one makes its own (`secrets.token_urlsafe(32)`) and writes it to
`token_file(port)`, in a folder only its user can enter (0700; the file 0600), so another user of a shared GPU
host can neither push weights into the policy a trainer samples from nor read the token; a trainer of the same
user on the same machine reads the file for the URL's port, with no flag. The server deletes the file when it
stops. Importing this module is cheap (no torch, no vLLM).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

TOKEN_ENV = "GRPO_SERVER_TOKEN"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_dir() -> Path:
    """$XDG_RUNTIME_DIR/grpo-serve-vllm (a per-user folder the system empties at logout), else
    ~/.config/grpo/serve-vllm."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "grpo-serve-vllm" if runtime else Path.home() / ".config" / "grpo" / "serve-vllm"


def token_file(port: int) -> Path:
    """Where a loopback server on `port` keeps the token it made (one server per port on a machine)."""
    return token_dir() / f"port-{int(port)}.token"


def make_token(port: int) -> tuple[str, Path]:
    """A new token, written to `token_file(port)` readable by this user only; -> (token, the file)."""
    folder = token_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)  # an existing folder too: the token is only as private as its folder
    token, path = secrets.token_urlsafe(32), token_file(port)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    os.replace(tmp, path)
    return token, path


def remove_token(path: Path, token: str) -> None:
    """Delete the server's token file, unless another server has since written its own there."""
    try:
        if path.read_text() == token:
            path.unlink()
    except OSError:
        pass


def client_token(host: str, port: int) -> tuple[str | None, str]:
    """The token a trainer sends to the server at host:port, and where it came from: $GRPO_SERVER_TOKEN, else (a
    loopback server) the file its server wrote."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV], f"${TOKEN_ENV}"
    path = token_file(port)
    if is_loopback(host):
        try:
            return path.read_text().strip() or None, str(path)
        except OSError:
            pass
    return None, f"${TOKEN_ENV} (unset; no {path} of a server on this machine)"
