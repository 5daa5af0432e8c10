"""samples.jsonl rows and the console table."""

import io

import pytest
from rich.console import Console

from rlhfkit.track import SampleLogger, read_samples


def _console():
    return Console(file=io.StringIO(), width=120)


def test_samples_appended_and_table_printed(tmp_path):
    console = _console()
    logger = SampleLogger(tmp_path, max_rows=2, console=console, max_chars=40)
    long = "word " * 100
    logger.log(
        7, ["p1", "p2", "p3"], [long, "[bold]not markup[/bold]", "r3"], [0.5, -1.0, 2.0], {"len": [9, 4, 2]}
    )
    logger.log(8, ["p4"], ["r4"], None)
    logger.close()

    rows = read_samples(tmp_path)
    assert [r["step"] for r in rows] == [7, 7, 7, 8]
    assert rows[0] == {"step": 7, "prompt": "p1", "response": long, "score": 0.5, "len": 9}
    assert rows[3]["score"] is None

    out = console.file.getvalue()
    assert "samples at step 7 (2 of 3)" in out and "samples at step 8" in out
    assert "…" in out and long not in out  # long response shortened in the table only
    assert "[bold]not markup[/bold]" in out  # printed literally, not as rich markup
    assert "p3" not in out  # max_rows


def test_length_mismatch_and_not_main(tmp_path):
    with pytest.raises(ValueError, match="differ in length"):
        SampleLogger(tmp_path, console=_console()).log(1, ["a", "b"], ["x"], None)
    console = _console()
    SampleLogger(tmp_path / "other", is_main=False, console=console).log(1, ["a"], ["x"], [1.0])
    assert not (tmp_path / "other").exists() and console.file.getvalue() == ""


@pytest.mark.parametrize("width", [20, 40, 63, 80, 200])
def test_the_table_renders_at_any_width(tmp_path, width):
    # a table whose rule and columns fit the terminal, or, narrower than its columns need, the plain lines that fold;
    # never a header cut mid-word nor a column squeezed out
    from rich.console import Console

    console = Console(width=width, force_terminal=True, record=True, color_system=None)
    logger = SampleLogger(tmp_path / str(width), console=console)
    logger.log(3, ["What is 2+2? Please answer carefully and at length."] * 2,
               ["The answer is 4, because two plus two makes four.", "5"], [1.0, 0.0],
               extra={"golden_answer": ["4", "4"]})
    text = console.export_text()
    if width >= logger.min_table_width(read_samples(tmp_path / str(width))):
        lines = text.splitlines()
        assert all(len(line) <= width for line in lines)
        head = next(line for line in lines if "prompt" in line)
        assert "response" in head and "score" in head and "golden_answer" in head
    else:
        assert "[1] What is 2+2?" in text and "golden_answer=4" in text  # one line a sample, soft-wrapped
