"""The README's tables stay true to the code: the TRL names tables are config.trl.TRL_NAMES rendered, the
trackers it names are the ones check_backends knows, and the extras it installs exist in pyproject.toml."""

import re
from pathlib import Path

from rlhfkit.config.trl import markdown_tables
from rlhfkit.track.trackers import known_backends

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    """From ``title`` to the next heading of its level or above."""
    start = README.index(title)
    level = title.split()[0]
    ends = [i for i in (README.find("\n" + "#" * n + " ", start + 1) for n in range(1, len(level) + 1)) if i > 0]
    return README[start: min(ends) if ends else None]


def test_trl_tables_are_the_mapping():
    """tools/sync_configs.py writes them; a name added to TRL_NAMES without re-running it fails here."""
    section = _section("### Flat names")
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


def test_trackers_named_in_the_readme_are_known():
    text = _section("## Tracking, reports and health warnings")
    for name in ("tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio"):
        assert re.search(rf"\b{name}\b", text) and name in known_backends()


def test_install_extras_exist():
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in re.findall(r'pip install -e "\.\[([a-z,]+)\]"', README)[0].split(","):
        assert re.search(rf"^{extra} = \[", pyproject, flags=re.M), extra
