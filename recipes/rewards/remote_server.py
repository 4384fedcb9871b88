"""A reward function behind an HTTP endpoint, for a recipe that names it by URL (docs/rewards.md, "Remote reward
functions"): POST / with what a Python reward receives (prompts, completions, completion_ids, every data column,
the reward's kwargs) as JSON; the answer is {"rewards": [...]}, one number (or null) per completion.

    python recipes/rewards/remote_server.py --port 9000 &
    grpo train recipes/ci-tiny.yaml "rewards=[{name: 'http://127.0.0.1:9000/score'}]"

It scores with grpo's built-in accuracy here; put any scorer in its place (a sandbox that runs code, a verifier in
another language's service, a model on another machine).
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from grpo_cli.rewards.builtin import accuracy


class Reward(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rewards = accuracy(body["completions"], body.get("answer"))
        data = json.dumps({"rewards": rewards}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=9000)
    port = ap.parse_args().port
    print(f"a reward on http://127.0.0.1:{port}/score", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Reward).serve_forever()
