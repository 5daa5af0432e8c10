"""The documentation's tables stay true to the code: docs/coming-from-trl.md's TRL names tables are
config.trl.TRL_NAMES rendered, the trackers docs/tracking.md names are the ones check_backends knows, and the extras
the README and the docs install exist in pyproject.toml."""

import re
from pathlib import Path

from rlhfkit.config.trl import markdown_tables
from rlhfkit.track.trackers import known_backends

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TRL_PAGE = (ROOT / "docs" / "coming-from-trl.md").read_text()


def _section(text: str, title: str) -> str:
    """From ``title`` to the next heading of its level or above."""
    start = text.index(title)
    level = title.split()[0]
    ends = [i for i in (text.find("\n" + "#" * n + " ", start + 1) for n in range(1, len(level) + 1)) if i > 0]
    return text[start: min(ends) if ends else None]


def test_trl_tables_are_the_mapping():
    """tools/sync_configs.py writes them; a name added to TRL_NAMES without re-running it fails here."""
    section = _section(TRL_PAGE, "## TRL's names")
    assert "<!-- trl-names:begin -->\n" + markdown_tables() + "\n<!-- trl-names:end -->" in section
    for name in ("loss_type", "bf16", "eval_strategy", "scale_rewards", "push_to_hub", "reward_funcs"):
        assert f"`{name}`" in section


def test_coming_from_trl_states_the_code_s_table():
    # docs/coming-from-trl.md's defaults and differences are the code's (config/trl_defaults.py), never a copy that
    # drifts: tools/sync_configs.py writes them
    from rlhfkit.config.startup import markdown_table

    text = (ROOT / "docs" / "coming-from-trl.md").read_text()
    assert "<!-- trl-defaults:begin -->\n" + markdown_table() + "\n<!-- trl-defaults:end -->" in text
    for row in ("| grpo | `GRPOConfig` |", "| sft | `SFTConfig` |", "| online-dpo |", "| kto | `KTOConfig` |"):
        assert row in text


def test_trackers_named_in_the_docs_are_known():
    text = (ROOT / "docs" / "tracking.md").read_text()
    for name in ("tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio"):
        assert re.search(rf"\b{name}\b", text) and name in known_backends()


def test_install_extras_exist():
    pyproject = (ROOT / "pyproject.toml").read_text()
    pages = [README, *(p.read_text() for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]
    named = {e for text in pages for group in re.findall(r'pip install -e "\.\[([a-z,]+)\]"', text)
             for e in group.split(",")}
    assert {"gguf", "tasks"} <= named
    for extra in named:
        assert re.search(rf"^{extra} = \[", pyproject, flags=re.M), extra
