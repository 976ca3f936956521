"""A hosted judge's timing, for scripts/bench_reward_loop.py: an OpenAI-compatible chat
completions server whose every verdict takes a seeded lognormal time and which serves at most
`concurrency` verdicts at once (a hosted model's rate limit: more requests wait their turn).

Its verdicts are the arithmetic task's exact scorer (reward/scorers/arithmetic.py) on the
student answer and reference answer of hybrid's default judge prompt, written as "Score: 1" or
"Score: 0": the benchmark measures when scores arrive, so the verdict itself is the exact one
and the reward loop's parsing, time-outs and placement are the real ones. The wait of a
verdict is drawn from its request's text, so the same trajectory waits the same in every run.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import time

import numpy as np

from reward.scorers.arithmetic import compute_score
from scripts.latency_env import lognormal_mu

# hybrid's default reward_model.judge.prompt_template, read back.
_QUESTION = re.compile(r"Reference answer: (.*?)\nStudent answer: (.*)\n\nIs the student's", re.DOTALL)


def verdict_for(question: str) -> str:
    match = _QUESTION.search(question)
    if match is None:
        return "I cannot read this request."
    truth, answer = match.group(1), match.group(2)
    return f"Score: {int(compute_score(answer, truth))}"


def draw_wait(question: str, seed: int, mean: float, sigma: float) -> float:
    if mean <= 0:
        return 0.0
    digest = hashlib.sha256(question.encode()).digest()[:8]
    rng = np.random.default_rng([seed, int.from_bytes(digest, "little")])
    return float(rng.lognormal(lognormal_mu(mean, sigma), sigma))


class LatencyJudge:
    """The server on 127.0.0.1 (a free port); `url` is its base URL; `stats()` its log. `wait`
    and `verdict` (question -> seconds, question -> text) replace the drawn wait and the exact
    scorer's verdict (a test's slow or odd judge)."""

    def __init__(self, mean_s: float, sigma: float, concurrency: int, seed: int = 0, wait=None, verdict=None):
        self.mean_s, self.sigma, self.seed = float(mean_s), float(sigma), int(seed)
        self.wait = wait or (lambda question: draw_wait(question, self.seed, self.mean_s, self.sigma))
        self.verdict = verdict or verdict_for
        self.slots = threading.Semaphore(max(int(concurrency), 1))
        self.lock = threading.Lock()
        self.served: list[tuple[float, float, float]] = []  # (arrived, started, ended)
        judge = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                arrived = time.perf_counter()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                question = body["messages"][-1]["content"]
                with judge.slots:
                    started = time.perf_counter()
                    time.sleep(judge.wait(question))
                    text = judge.verdict(question)
                with judge.lock:
                    judge.served.append((arrived, started, time.perf_counter()))
                reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="latency-judge", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def reset(self) -> None:
        with self.lock:
            self.served = []

    def stats(self) -> dict:
        with self.lock:
            served = list(self.served)
        if not served:
            return {"verdicts": 0}
        return {
            "verdicts": len(served),
            "verdict_s_mean": float(np.mean([e - s for _, s, e in served])),
            "queued_s_mean": float(np.mean([s - a for a, s, _ in served])),
        }

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
