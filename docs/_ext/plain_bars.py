"""Bars in docstrings are maths, not reStructuredText substitutions.

The docstrings write an absolute value or a size the way the code's comments do: ``|y_i|``, ``|pi - pi_old|``,
``|V|``. In reStructuredText ``|name|`` is a substitution reference, and an undefined one is an error. No docstring
of rlhfkit defines or uses a substitution, so on ``autodoc-process-docstring`` every ``|...|`` outside a literal
(double backquotes) or a literal block (after ``::``) has its bars escaped and reads as written.
"""

from __future__ import annotations

import re

BARS = re.compile(r"(?<![\\|])\|(?=\S)([^|\n]*?\S)\|(?![|_])")
LITERAL = re.compile(r"(``.*?``)")


def escape_bars(line: str) -> str:
    """``line`` with each ``|x|`` outside double backquotes written ``\\|x\\|``."""
    parts = LITERAL.split(line)
    return "".join(p if i % 2 else BARS.sub(r"\\|\1\\|", p) for i, p in enumerate(parts))


def _process(app, what, name, obj, options, lines: list[str]) -> None:
    block_indent = None  # inside a literal block: the indentation of the paragraph that opened it
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if block_indent is not None:
            if line.strip() and indent <= block_indent:
                block_indent = None
            else:
                continue
        lines[i] = escape_bars(line)
        if line.rstrip().endswith("::"):
            block_indent = indent


def setup(app):
    app.connect("autodoc-process-docstring", _process)
    return {"parallel_read_safe": True}
