"""The remote judge: a reward computed by an HTTP service (``reward.remote``).

Two kinds of endpoint:

- ``chat``: an OpenAI-compatible chat-completions endpoint (``{url}/chat/completions`` unless ``url`` already ends
  so: vLLM, SGLang, TGI, llama.cpp's server, OpenAI). Each completion is graded on its own: ``template`` is filled
  with ``{prompt}``, ``{completion}`` and the row's fields (``{answer}``, ...), sent as one user message with
  ``temperature`` 0, and the grade is read from the reply with ``grade_pattern`` (its first group, a number) and
  divided by ``max_grade``: the score is in [0, 1]. A reply without a readable grade scores ``None``.
- ``json``: a plain JSON endpoint, ``POST url`` with ``{"prompts": [...], "completions": [...], "fields": {name:
  [...]}}`` for a batch of ``batch_size`` samples, answered by ``{"scores": [...]}`` (or a bare list), one number or
  null per completion. A reply of the wrong length or shape scores ``None`` for its batch.

Requests run ``concurrency`` at a time (threads); each try has ``timeout_s`` in all (connecting, sending, and the
whole reply: a server that trickles its answer a byte at a time is cut off there) and is retried up to ``retries``
times on a connection error, a timeout, HTTP 429 or 5xx, waiting ``backoff_s * 2**attempt`` (with jitter, or the
server's ``Retry-After``) between tries. A request, its tries and waits included, ends within ``(retries + 1) x
timeout_s``: a wait that would pass that (a ``Retry-After`` of minutes) is not waited. What still fails scores
``None`` (the run goes on; a step where every sample fails stops as for any reward function); the worker running
the judge is bounded by ``reward.timeout_s`` besides. HTTP 400 / 401 / 403 / 404 are configuration mistakes (a
wrong URL, model or key), answered with one line at once.

The API key is read from the environment variable named by ``api_key_env`` (never from the config: ``config.yaml``,
the logs and the report hold only the variable's name) and sent as ``Authorization: Bearer``; no message of this
module includes it. **Redirects are never followed** (Python's ``urllib`` would follow a 301 / 302 / 303 to any
host with the ``Authorization`` header copied): a judge that answers with a redirect stops the run with one line
naming where it pointed, so that the key and the completions go only to ``url``. A reply is read up to
:data:`MAX_REPLY_BYTES` (a larger one scores ``None``). HTTP uses the standard library (:mod:`urllib.request`):
a judge call is one small POST, and threads give the bounded concurrency; no dependency does this better enough to
be worth one more.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import RewardError

WHERE = "reward.remote"
KINDS = ("chat", "json")
DEFAULT_TEMPLATE = (
    "You are grading an answer to a question.\n\nQuestion:\n{prompt}\n\nAnswer:\n{completion}\n\n"
    "Rate the answer from 0 (wrong or useless) to 10 (correct and complete). Reply with one line: GRADE: <number>"
)
DEFAULT_GRADE_PATTERN = r"GRADE\s*[:=]\s*(-?\d+(?:\.\d+)?)"
_CONFIG_MISTAKES = {400, 401, 403, 404, 405, 422}
MAX_REPLY_BYTES = 16 << 20


class _Redirected(Exception):
    def __init__(self, code: int, target: str):
        super().__init__(code, target)
        self.code, self.target = code, target


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Every redirect (301, 302, 303, 307, 308) refused: raised, never followed (the request would go to another
    address with the ``Authorization`` header)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise _Redirected(code, newurl)


_OPENER = urllib.request.build_opener(_RefuseRedirects)


class _Retryable(Exception):
    pass


class RemoteJudge:
    """A reward class (built once per worker): ``RemoteJudge(url=..., kind=...)(prompts, completions, **fields)``;
    see the module docstring for every option."""

    def __init__(
        self,
        url: str,
        kind: str = "chat",
        model: str | None = None,
        api_key_env: str | None = None,
        template: str | None = None,
        grade_pattern: str | None = None,
        max_grade: float = 10.0,
        max_tokens: int = 256,
        batch_size: int = 16,
        concurrency: int = 4,
        retries: int = 3,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
    ):
        if kind not in KINDS:
            raise RewardError(f"unknown remote judge kind {kind!r}", where=f"{WHERE}.kind", fix="use chat or json")
        if not url or not re.match(r"^https?://", url):
            raise RewardError(f"remote judge url {url!r} is not an http(s) URL", where=f"{WHERE}.url",
                              fix="give e.g. http://127.0.0.1:8000/v1 (chat) or http://host/score (json)")
        self.kind, self.model, self.template = kind, model, DEFAULT_TEMPLATE if template is None else template
        grade_pattern = DEFAULT_GRADE_PATTERN if grade_pattern is None else grade_pattern
        self.url = url.rstrip("/")
        if kind == "chat" and not self.url.endswith("/chat/completions"):
            self.url += "/chat/completions"
        try:
            self.grade = re.compile(grade_pattern)
        except re.error as exc:
            raise RewardError(f"bad grade_pattern {grade_pattern!r}: {exc}", where=f"{WHERE}.grade_pattern",
                              fix="write a Python regular expression whose first group is the number") from None
        self.max_grade, self.max_tokens, self.batch_size = float(max_grade), max_tokens, max(1, batch_size)
        self.concurrency, self.retries, self.backoff_s, self.timeout_s = max(1, concurrency), retries, backoff_s, \
            timeout_s
        self._key = None
        if api_key_env:
            self._key = os.environ.get(api_key_env)
            if not self._key:
                raise RewardError(f"environment variable {api_key_env} (the judge's API key) is not set",
                                  where=f"{WHERE}.api_key_env", fix=f"export {api_key_env}=... before the run")

    # ── scoring ──────────────────────────────────────────────────────────────────────────────────────────────
    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields) -> list[float | None]:
        n = len(completions)
        columns = {k: list(v) for k, v in fields.items()}
        if self.kind == "chat":
            jobs = [(self._grade_one, (prompts[i], completions[i], {k: v[i] for k, v in columns.items()}))
                    for i in range(n)]
            spans = [(i, i + 1) for i in range(n)]
        else:
            spans = [(s, min(n, s + self.batch_size)) for s in range(0, n, self.batch_size)]
            jobs = [(self._score_batch, (list(prompts[a:b]), list(completions[a:b]),
                                         {k: v[a:b] for k, v in columns.items()})) for a, b in spans]
        out: list[float | None] = [None] * n
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            results = list(pool.map(lambda job: job[0](*job[1]), jobs))
        for (a, b), values in zip(spans, results):
            out[a:b] = values
        return out

    def _grade_one(self, prompt: str, completion: str, row: dict) -> list[float | None]:
        try:
            content = self.template.format(prompt=prompt, completion=completion, **row)
        except (KeyError, IndexError, ValueError) as exc:
            raise RewardError(f"the judge template needs {exc} which the row does not have", where=f"{WHERE}.template",
                              fix="use {prompt}, {completion} and the data's own columns; write {{ }} for braces") \
                from None
        body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": self.max_tokens}
        if self.model:
            body["model"] = self.model
        reply = self._post(body)
        try:
            text = reply["choices"][0]["message"]["content"]
        except (TypeError, KeyError, IndexError):
            return [None]
        matches = self.grade.findall(text or "")
        if not matches:
            return [None]
        last = matches[-1]
        try:
            grade = float(last[0] if isinstance(last, tuple) else last)
        except ValueError:
            return [None]
        return [grade / self.max_grade]

    def _score_batch(self, prompts: list, completions: list, fields: dict) -> list[float | None]:
        reply = self._post({"prompts": prompts, "completions": completions, "fields": fields})
        scores = reply.get("scores") if isinstance(reply, dict) else reply
        if not isinstance(scores, list) or len(scores) != len(completions):
            return [None] * len(completions)
        return [float(s) if isinstance(s, (int, float)) and not isinstance(s, bool) else None for s in scores]

    # ── HTTP ─────────────────────────────────────────────────────────────────────────────────────────────────
    def _post(self, body: dict) -> Any:
        """The decoded JSON reply; None when every try failed, the reply is not JSON, or the request's time
        (``(retries + 1) x timeout_s``, waits included) is spent."""
        data = json.dumps(body, default=str).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        deadline = time.monotonic() + (self.retries + 1) * self.timeout_s
        for attempt in range(self.retries + 1):
            try:
                return self._once(data, headers, deadline)
            except _Retryable as exc:
                if attempt == self.retries:
                    return None
                wait = exc.args[0] if exc.args and exc.args[0] is not None else self.backoff_s * 2**attempt
                wait *= 0.5 + random.random()
                if time.monotonic() + wait >= deadline:  # a Retry-After of minutes: not waited for
                    return None
                time.sleep(wait)
        return None

    def _once(self, data: bytes, headers: dict, deadline: float) -> Any:
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        ends = min(deadline, time.monotonic() + self.timeout_s)  # this try's end, the whole reply included
        try:
            with _OPENER.open(request, timeout=max(0.01, ends - time.monotonic())) as response:
                raw = bytearray()
                while len(raw) <= MAX_REPLY_BYTES:
                    chunk = response.read1(1 << 16)
                    if not chunk:
                        break
                    raw += chunk
                    if time.monotonic() > ends:  # a reply trickling past the try's time
                        raise _Retryable(None)
        except _Redirected as exc:
            raise RewardError(f"the judge at {self.url} answered HTTP {exc.code}, a redirect to {exc.target}: not "
                              "followed (rlhfkit never sends the judge's request or its API key to another address)",
                              where=f"{WHERE}.url", fix="set reward.remote.url to the address that answers "
                              "itself (check the redirect's target first)") from None
        except urllib.error.HTTPError as exc:
            if exc.code in _CONFIG_MISTAKES:
                raise RewardError(f"the judge at {self.url} answered HTTP {exc.code} {exc.reason}",
                                  where=WHERE, fix=_fix_for(exc.code)) from None
            retry_after = exc.headers.get("Retry-After") if exc.headers else None
            raise _Retryable(float(retry_after) if retry_after and retry_after.isdigit() else None) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            raise _Retryable(None) from exc
        if len(raw) > MAX_REPLY_BYTES:
            return None
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None


def _fix_for(code: int) -> str:
    if code in (401, 403):
        return "check the API key in the environment variable named by reward.remote.api_key_env"
    if code in (404, 405):
        return "check reward.remote.url (a chat judge takes the base URL, e.g. http://host:8000/v1)"
    return "check reward.remote.model and the request the endpoint expects (reward.remote.kind)"
