"""Every code block of the documentation, found and made runnable (``make docs`` runs them: test_doc_blocks.py).

The pages are Markdown (``docs/**/*.md`` and ``README.md``). A block is a fenced code block; its language says what
is done with it:

- ``python``: run as written, in the page's working directory (one per page, blocks in page order, so a later block
  can read what an earlier one wrote);
- ``bash`` / ``sh`` / ``shell``: each command run in that directory (``\\`` continuations joined, ``#`` comments
  dropped). A training command (``rlhfkit <recipe>``, also under ``torchrun -m rlhfkit.cli``) gets the flags that
  make it a tiny, short run (``tiny_run_flags``: one or two updates, no report); every other command runs as
  written;
- ``yaml``: parsed as rlhfkit config keys: it must build a valid config for its recipe (``recipe:`` in the block,
  ``<!-- docs: recipe NAME -->`` before it, else any recipe it is valid for);
- ``json`` / ``jsonl``: parsed;
- ``text``, ``console``, ``jinja``, ``toml`` and ``output``: shown, never run (program output, templates, other files).

An indented (unfenced) code block is an error: every block says its language. An HTML comment right before a block
steers it (several lines, one directive each):

- ``<!-- docs: illustrative REASON -->``: not run, and REASON (required) says why (needs a GPU, a cluster, the
  network...);
- ``<!-- docs: setup COMMAND -->``: a shell command run first, hidden from the reader (files the block expects);
- ``<!-- docs: set KEY=VALUE -->``: in each command of the block, the ``KEY=...`` argument becomes ``KEY=VALUE``
  (added when absent): a local file or the tiny model for what the page writes for the reader's own;
- ``<!-- docs: recipe NAME -->`` (yaml): the recipe the block's keys are checked against;
- ``<!-- docs: timeout SECONDS -->``: the block's time limit (default 300 s);
- ``<!-- docs: file NAME -->``: the block is a file the reader writes (a reward module, an environment, a config):
  it is written to NAME in the page's directory (a Python file is also compiled), for the blocks after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
RUN = {"python", "bash", "sh", "shell", "yaml", "yml", "json", "jsonl"}
SHOWN = {"text", "console", "jinja", "toml", "output", "diff"}
DIRECTIVE = re.compile(r"^\s*docs:\s*(illustrative|setup|set|recipe|timeout|file)\b\s*(.*?)\s*$")


@dataclass
class Block:
    """One code block: where it is, its language and text, and what its comment asks."""
    page: Path
    line: int
    lang: str
    text: str
    illustrative: str | None = None
    setup: list[str] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)
    recipe: str | None = None
    timeout: float = 300.0
    file: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.illustrative is None and self.lang in RUN


class DocError(ValueError):
    """A block the runner cannot accept (no language, an unknown one, a malformed directive)."""


def pages() -> list[Path]:
    """Every documentation page: README.md and docs/**/*.md (not a build's output)."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    return [ROOT / "README.md", *docs]


def _directives(html: str, where: str) -> list[tuple[str, str]]:
    found = []
    for comment in re.findall(r"<!--(.*?)-->", html, flags=re.S):
        for line in comment.strip().splitlines():
            if not line.strip().startswith("docs:"):
                continue
            m = DIRECTIVE.match(line)
            if not m:
                raise DocError(f"{where}: unknown docs directive {line.strip()!r} (illustrative, setup, set, recipe, "
                               "timeout, file)")
            found.append((m.group(1), m.group(2)))
    return found


def blocks_of(page: Path, text: str | None = None) -> list[Block]:
    """The code blocks of ``page`` in order, with the directives of the comment right before each."""
    text = page.read_text() if text is None else text
    tokens = MarkdownIt("commonmark").parse(text)
    out: list[Block] = []
    pending: list[tuple[str, str]] = []
    for tok in tokens:
        line = (tok.map[0] + 1) if tok.map else 0
        where = f"{page.name}:{line}"
        if tok.type == "html_block":
            pending.extend(_directives(tok.content, where))
            continue
        if tok.type == "code_block":
            raise DocError(f"{where}: an indented code block; write it as a fenced block with its language")
        if tok.type != "fence":
            if tok.nesting == 1 and tok.level == 0 and pending:  # a directive steers only the block right after it
                raise DocError(f"{where}: a docs directive that no code block follows")
            continue
        if tok.info.strip().startswith("{"):  # a MyST directive ({toctree}, {eval-rst}): markup, not code
            pending = []
            continue
        lang = (tok.info.split() or [""])[0].lower()
        if not lang:
            raise DocError(f"{where}: a code block without a language (python, bash, yaml, text, ...)")
        if lang not in RUN | SHOWN:
            raise DocError(f"{where}: language {lang!r} is neither run ({', '.join(sorted(RUN))}) nor shown "
                           f"({', '.join(sorted(SHOWN))})")
        block = Block(page, line, lang, tok.content)
        for name, value in pending:
            if name == "illustrative":
                if not value:
                    raise DocError(f"{where}: 'docs: illustrative' needs its reason")
                block.illustrative = value
            elif name == "setup":
                block.setup.append(value)
            elif name == "set":
                if "=" not in value:
                    raise DocError(f"{where}: 'docs: set' takes KEY=VALUE")
                block.sets.append(value)
            elif name == "recipe":
                block.recipe = value
            elif name == "timeout":
                block.timeout = float(value)
            elif name == "file":
                if not value or "/" in value.strip("./") and ".." in value:
                    raise DocError(f"{where}: 'docs: file' takes a relative file name")
                block.file = value
        pending = []
        out.append(block)
    return out


def commands(script: str) -> list[str]:
    """The commands of a shell block: continuations joined, comments and blank lines dropped."""
    joined, buf = [], ""
    for raw in script.splitlines():
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        part = line.strip() if buf else line
        if part.endswith("\\"):
            buf += part[:-1].rstrip() + " "
            continue
        buf += part
        joined.append(_strip_comment(buf).strip())
        buf = ""
    if buf.strip():
        joined.append(_strip_comment(buf).strip())
    return [c for c in joined if c]


def _strip_comment(command: str) -> str:
    """``cmd args  # a comment`` -> ``cmd args`` (a ``#`` inside quotes, or not after a space, stays)."""
    quote = None
    for i, ch in enumerate(command):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i]
    return command


def apply_sets(argv: list[str], sets: list[str]) -> list[str]:
    """Each ``KEY=VALUE`` of ``sets`` replaces the argument ``KEY=...`` (as written) or is added."""
    out = list(argv)
    for item in sets:
        key = item.split("=", 1)[0]
        for i, arg in enumerate(out):
            if arg.split("=", 1)[0] in (key, f"--{key}"):
                out[i] = item
                break
        else:
            out.append(item)
    return out
