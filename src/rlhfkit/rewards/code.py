"""The code verifier: the completion's code run against the record's tests in the sandbox
(:mod:`rlhfkit.rewards.sandbox`); the score is the fraction of tests passed.

``code_tests(prompts, completions, tests=[...])`` reads, for each row, the ``field`` column (default ``tests``) as:

- **assert tests**: a list of Python snippets (``["assert add(1, 2) == 3", ...]``), or one string of them (each
  top-level statement is one test); the program runs once, then each test in its namespace; a test passes when it
  raises nothing;
- **stdin / stdout pairs**: a list of ``{"input": ..., "output": ...}``, or ``{"inputs": [...], "outputs": [...]}``
  (the APPS / CodeContests layout); the program runs once per pair with that stdin, and passes when it exits with
  0 and its stdout equals the expected output up to trailing whitespace on each line and trailing blank lines;
- a JSON string of either form (as data sets often store them).

The code is the last fenced block of the completion (````` ```python `````, ````` ```py ````` or a bare fence); a
completion without a fence is run whole unless ``require_block`` is set (then it scores 0). A program that loops,
allocates without limit, forks, opens a socket, writes outside its directory or prints without limit fails its
tests within the sandbox's limits; the rest of the batch is scored as usual. A row without tests scores ``None``.

Where it runs: in a run, :func:`settle_sandboxes` decides the isolation once in the trainer before any weights load
(``reward.sandbox.isolation``, or this function's ``isolation`` kwarg): ``auto`` is the ``namespaces`` boundary or a
refusal naming the cause and its fix (one line, exit 2); a weaker level runs only where it is named, said as a
warning naming what it lets through (``docs/sandbox.md``); ``reward.sandbox.require_boundary`` refuses even that.
The decided level goes to the workers, which set the sandbox up and check it again
(:meth:`~rlhfkit.rewards.sandbox.Sandbox.probe`) on their first call. A program that tries to leave the sandbox (read
the home or the run directory, the trainer's environment, write outside, start a process or another program, a
socket, a signal to the worker, ``ctypes``, another process's memory) fails inside it and scores what its tests give;
the rest of the batch is scored as usual (``tests/unit/test_sandbox_escapes.py``).
Each program is bounded by ``wall_s``, so ``reward.timeout_s`` must cover a chunk of the batch: about (completions
per worker) x (stdin pairs per row) x ``wall_s`` in the worst case.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from .rules import _column
from .sandbox import Limits, Sandbox, SandboxError, announce

CODE_TESTS = ("code_tests", "rlhfkit.rewards.code:code_tests")  # how a run's config names this function

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_SANDBOXES: dict[tuple, Sandbox] = {}


def extract_code(completion: str, require_block: bool = False) -> str | None:
    """The last fenced code block of ``completion`` (an unclosed last fence runs to the end), or the whole text when
    there is no fence and ``require_block`` is False."""
    blocks = _FENCE.findall(completion)
    if blocks:
        return blocks[-1]
    return None if require_block else completion


def parse_tests(value: Any) -> tuple[str, list] | None:
    """``("asserts", [snippet, ...])`` or ``("stdio", [(input, output), ...])`` from a row's tests, None when the row
    has none. Raises ``ValueError`` for a value of another shape."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if text[0] in "[{":
            try:
                return parse_tests(json.loads(text))
            except json.JSONDecodeError:
                pass
        return "asserts", _statements(text)
    if isinstance(value, dict):
        if "inputs" in value and "outputs" in value:
            return "stdio", [(str(i), str(o)) for i, o in zip(value["inputs"], value["outputs"])]
        if "input" in value and "output" in value:
            return "stdio", [(str(value["input"]), str(value["output"]))]
    if isinstance(value, (list, tuple)):
        if not value:
            return None
        if all(isinstance(t, str) for t in value):
            return "asserts", list(value)
        if all(isinstance(t, dict) and "input" in t and "output" in t for t in value):
            return "stdio", [(str(t["input"]), str(t["output"])) for t in value]
    raise ValueError(f"tests must be assert strings or {{input, output}} pairs, got {type(value).__name__} "
                     f"({str(value)[:60]!r})")


def _statements(text: str) -> list[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return [text]
    return [ast.get_source_segment(text, node) or ast.unparse(node) for node in tree.body]


def _same_output(got: str, expected: str) -> bool:
    def norm(s: str) -> list[str]:
        lines = [line.rstrip() for line in s.replace("\r\n", "\n").split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return lines

    return norm(got) == norm(expected)


def settle_sandboxes(specs: list, section: Any = None, say=None) -> list:
    """The trainer's side of a run's code sandboxes, before any weights load (module docstring): ``specs`` (reward
    function specs with ``fn`` and ``kwargs``, as the config holds them) with each ``code_tests`` given the isolation
    decided here as its ``isolation`` kwarg; ``section``: the run's ``reward.sandbox`` (``isolation``,
    ``require_boundary``). One line per distinct level asked for (usually one); :class:`SandboxError` when the
    boundary (``auto``), a level named, or a required boundary cannot be had."""
    default = getattr(section, "isolation", "auto")
    require = bool(getattr(section, "require_boundary", False))
    decided: dict[str, str] = {}
    out = []
    for spec in specs:
        fn, kwargs = getattr(spec, "fn", None), dict(getattr(spec, "kwargs", None) or {})
        if not (isinstance(fn, str) and fn.strip() in CODE_TESTS or fn is code_tests):
            out.append(spec)
            continue
        asked = str(kwargs.get("isolation", default))
        if asked not in decided:
            decided[asked] = announce(asked, require, say)
        kwargs["isolation"] = decided[asked]
        out.append({"fn": fn, "weight": spec.weight, "name": spec.name, "kwargs": kwargs})
    return out


def sandbox_for(isolation: str, limits: Limits) -> Sandbox:
    """One probed sandbox per (isolation, limits) and process."""
    key = (isolation, limits)
    if key not in _SANDBOXES:
        box = Sandbox(limits, isolation)
        box.probe()  # SandboxError: the run stops here with one line
        _SANDBOXES[key] = box
    return _SANDBOXES[key]


def score_program(box: Sandbox, code: str, tests: tuple[str, list]) -> float:
    """Fraction of ``tests`` that ``code`` passes in ``box``."""
    kind, cases = tests
    if kind == "asserts":
        result = box.run(code, tests=cases)
        return sum(result.passed) / len(cases)
    passed = 0
    for stdin, expected in cases:
        result = box.run(code, stdin=stdin)
        passed += result.returncode == 0 and not result.timed_out and not result.output_capped and _same_output(
            result.stdout, expected)
    return passed / len(cases)


def code_tests(
    prompts: list[str],
    completions: list[str],
    *,
    field: str = "tests",
    require_block: bool = False,
    isolation: str = "auto",
    wall_s: float = 10.0,
    cpu_s: float = 5.0,
    memory_mb: int = 512,
    output_bytes: int = 1_000_000,
    **fields,
) -> list[float | None]:
    """Fraction of the row's tests (column ``field``) that the completion's code passes in the sandbox (module
    docstring); None for a row without tests. ``isolation``: auto | namespaces | unshare | process
    (:mod:`rlhfkit.rewards.sandbox`; in a run, decided by :func:`settle_sandboxes`); the limits are per program
    run. The sandbox is probed at the first row with tests: a batch without any asks nothing of the machine (an
    unknown ``isolation`` is refused at once all the same)."""
    limits = Limits(wall_s=wall_s, cpu_s=cpu_s, memory_mb=memory_mb, output_bytes=output_bytes)
    Sandbox(limits, isolation)  # not probed: an unknown isolation is refused here at once, with the levels
    box: Sandbox | None = None
    column = _column(fields, field, "code_tests", len(completions))
    out: list[float | None] = []
    for i, (completion, value) in enumerate(zip(completions, column)):
        try:
            tests = parse_tests(value)
        except ValueError as exc:
            raise SandboxError(f"code_tests: row {i}: {exc}", where=f"data: the {field!r} column",
                               fix="give a list of assert strings or of {input, output} pairs") from None
        if tests is None:
            out.append(None)
            continue
        code = extract_code(completion, require_block)
        if code is None or not code.strip():
            out.append(0.0)
            continue
        box = box or sandbox_for(isolation, limits)
        out.append(score_program(box, code, tests))
    return out
