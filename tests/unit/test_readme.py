"""The README's tables stay true to the code: the TRL alias table is config.ALIASES (plus the family aliases), the
trackers it names are the ones check_backends knows, and the extras it installs exist in pyproject.toml."""

import re
from pathlib import Path

from rlhfkit.config import _FAMILY_ALIASES, ALIASES
from rlhfkit.track.trackers import known_backends

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    """From ``title`` to the next heading of its level or above."""
    start = README.index(title)
    level = title.split()[0]
    ends = [i for i in (README.find("\n" + "#" * n + " ", start + 1) for n in range(1, len(level) + 1)) if i > 0]
    return README[start: min(ends) if ends else None]


def test_alias_table_is_config_aliases():
    family = {k for aliases in _FAMILY_ALIASES.values() for k in aliases}
    rows = re.findall(r"^\| `([a-z_]+)` \| `([a-z_.]+)`", _section("### Flat names"), flags=re.M)
    rows = [(k, v) for k, v in rows if k not in family]
    assert dict(rows) == ALIASES and len(rows) == len(ALIASES)
    for name in family:
        assert f"| `{name}` |" in _section("### Flat names")


def test_trackers_named_in_the_readme_are_known():
    text = _section("## Tracking, reports and health warnings")
    for name in ("tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio"):
        assert re.search(rf"\b{name}\b", text) and name in known_backends()


def test_install_extras_exist():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in re.findall(r'pip install -e "\.\[([a-z,]+)\]"', README)[0].split(","):
        assert re.search(rf"^{extra} = \[", pyproject, flags=re.M), extra
