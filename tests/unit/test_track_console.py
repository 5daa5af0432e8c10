"""print0 and the shared console."""

import io

from rich.console import Console

from rlhfkit.track import get_console, print0


def test_print0_only_on_main():
    console = Console(file=io.StringIO(), width=20)
    print0("hello", "world " * 10, console=console)
    print0("hidden", is_main=False, console=console)
    out = console.file.getvalue()
    assert out.count("\n") == 1 and "hello" in out and "hidden" not in out  # soft wrap: one line


def test_shared_console_is_one_object():
    assert get_console() is get_console()
