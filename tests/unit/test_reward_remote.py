"""The remote judge against a local server on 127.0.0.1 that answers slowly, fails, and returns malformed grades:
retries with back-off, per-request timeout, bounded concurrency, batching, the key read from the environment and
never shown, configuration mistakes as one line."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlhfkit.errors import RewardError
from rlhfkit.rewards import CombinedRewards
from rlhfkit.rewards.remote import RemoteJudge

KEY = "sk-test-secret-123"


class Judge(BaseHTTPRequestHandler):
    """Chat endpoint at /v1/chat/completions, JSON endpoint at /score. What it does depends on the completion:
    'slow' sleeps 3 s, 'flaky' fails with 503 the first time, 'mumble' answers without a grade, 'garbage' answers
    with a body that is not JSON; otherwise the grade is the completion's length (chat) / length (json)."""

    state = {"seen": {}, "active": 0, "peak": 0, "auth": set(), "batches": []}
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def _leave(self):
        """Stop counting this request as active (once): before its reply is sent, since the client may send its next
        request as soon as it has read a reply, before this handler thread gets past the write."""
        if self.active:
            with self.lock:
                self.state["active"] -= 1
            self.active = False

    def _reply(self, code: int, body: bytes, headers: dict | None = None):
        self._leave()
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting ('slow'): expected
            pass

    def do_POST(self):
        st = self.state
        self.active = True
        with self.lock:
            st["active"] += 1
            st["peak"] = max(st["peak"], st["active"])
            st["auth"].add(self.headers.get("Authorization"))
        try:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/score":
                st["batches"].append(len(body["completions"]))
                if "wrong-length" in body["completions"]:
                    return self._reply(200, b'{"scores": [1]}')
                return self._reply(200, json.dumps({"scores": [len(c) for c in body["completions"]]}).encode())
            if self.path == "/missing/chat/completions":
                return self._reply(404, b"not found")
            content = body["messages"][0]["content"]
            completion = content.split("Answer:\n", 1)[1].split("\n\n", 1)[0]
            with self.lock:
                n = st["seen"][completion] = st["seen"].get(completion, 0) + 1
            time.sleep(0.05)  # lets concurrent requests overlap
            if completion == "slow":
                # the client gives up after timeout_s (0.5 s) and may retry while this handler still sleeps: it stops
                # counting as active before then, so the peak counts the client's requests in flight, not abandoned ones
                time.sleep(0.2)
                self._leave()
                time.sleep(2.8)
            if completion == "flaky" and n == 1:
                return self._reply(503, b"busy", {"Retry-After": "0"})
            if completion == "garbage":
                return self._reply(200, b"<html>oops</html>")
            text = "Looks fine to me." if completion == "mumble" else f"Reasoning...\nGRADE: {len(completion)}"
            self._reply(200, json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode())
        finally:
            self._leave()


@pytest.fixture
def server():
    Judge.state = {"seen": {}, "active": 0, "peak": 0, "auth": set(), "batches": []}
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_chat_judge_retries_times_out_and_reads_grades(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    judge = RemoteJudge(f"{server}/v1", api_key_env="JUDGE_KEY", max_grade=10, retries=2, backoff_s=0.01,
                        timeout_s=0.5, concurrency=3)
    completions = ["abcde", "slow", "flaky", "mumble", "garbage", "ab", "abc", "abcdefgh"]
    t0 = time.perf_counter()
    scores = judge(["q"] * len(completions), completions)
    took = time.perf_counter() - t0
    # grade = length / 10; 'slow' times out on every try; 'flaky' succeeds on its retry; malformed -> None
    assert scores == [0.5, None, 0.5, None, None, 0.2, 0.3, 0.8]
    assert Judge.state["seen"]["flaky"] == 2 and Judge.state["seen"]["slow"] == 3  # 1 try + 2 retries
    assert Judge.state["seen"]["abcde"] == 1
    assert Judge.state["peak"] <= 3  # bounded concurrency
    assert took < 3 * 0.5 * 3 + 5  # three bounded tries of 'slow', not three 3-second waits in a row per sample
    assert Judge.state["auth"] == {f"Bearer {KEY}"}


def test_json_judge_batches(server):
    judge = RemoteJudge(f"{server}/score", kind="json", batch_size=3, concurrency=2, retries=0)
    completions = ["a", "bb", "ccc", "dddd", "wrong-length", "ff", "g"]
    assert judge(["q"] * 7, completions, answer=list("1234567")) == [1.0, 2.0, 3.0, None, None, None, 1.0]
    assert sorted(Judge.state["batches"]) == [1, 3, 3]


def test_configuration_mistakes_are_one_line_and_never_show_the_key(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    with pytest.raises(RewardError, match="answered HTTP 404") as info:
        RemoteJudge(f"{server}/missing", api_key_env="JUDGE_KEY")(["q"], ["a"])
    assert KEY not in str(info.value)
    monkeypatch.delenv("JUDGE_KEY")
    with pytest.raises(RewardError, match="JUDGE_KEY .* is not set"):
        RemoteJudge(server, api_key_env="JUDGE_KEY")
    with pytest.raises(RewardError, match="kind"):
        RemoteJudge(server, kind="grpc")
    with pytest.raises(RewardError, match="not an http"):
        RemoteJudge("127.0.0.1:8000")
    with pytest.raises(RewardError, match=r"template needs 'reference'"):
        RemoteJudge(server, template="{prompt} {completion} {reference}")(["q"], ["a"])


def test_judge_in_worker_processes_with_the_key_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    spec = {"fn": "remote_judge", "name": "judge",
            "kwargs": {"url": f"{server}/v1", "api_key_env": "JUDGE_KEY", "retries": 0, "timeout_s": 0.5}}
    with CombinedRewards([spec], workers=2, timeout_s=30) as combo:
        out = combo(["q"] * 4, ["abcd", "slow", "a", "mumble"], [{}] * 4)
    assert out.per_function["judge"].tolist()[0] == pytest.approx(0.4)
    assert out.valid.tolist() == [True, False, True, False]
    assert Judge.state["auth"] == {f"Bearer {KEY}"}


def test_judge_from_the_config_section(server, monkeypatch):
    from rlhfkit.config import build_config, dump_yaml
    from rlhfkit.rewards.functions import rewards_from_config

    monkeypatch.setenv("JUDGE_KEY", KEY)
    cfg = build_config("grpo", {}, [f"reward.remote.url={server}/score", "reward.remote.kind=json",
                                    "reward.remote.api_key_env=JUDGE_KEY", "reward.remote.weight=0.5",
                                    "reward.workers=1"])
    assert KEY not in dump_yaml(cfg) and "api_key_env: JUDGE_KEY" in dump_yaml(cfg)  # the name, never the key
    with rewards_from_config(cfg.reward) as combo:
        assert combo.names == ["judge"]
        out = combo(["q", "q"], ["ab", "abc"], [{}, {}])
    assert out.total.tolist() == [1.0, 1.5] and out.metrics["rewards/judge/mean"] == 2.5
    assert Judge.state["auth"] == {f"Bearer {KEY}"}


class Redirector(BaseHTTPRequestHandler):
    """Answers every POST with ``code`` and a Location on another port (the ``elsewhere`` server)."""

    code, target = 302, ""

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(self.code)
        self.send_header("Location", self.target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST


class Elsewhere(BaseHTTPRequestHandler):
    """Another origin: records every request it receives (it must receive none)."""

    seen: list = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        Elsewhere.seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(200)
        body = json.dumps({"scores": [1.0], "choices": [{"message": {"content": "GRADE: 10"}}]}).encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST


def _serve(handler) -> tuple[ThreadingHTTPServer, str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("kind", ["chat", "json"])
def test_a_redirect_is_never_followed_and_the_key_never_leaves(monkeypatch, code, kind):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    other, other_url = _serve(Elsewhere)
    Elsewhere.seen = []
    Redirector.code, Redirector.target = code, f"{other_url}/steal"
    judge_srv, judge_url = _serve(Redirector)
    try:
        judge = RemoteJudge(f"{judge_url}/v1" if kind == "chat" else f"{judge_url}/score", kind=kind,
                            api_key_env="JUDGE_KEY", retries=2, backoff_s=0.01, timeout_s=5)
        with pytest.raises(RewardError) as info:
            judge(["q"], ["a"])
        text = str(info.value)
        assert f"HTTP {code}, a redirect to {other_url}/steal: not followed" in text and "\n" not in text
        assert KEY not in text
        assert Elsewhere.seen == []  # the other origin never saw a request, let alone the key
    finally:
        for srv in (judge_srv, other):
            srv.shutdown()
            srv.server_close()


class Stalling(BaseHTTPRequestHandler):
    """A judge that never finishes: ``trickle`` sends its reply a byte at a time for ever, ``retry_after`` answers 503
    with a Retry-After of an hour."""

    mode, tries = "trickle", 0

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).tries += 1
        if self.mode == "retry_after":
            self.send_response(503)
            self.send_header("Retry-After", "3600")
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"busy")
            return
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            for _ in range(600):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.mark.parametrize("mode", ["trickle", "retry_after"])
def test_a_judge_that_never_finishes_costs_its_bounded_tries(mode):
    Stalling.mode, Stalling.tries = mode, 0
    srv, url = _serve(Stalling)
    try:
        judge = RemoteJudge(f"{url}/v1", retries=1, backoff_s=0.01, timeout_s=0.5)
        t0 = time.perf_counter()
        assert judge(["q"], ["a"]) == [None]
        took = time.perf_counter() - t0
    finally:
        srv.shutdown()
        srv.server_close()
    assert took < 2 * 0.5 + 1.5  # (retries + 1) x timeout_s, however the server stalls
    assert Stalling.tries == (2 if mode == "trickle" else 1)  # an hour's Retry-After is not waited for
