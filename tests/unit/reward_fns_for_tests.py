"""Reward functions used by tests/unit/test_rewards.py (loaded as `reward_fns_for_tests:<name>` or by file path)."""

from __future__ import annotations

NOT_CALLABLE = 3


def contains_yes(prompts, completions, **fields):
    """1.0 when the completion contains "yes", else 0.0."""
    return [1.0 if "yes" in c else 0.0 for c in completions]


def half_none(prompts, completions, **fields):
    """No opinion (None) on even rows; 1.0 on odd rows."""
    return [None if i % 2 == 0 else 1.0 for i in range(len(completions))]


def only_answer(prompts, completions, answer):
    """Takes the `answer` column only (no **fields): other columns must not be passed."""
    return [float(len(a)) for a in answer]


def one_short(prompts, completions, **fields):
    return [0.0] * (len(completions) - 1)


def returns_text(prompts, completions, **fields):
    return ["good"] * len(completions)


def returns_nan(prompts, completions, **fields):
    return [float("nan")] * len(completions)


def returns_scalar(prompts, completions, **fields):
    return 1.0


def echo_pattern(prompts, completions, pattern="default", **fields):
    """1.0 when `pattern` (a kwarg, possibly shadowed by a dataset column) is "from-config"."""
    return [1.0 if pattern == "from-config" else 0.0 for _ in completions]


def returns_none(prompts, completions, **fields):
    return [None] * len(completions)


def returns_bool(prompts, completions, **fields):
    return [True] * len(completions)


def some_bad(prompts, completions, **fields):
    """[1, nan, inf, None, -inf, 2] (for 6 completions)."""
    return [1.0, float("nan"), float("inf"), None, float("-inf"), 2.0][: len(completions)]


def raises_on_b(prompts, completions, **fields):
    """1.0 per completion, but a completion "b" divides by zero."""
    if "b" in completions:
        raise ZeroDivisionError("no b allowed")
    return [1.0] * len(completions)


def one_argument(completions):
    return [1.0 for _ in completions]


def slow_on_hang(prompts, completions, **fields):
    """Sleeps for ever on a completion "hang"; 1.0 for the others."""
    import time

    if "hang" in completions:
        time.sleep(3600)
    return [1.0] * len(completions)


def crash_on_die(prompts, completions, **fields):
    """Kills its own process on a completion "die" (a segfault / OOM kill as the trainer sees it)."""
    import os

    if "die" in completions:
        os._exit(9)
    return [0.5] * len(completions)


def chatty(prompts, completions, **fields):
    """Prints on stdout (must not disturb the worker protocol)."""
    print("reward says hello " * 100)
    return [len(c) for c in completions]


def floods(prompts, completions, **fields):
    """Prints about 20 MB on stdout and 2 MB on stderr (through Python and straight to the descriptor)."""
    import os
    import sys

    line = "flood " * 170 + "\n"
    for _ in range(20_000):
        sys.stdout.write(line)
    sys.stdout.flush()
    for _ in range(2_000):
        os.write(2, line.encode())
    return [1.0] * len(completions)


class CountingReward:
    """A reward with state, built once per worker: each score is (pid mod 1000) * 100 + calls so far + bonus."""

    def __init__(self, bonus: float = 0.0):
        import os

        self.pid, self.calls, self.bonus = os.getpid(), 0, bonus

    def __call__(self, prompts, completions, answer=None):
        self.calls += 1
        return [(self.pid % 1000) * 100 + self.calls + self.bonus for _ in completions]


class BrokenReward:
    def __init__(self):
        raise OSError("model file missing")

    def __call__(self, prompts, completions, **fields):
        return [0.0] * len(completions)


def pays_for_short(prompts, completions, **fields):
    """A buggy brevity reward: 1 / (1 + length), so the empty completion gets the most."""
    return [1.0 / (1.0 + len(c)) for c in completions]


def pays_for_long(prompts, completions, **fields):
    """A hackable length reward: longer is better, up to 1."""
    return [min(1.0, len(c) / 1000) for c in completions]


def first_hashes(prompts, completions, answer, **fields):
    """A verifier reading the *first* `#### n` line: hackable by stating several answers."""
    import re

    out = []
    for c, a in zip(completions, answer):
        m = re.search(r"####\s*(\S+)", c)
        out.append(float(m is not None and m.group(1) == str(a).replace("#### ", "")))
    return out


def pays_for_target_length(prompts, completions, **fields):
    """1 at 40 characters, falling linearly with the distance (bench/vs_trl.py's reward): very negative for 4,000."""
    return [1.0 - abs(len(c) - 40) / 40 for c in completions]


def far_below_clip(prompts, completions, **fields):
    """Scores in [-30, -20] (more for longer answers, up to 10 characters): all beyond the default clip of 10."""
    return [-30.0 + min(len(c.strip()), 10) for c in completions]


class RecordsSetup:
    """A reward with a slow constructor that records, per worker process, when it started and ended."""

    def __init__(self, path: str, seconds: float = 1.5):
        import os
        import time

        start = time.time()
        time.sleep(seconds)
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {start} {time.time()}\n")

    def __call__(self, prompts, completions, **fields):
        return [0.0] * len(completions)


def short_for_long(prompts, completions, **fields):
    """1.0 per completion, but one value too few when a completion is longer than 100 characters (a bug that only
    some batches meet)."""
    out = [1.0] * len(completions)
    return out[:-1] if any(len(c) > 100 for c in completions) else out


def always_hangs(prompts, completions, **fields):
    import time

    time.sleep(3600)


def one_unnamed(texts):
    """One parameter that neither convention names: refused when the run starts."""
    return [0.0] * len(texts)


def hang_sleep(prompts, completions, **fields):
    """Never returns: sleeps."""
    import time

    time.sleep(10**6)


def hang_busy(prompts, completions, **fields):
    """Never returns: a busy loop."""
    while True:
        pass


def hang_swallowing(prompts, completions, **fields):
    """Never returns, and swallows every exception a timer could raise into it."""
    import time

    while True:
        try:
            time.sleep(10**6)
        except Exception:  # noqa: BLE001 - the point of the test
            pass


async def hang_async(prompts, completions, **kwargs):
    """An ``async def`` reward that never finishes."""
    import asyncio

    await asyncio.sleep(10**6)


def exits_on_b(prompts, completions, **fields):
    """``sys.exit(0)`` inside a reward, on a completion "b"; 1.0 for the others."""
    import sys

    if "b" in completions:
        sys.exit(0)
    return [1.0] * len(completions)
def wrong_length(prompts, completions, **fields):
    """Certainly a bug: one value fewer than the completions (the probe stops it before any weights load)."""
    return [1.0] * (len(completions) - 1)
