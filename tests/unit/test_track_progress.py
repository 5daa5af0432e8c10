"""Progress and logs: plain (non-TTY) lines every ~10% with ETA from this process's rate and the resume offset; short
metric names so counter and ETA fit in 100 columns, eval values never under a train name, one record per line off a
TTY, compact sample tables, the closing summary line."""

import io
import re
import time

import pytest
import torch
from rich.console import Console

from rlhfkit.config import build_config
from rlhfkit.track import MetricsSink, Progress, SampleLogger
from rlhfkit.track import console as console_mod
from rlhfkit.track.console import format_number
from rlhfkit.track.progress import run_summary_line, short_name

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ONLINE = {"objective/scores": 0.123456, "objective/kl": 12.3456, "val/ratio": 0.99871,
          "response/length_mean": 37.25, "policy/entropy_avg": 1.2345, "loss/policy_avg": -0.012345}


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _console():
    return Console(file=io.StringIO(), width=60)  # not a terminal -> plain lines, never wrapped


def test_plain_lines_every_tenth_with_eta_and_metrics():
    console, clock = _console(), FakeClock()
    with Progress(400, "sft", show=("loss", "lr"), console=console, clock=clock) as bar:
        for _ in range(400):
            clock.t += 0.25  # 4 steps/s
            bar.update(metrics={"loss": 1.23456, "lr": 5e-4, "hidden": 7.0})
    lines = console.file.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[2] == "[sft] 120/400 (30%) elapsed 0:00:30 eta 0:01:10 4.00 step/s loss=1.235 lr=5e-4"
    assert lines[-1].startswith("[sft] 400/400 (100%)") and "hidden" not in lines[-1]


def test_resume_offset_rate_counts_only_this_process():
    console, clock = _console(), FakeClock()
    bar = Progress(100, "ppo", unit="episode", console=console, initial=50, clock=clock)
    for _ in range(10):
        clock.t += 2.0  # 0.5 episode/s
        bar.update()
    bar.close()
    first = console.file.getvalue().splitlines()[0]
    assert first == "[ppo] 60/100 (60%) elapsed 0:00:20 eta 0:01:20 2.0 s/episode"


def test_prints_after_30s_without_a_line_and_on_close():
    console, clock = _console(), FakeClock()
    bar = Progress(1000, "rm", console=console, clock=clock)
    bar.update()
    clock.t += 31
    bar.update()
    bar.update()
    bar.close()
    lines = console.file.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["2/1000", "3/1000"]


def test_not_main_is_silent_and_number_format():
    console = _console()
    with Progress(10, "x", console=console, is_main=False) as bar:
        bar.update(10)
    assert console.file.getvalue() == ""
    assert [format_number(v) for v in (1.23456, 5e-4, 123456.0, 0.0, 3, float("nan"))] == [
        "1.235",
        "5e-4",
        "1.235e5",
        "0",
        "3",
        "nan",
    ]


def test_tty_uses_live_bar():
    console = Console(file=io.StringIO(), width=120, force_terminal=True)
    with Progress(4, "grpo", show=("loss",), console=console) as bar:
        bar.set_description("grpo [x]")
        bar.update(4, {"loss": 0.5})
    out = console.file.getvalue()
    assert "grpo [x]" in out and "4/4" in out and "loss=0.5" in out


def test_short_names():
    assert [short_name(k) for k in ("objective/scores", "objective/kl", "val/ratio", "response/length_mean",
                                    "train/loss", "eval/loss", "lr", "eval/rewards/accuracies", "train/mae",
                                    "eval/scores")] == \
        ["score", "seq_kl", "ratio", "len", "loss", "eval_loss", "lr", "eval_acc", "mae", "eval_scores"]


def test_the_bar_s_kl_is_the_per_token_kl_of_trl_and_of_the_metrics_file_and_no_two_metrics_share_a_name():
    """A grpo run's metrics.jsonl writes TRL's per-token ``kl``; the bar showed the KL summed over an answer
    (``objective/kl``, 12 where the file said 0.2) under that same name."""
    from rlhfkit.track.names import public_name
    from rlhfkit.track.progress import SHORT_NAMES
    assert short_name("objective/kl_per_token") == public_name("grpo", "objective/kl_per_token") == "kl"
    assert short_name("objective/kl") == "seq_kl"
    assert len(set(SHORT_NAMES.values())) == len(SHORT_NAMES)


def _live_text(console) -> list[str]:
    return [x for x in ANSI.sub("", console.file.getvalue()).replace("\r", "\n").splitlines() if x.strip()]


def _busy_bar(width: int, clock) -> Progress:
    """A GRPO-like bar three rollouts in, inside the fourth rollout (24 of 64 sequences generated)."""
    console = Console(file=io.StringIO(), width=width, force_terminal=True)
    bar = Progress(1000, "grpo-with-a-long-name", unit="rollout", show=tuple(ONLINE), console=console, clock=clock)
    for _ in range(3):
        clock.t += 2.0
        bar.update(1, ONLINE)
    bar.phase("rollout", total=64, unit="sequences")
    bar.advance(24)
    return bar


@pytest.mark.parametrize("width", [80, 100, 200])
def test_live_line_keeps_counter_eta_phase_and_key_metrics(width):
    clock = FakeClock()
    bar = _busy_bar(width, clock)
    text = bar.live_line(width - 1)
    bar.close()
    assert len(text) <= width - 1 and "3/1000" in text and "0:33:14" in text and "rollout 24/64" in text
    assert "score=0.1235" in text and "seq_kl=12.35" in text  # the recipe's key metrics (the first of `show`)
    if width >= 100:
        assert "ratio=0.9987" in text and "0:00:06<0:33:14" in text and "sequences" in text
        assert "…" not in text  # whole pieces dropped (rate, other metrics), nothing cut in half
    if width == 200:  # room for everything
        assert "2.0 s/rollout" in text and "pg_loss=-0.01235" in text and "grpo-with-a-long-name" in text
    else:
        assert "pg_loss" not in text  # the other metrics go first


def test_live_clock_ticks_between_updates():
    """rich redraws on its own thread: elapsed time moves while a long step runs, with no update() call."""
    clock = FakeClock()
    console = Console(file=io.StringIO(), width=100, force_terminal=True)
    with Progress(10, "grpo", show=("loss",), console=console, clock=clock, refresh_per_second=50) as bar:
        bar.update(1, {"loss": 0.5})
        bar.phase("update", total=4)
        bar.advance(2)
        clock.t += 65
        deadline = time.monotonic() + 5
        while "0:01:05<" not in console.file.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
    last = _live_text(console)
    assert any("0:01:05<" in x and "update 2/4" in x for x in last), last[-3:]


def test_plain_ticker_prints_during_a_long_phase_and_stops():
    clock = FakeClock()
    console = _console()
    bar = Progress(100, "grpo", unit="rollout", console=console, clock=clock, every_s=30, tick_s=0.01)
    with bar:
        bar.update(1)
        bar.phase("rollout", total=64, unit="sequences")
        bar.advance(24)
        clock.t += 31  # a long rollout: no update for 31 s
        deadline = time.monotonic() + 5
        while "[rollout 24/64 sequences]" not in console.file.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        n_lines = len(console.file.getvalue().splitlines())
        time.sleep(0.05)  # the clock did not move: no second line
        assert len(console.file.getvalue().splitlines()) == n_lines
    lines = console.file.getvalue().splitlines()
    # the first step took no time, the one in progress 31 s so far: it counts as a step of at least 31 s
    assert lines[0] == "[grpo] 1/100 (1%) elapsed 0:00:31 eta 0:25:19 15.5 s/rollout [rollout 24/64 sequences]"
    assert bar._ticker is not None and not bar._ticker.is_alive()  # stopped and joined by close()


def test_tty_bar_fills_100_columns_and_never_cuts_the_counter():
    console = Console(file=io.StringIO(), width=100, force_terminal=True)
    clock = FakeClock()
    with Progress(1000, "grpo-with-a-long-name", show=tuple(ONLINE), console=console, clock=clock) as bar:
        for _ in range(3):
            clock.t += 2.0
            bar.update(1, ONLINE)
    lines = _live_text(console)
    last = lines[-1]
    assert "3/1000" in last and "0:00:06<0:33:14" in last and "score=0.1235" in last
    assert max(len(x) for x in lines) <= 100


def test_plain_lines_use_short_names_and_eval_never_under_a_train_name():
    console = Console(file=io.StringIO(), width=80)  # not a terminal
    with Progress(2, "sft", show=None, console=console) as bar:
        bar.update(1, {"train/loss": 1.5, "lr": 1e-4})
        bar.update(1, {"train/loss": 1.25, "eval/loss": 2.5})
    out = console.file.getvalue()
    lines = out.splitlines()
    assert lines[-1].endswith("loss=1.25 lr=1e-4 eval_loss=2.5")
    assert "\r" not in out and not re.search(r"(?<!eval_)loss=2\.5", out)


def test_plain_lines_are_never_wrapped_at_80_columns():
    console = Console(file=io.StringIO(), width=80)
    with Progress(1, "grpo", show=tuple(ONLINE), console=console) as bar:
        bar.update(1, ONLINE)
    (line,) = console.file.getvalue().splitlines()
    assert len(line) > 80 and line.endswith("ent=1.234 pg_loss=-0.01235")


def test_shared_console_does_not_wrap_off_a_tty(monkeypatch):
    monkeypatch.setattr(console_mod, "_stdout_is_tty", lambda: False)
    console_mod.get_console.cache_clear()
    try:
        console = console_mod.get_console()
        assert console.soft_wrap and console.no_color
    finally:
        console_mod.get_console.cache_clear()


def test_sample_lines_off_a_tty_one_per_sample(tmp_path):
    console = Console(file=io.StringIO(), width=80)
    with SampleLogger(tmp_path, max_rows=2, console=console) as samples:
        samples.log(10, ["Write a poem\nabout cats", "p2", "p3"], ["line one\nline two " + "x" * 200, "r2", "r3"],
                    [0.5, -1.0, 2.0])
    lines = console.file.getvalue().splitlines()
    assert lines[0] == "samples at step 10 (2 of 3):"
    assert lines[1].startswith("  [0.5] Write a poem⏎about cats -> line one⏎line two xxx") and lines[1][-1] == "…"
    assert lines[2] == "  [-1] p2 -> r2" and len(lines) == 3


def test_sample_table_on_a_tty_is_compact(tmp_path):
    console = Console(file=io.StringIO(), width=100, force_terminal=True)
    with SampleLogger(tmp_path, max_rows=3, console=console) as samples:
        samples.log(4, [f"p{i}" for i in range(3)], [f"r{i}" for i in range(3)], [1.0] * 3)
    text = ANSI.sub("", console.file.getvalue())
    assert "samples at step 4 (3)" in text and "├" not in text and "│" not in text  # no row separators / boxes
    assert len([x for x in text.splitlines() if x.strip()]) == 6  # title, header, rule, three rows


def test_run_summary_line(tmp_path):
    with MetricsSink(tmp_path) as sink:
        for step, (score, kl) in enumerate([(0.1, 0.0), (0.3, 1.0), (0.6, 3.2)], start=1):
            sink.log({"objective/scores": score, "objective/kl": kl, "lr": 1e-5}, step)
        sink.log({"eval/scores": 0.5}, 3)  # one evaluation: shown once, not as 0.5 -> 0.5
    (tmp_path / "warnings.jsonl").write_text('{"step": 2, "name": "kl_blowup", "severity": "critical"}\n')
    line = run_summary_line("grpo", tmp_path, 23.4)
    assert line == (f"[grpo] finished in 0:00:23: score 0.1 -> 0.6, eval_scores 0.5, seq_kl 0 -> 3.2; 1 health warning "
                    f"(1 critical, warnings.jsonl); run directory {tmp_path.resolve()}")
    (tmp_path / "report.html").write_text("x")
    assert run_summary_line("grpo", tmp_path).endswith(f"; report {(tmp_path / 'report.html').resolve()}")
    assert run_summary_line("grpo", tmp_path, since=4e9).endswith("; run directory " + str(tmp_path.resolve()))
    assert run_summary_line("sft", tmp_path / "empty") == f"[sft] finished; run directory {(tmp_path / 'empty')}"


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.lin(x).squeeze(-1)


def _toy_supervised(tmp_path, monkeypatch, *overrides):
    import rlhfkit.track.progress as progress_mod
    from rlhfkit.train.lifecycle.run import start_run
    from rlhfkit.train.supervised.loop import SupervisedJob, train_supervised

    console = Console(file=io.StringIO(), width=80)
    monkeypatch.setattr(progress_mod, "get_console", lambda: console)
    xs = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    items = [{"x": x, "y": x.sum()} for x in xs]

    def collate(batch):
        return {"x": torch.stack([b["x"] for b in batch]), "y": torch.stack([b["y"] for b in batch])}

    def loss_fn(model, batch):
        return (model(batch["x"]) - batch["y"]).pow(2).mean(), {}

    def eval_fn(model, batches):
        return {"loss": 100.0}  # far from any train loss: its name on the bar is unambiguous

    job = SupervisedJob(name="toy", model=Tiny(), tokenizer=None, train_items=items, collate=collate,
                        loss_fn=loss_fn, eval_items=items[:4], eval_fn=eval_fn, show=("loss",))
    cfg = build_config("sft", {}, [f"output_dir={tmp_path}", "train.max_steps=4", "train.batch_size=8",
                                   "train.eval_every=2", "train.mixed_precision='no'", *overrides])
    train_supervised(start_run(cfg), job)
    return console.file.getvalue()


def test_supervised_bar_shows_eval_loss_as_eval_loss(tmp_path, monkeypatch):
    out = _toy_supervised(tmp_path / "a", monkeypatch)
    assert "eval_loss=100" in out and not re.search(r"(?<!eval_)loss=100", out)
    assert _toy_supervised(tmp_path / "b", monkeypatch, "track.progress=false") == ""


def test_gguf_one_time_conversion_says_what_and_where(tmp_path, monkeypatch, capsys):
    import rlhfkit.models.loading as loading

    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RANK", raising=False)
    gguf = tmp_path / "SmolLM2-135M.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    calls = []

    def fake_convert(path, out):  # the conversion itself is tested with a real model in tests/e2e
        calls.append(path)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(loading, "_convert_gguf", fake_convert)
    first, _ = loading.resolve_source(str(gguf))
    again, _ = loading.resolve_source(str(gguf))
    assert first == again and calls == [gguf] and first.startswith(str(tmp_path / "cache" / "gguf"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"[gguf] one-time conversion of {gguf}: dequantising its weights to a float32 safetensors "
                        f"model directory in {first} (about 30 s per 100M parameters; set RLHFKIT_CACHE to cache "
                        "elsewhere)")
    assert lines[1].startswith("[gguf] converted in 0 s; later runs load") and first in lines[1]
    assert len(lines) == 2  # converted here: the tokenizer, policy and reference resolving it again say nothing
    monkeypatch.setattr(loading, "_GGUF_SAID", set())  # a later run (a new process)
    for _ in range(3):
        assert loading.resolve_source(str(gguf))[0] == first
    assert capsys.readouterr().out.splitlines() == [
        f"[gguf] SmolLM2-135M.Q8_0.gguf: using the cached conversion in {first}"]  # once a run
