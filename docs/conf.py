"""Sphinx configuration of rlhfkit's documentation site (`make docs`).

Why Sphinx with MyST and not MkDocs: the docstrings are written in reStructuredText with Sphinx's roles
(``:class:``, ``:func:``, double-backquoted literals), which autodoc renders as they are and, with ``nitpicky``,
checks as references; the pages are Markdown (MyST), read the same on GitHub. The build runs offline (no intersphinx
inventories are fetched) and treats every warning as an error (``-W``): a broken link, a missing reference, a page
outside the table of contents or a malformed docstring fails it.
"""

from __future__ import annotations

import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "rlhfkit"
author = "rlhfkit contributors"
copyright = "2026, rlhfkit contributors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "plain_bars",  # |x| in a docstring is an absolute value, not a substitution (docs/_ext/plain_bars.py)
    "suffix_refs",  # a short name in a docstring links to the one object it names (docs/_ext/suffix_refs.py)
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "**/_build", "_ext"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # "#what-a-run-directory-holds" links to a heading, as on GitHub

html_theme = "furo"
html_title = "rlhfkit"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the signatures carry the types; docstrings say what they mean
autodoc_inherit_docstrings = False  # torch's autograd.Function docstrings are not ours to check
autodoc_default_options = {"members": True, "undoc-members": True, "private-members": True, "show-inheritance": False,
                           "special-members": "__call__"}

# Every reference must resolve, except to packages whose inventories are not fetched offline (the standard library
# and third-party libraries): those stay plain text.
nitpicky = True
# Names of other packages are plain text (docs/_ext/suffix_refs.py); what stays here is what autodoc itself writes
# from annotations: bare typing names and string annotations it cannot split.
nitpick_ignore_regex = [
    (r"py:.*", r"(Path|Any|Callable|Iterable|Iterator|Sequence|Mapping|Tensor|Exception|KeyboardInterrupt)"),
    (r"py:class", r"'.*|.*\]'?|.*\|.*"),
]


# The API reference: one page per room, every module of the package in it, written at each build (docs/api/*.md are
# generated, not committed), so a module added anywhere is in the reference without anyone listing it.
API_ROOMS = {
    "api": ("Python API: trainers and configs", "The trainers and config classes of ``from rlhfkit import ...``."),
    "config": ("Configuration", "Config dataclasses, the recipe table, YAML and overrides, TRL's names."),
    "algos": ("Algorithms (pure tensor maths)", "Losses, advantage and KL estimators, corrections: pure functions."),
    "data": ("Data", "Record formats, loaders, chat templates, tokenisation."),
    "models": ("Models", "Loading, heads, LoRA, export, memory arithmetic."),
    "rollout": ("Rollout engines", "Generation engines behind one interface (``ENGINES``)."),
    "rewards": ("Rewards", "Reward functions, verifiers, the sandbox, workers, the lint."),
    "envs": ("Environments", "Multi-turn environments."),
    "track": ("Tracking", "Metrics, progress, health rules, samples."),
    "train": ("Training loops", "The run's lifecycle, shared forwards, the online step and the supervised loop."),
    "tasks": ("Built-in tasks", "Data generators and gold metrics."),
    "other": ("Commands and the rest", "The CLI, pipelines, evaluation, planning, files, errors, reports."),
}


def _failed_import(name):
    raise ImportError(f"the API reference cannot import {name}")


def write_api_pages(app=None) -> None:
    import rlhfkit

    mods = sorted(m.name for m in pkgutil.walk_packages(rlhfkit.__path__, "rlhfkit.", onerror=_failed_import)
                  if not m.name.endswith("__main__"))
    groups: dict[str, list[str]] = {room: [] for room in API_ROOMS}
    for name in mods:
        room = name.split(".")[1]
        groups[room if room in groups else "other"].append(name)
    out = Path(__file__).resolve().parent / "api"
    for room, (title, blurb) in API_ROOMS.items():
        body = [f"# {title}", "", blurb, ""]
        for name in groups[room]:
            body += ["```{eval-rst}", f".. automodule:: {name}", "```", ""]
        page = out / f"{room}.md"
        text = "\n".join(body)
        if not page.is_file() or page.read_text() != text:
            page.write_text(text)


def setup(app):
    from pygments.lexers import JsonLexer

    app.add_lexer("jsonl", JsonLexer)  # JSON lines: one JSON value a line (the pages' data files)
    app.connect("builder-inited", write_api_pages)
