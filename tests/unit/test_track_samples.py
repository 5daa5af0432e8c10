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
