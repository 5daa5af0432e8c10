"""Plain (non-TTY) progress lines: every ~10%, ETA from this process's rate, resume offset."""

import io

from rich.console import Console

from rlhfkit.track import Progress
from rlhfkit.track.progress import format_number


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
