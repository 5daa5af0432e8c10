"""The documentation's code blocks: every one runs (``-m docs``, run by ``make docs`` in CI), or says why not.

How each kind of block is run, and the directives that steer it, are in ``doc_blocks.py``. The fast checks (every
block has a language, every directive parses, nothing that installs or needs a cluster sits in a block that runs)
are part of ``make test``; running the blocks takes minutes and is ``make docs``'s.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_blocks import ROOT, Block, DocError, apply_sets, blocks_of, commands, pages  # noqa: E402

#: commands a runnable block may not hold: they install, fetch or need a cluster (mark such a block illustrative)
REFUSED = {"pip", "pip3", "git", "make", "apt-get", "apt", "sudo", "dnf", "srun", "sbatch", "scontrol", "curl", "wget",
           "docker", "ssh"}
#: what a page's working directory sees of the repository (the pages name them as a clone has them)
LINKED = ("configs", "examples", "bench", "tools", "src", ".venv")
VENV_BIN = ROOT / ".venv" / "bin"


def _program(command: str) -> str:
    argv = shlex.split(command)
    while argv and "=" in argv[0] and not argv[0].startswith("-"):  # VAR=value cmd
        argv = argv[1:]
    return Path(argv[0]).name if argv else ""


def _recipes() -> dict[str, str]:
    from rlhfkit.config.recipes import RECIPES

    return {name: r.family for name, r in RECIPES.items()}


def tiny_run_flags(argv: list[str], family: str) -> list[str]:
    """The flags a documented training command gets here: one or two updates (online: one rollout step), no report,
    no progress bar; a flag the command already sets keeps its value."""
    keys = {a.split("=", 1)[0].lstrip("-").replace("-", "_") for a in argv if "=" in a}
    add = {"track.report": "false", "track.progress": "false"}
    if not keys & {"train.max_steps", "max_steps"}:
        add["train.max_steps"] = "1" if family == "online" else "2"
    return argv + [f"{k}={v}" for k, v in add.items() if k not in keys]


def _training(argv: list[str], recipes: dict[str, str]) -> tuple[int, str] | None:
    """(index of the recipe argument, its family) when ``argv`` runs a training recipe, else None."""
    for i, arg in enumerate(argv):
        if arg in ("rlhfkit", "rlhfkit.cli") or arg.endswith("/rlhfkit"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            if nxt in recipes:
                return i + 1, recipes[nxt]
            return None
    return None


def shell_argv(command: str, block: Block, recipes: dict[str, str]) -> str:
    """The command as it runs here: ``docs: set`` applied, a training command's test flags added."""
    if any(op in command for op in ("|", "&&", ";", ">", "<", "$(")):
        if block.sets:
            raise DocError(f"{block.where}: 'docs: set' needs plain commands, not pipes or chains: {command}")
        return command
    argv = shlex.split(command)
    argv = apply_sets(argv, block.sets)
    found = _training(argv, recipes)
    if found:
        argv = tiny_run_flags(argv, found[1])
    return shlex.join(argv)


def test_every_block_says_how_it_runs():
    """Every block has a language the runner knows, its directives parse, and a block that runs installs nothing and
    needs no cluster (those are illustrative, with their reason)."""
    problems = []
    for page in pages():
        try:
            blocks = blocks_of(page)
        except DocError as exc:
            problems.append(str(exc))
            continue
        for block in blocks:
            if not block.runs or block.lang not in ("bash", "sh", "shell"):
                continue
            for command in commands(block.text):
                if _program(command) in REFUSED:
                    problems.append(f"{block.where}: {command!r} installs, fetches or needs a cluster: mark the "
                                    "block '<!-- docs: illustrative REASON -->'")
    assert problems == []


def test_the_runner_reads_directives_and_commands(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# t\n\n<!-- docs: set model.name=tiny\ndocs: setup touch a.txt -->\n```bash\n"
                    "rlhfkit sft model.name=/x data.train=a.jsonl \\\n    output_dir=runs/x   # a comment\n"
                    "# a whole-line comment\nls runs/x\n```\n\n<!-- docs: illustrative needs a GPU -->\n"
                    "```python\nimport cuda\n```\n\n```text\noutput\n```\n")
    first, second, third = blocks_of(page)
    assert first.sets == ["model.name=tiny"] and first.setup == ["touch a.txt"] and first.runs
    assert commands(first.text) == ["rlhfkit sft model.name=/x data.train=a.jsonl output_dir=runs/x", "ls runs/x"]
    argv = shlex.split(shell_argv(commands(first.text)[0], first, {"sft": "supervised"}))
    assert argv[:5] == ["rlhfkit", "sft", "model.name=tiny", "data.train=a.jsonl", "output_dir=runs/x"]
    assert "train.max_steps=2" in argv and "track.report=false" in argv
    assert second.illustrative == "needs a GPU" and not second.runs
    assert third.lang == "text" and not third.runs
    (tmp_path / "q.md").write_text("    indented code\n")
    with pytest.raises(DocError, match="indented"):
        blocks_of(tmp_path / "q.md")
    (tmp_path / "r.md").write_text("<!-- docs: illustrative -->\n```bash\nls\n```\n")
    with pytest.raises(DocError, match="reason"):
        blocks_of(tmp_path / "r.md")


def _page_dir(tmp_path: Path) -> Path:
    for name in LINKED:
        if (ROOT / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def _env(cwd: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RLHFKIT_CACHE=str(cwd / ".cache"),
               PYTHONUNBUFFERED="1", COLUMNS="120")
    return env


def _run(cmd: str, block: Block, cwd: Path, env: dict) -> None:
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=block.timeout)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        pytest.fail(f"{block.where}: `{cmd}` exited {proc.returncode}\n{tail}")


def _check_yaml(block: Block, cwd: Path) -> None:
    from rlhfkit.config import load_config
    from rlhfkit.config.parse import load_yaml
    from rlhfkit.errors import UserError

    data = load_yaml(block.text, source=block.where)
    path = cwd / "block.yaml"
    path.write_text(block.text)
    recipes = [block.recipe] if block.recipe else [data["recipe"]] if isinstance(data, dict) and "recipe" in data \
        else list(_recipes())
    errors = []
    for recipe in recipes:
        try:
            load_config(recipe, path)
            return
        except UserError as exc:
            errors.append(f"{recipe}: {exc}")
    pytest.fail(f"{block.where}: the YAML block is not a valid config ({'; '.join(errors[:3])})")


def run_block(block: Block, cwd: Path, env: dict, recipes: dict[str, str]) -> None:
    for setup in block.setup:
        _run(shell_argv(setup, Block(block.page, block.line, "bash", setup), recipes), block, cwd, env)
    if block.file:
        target = cwd / block.file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text)
        if target.suffix == ".py":
            compile(block.text, block.where, "exec")
        if block.lang in ("yaml", "yml") and block.recipe:
            _check_yaml(block, cwd)
        return
    if block.lang == "python":
        script = cwd / f"block_{block.line}.py"
        script.write_text(block.text)
        _run(f"{shlex.quote(str(VENV_BIN / 'python'))} {shlex.quote(script.name)}", block, cwd, env)
    elif block.lang in ("bash", "sh", "shell"):
        for command in commands(block.text):
            _run(shell_argv(command, block, recipes), block, cwd, env)
    elif block.lang in ("yaml", "yml"):
        _check_yaml(block, cwd)
    elif block.lang == "json":
        json.loads(block.text)
    elif block.lang == "jsonl":
        for line in block.text.splitlines():
            if line.strip():
                json.loads(line)


@pytest.mark.docs
@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_blocks_run(page, tmp_path):
    """Each page's runnable blocks, in order, in one working directory of their own."""
    cwd = _page_dir(tmp_path)
    env = _env(cwd)
    recipes = _recipes()
    for block in blocks_of(page):
        if block.runs:
            run_block(block, cwd, env, recipes)


def test_docstring_bars_read_as_maths_not_substitutions():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    from plain_bars import _process, escape_bars

    assert escape_bars("|y_i| over |pi - pi_old|, ``|x|`` kept, a || b") == \
        r"\|y_i\| over \|pi - pi_old\|, ``|x|`` kept, a || b"
    lines = ["the norm |V|::", "", "    |kept| in a literal block", "", "after |V|"]
    _process(None, "function", "f", None, {}, lines)
    assert lines == [r"the norm \|V\|::", "", "    |kept| in a literal block", "", r"after \|V\|"]


#: pages that describe no feature of their own (the front page, the list of what is not built; the API reference is
#: the docstrings)
NO_FEATURE = {"docs/index.md", "docs/limitations.md"}


def test_every_page_names_the_tests_that_prove_it_and_they_exist():
    import re

    missing, bare = [], []
    for page in pages():
        rel = str(page.relative_to(ROOT))
        named = set(re.findall(r"tests/[A-Za-z0-9_/]+\.py", page.read_text()))
        missing += [f"{rel}: {t}" for t in sorted(named) if not (ROOT / t).is_file()]
        if not named and rel.startswith("docs/") and not rel.startswith("docs/api/") and rel not in NO_FEATURE:
            bare.append(rel)
    assert missing == [], "pages name tests that do not exist"
    assert bare == [], "pages that name no test proving what they describe"
