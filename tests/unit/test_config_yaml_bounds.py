"""Config files and overrides that cannot hang or crash the parser: nested aliases (a "billion laughs"), deep nesting,
recursive aliases and oversized text are refused while parsing, and a key written twice in one mapping is refused
instead of silently taking the last value; each in one line naming file:line, exit 2."""

from __future__ import annotations

import time

import pytest

from rlhfkit.cli import main
from rlhfkit.config import build_config, load_config
from rlhfkit.config.parse import YAML_MAX_DEPTH, load_yaml, parse_override
from rlhfkit.errors import ConfigError


def laughs(levels: int = 9, indent: str = "    ") -> str:
    lines = [f'a0: &a0 [{", ".join(["lol"] * 9)}]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(indent + line for line in lines)


CASES = {  # name -> (file text, what the one line says, the line it names)
    "billion_laughs": ("recipe: grpo\nenv:\n  kwargs:\n" + laughs() + "\n", "a 'billion laughs'", None),
    "deep_list": ("recipe: grpo\nenv:\n  kwargs:\n    x: " + "[" * 50_000 + "]" * 50_000 + "\n",
                  f"nested deeper than {YAML_MAX_DEPTH} levels", 4),
    "deep_block": ("recipe: grpo\nenv:\n  kwargs:\n    x:\n" + "".join("  " * (i + 3) + "- \n" for i in range(200)),
                   f"nested deeper than {YAML_MAX_DEPTH} levels", None),
    "duplicate_key": ("recipe: grpo\noptim:\n  lr: 1.0e-3\n  weight_decay: 0.0\n  lr: 5.0\n",
                      "key 'lr' is written twice in one mapping (lines 3 and 5)", 5),
    "duplicate_top": ("output_dir: runs/a\nrecipe: grpo\noutput_dir: runs/b\n", "key 'output_dir' is written twice", 3),
    "duplicate_in_list_item": ("recipe: grpo\nreward:\n  functions:\n    - {fn: exact_match, weight: 1, weight: 9}\n",
                               "key 'weight' is written twice", 4),
    "recursive_alias": ("recipe: grpo\nenv:\n  kwargs:\n    x: &x [1, *x]\n", "alias contains itself", 4),
    "alias_chain": ("recipe: grpo\nenv:\n  kwargs:\n" + "\n".join(
        ["    b0: &b0 [1]"] + [f"    b{i}: &b{i} [*b{i - 1}]" for i in range(1, 200)]) + "\n",
                    f"aliases nest deeper than {YAML_MAX_DEPTH} levels", None),
    "too_big": ("recipe: grpo\nenv:\n  kwargs:\n    x: '" + "a" * (2 << 20) + "'\n", "characters (more than", None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_config_file_is_one_line_naming_file_and_line(tmp_path, capsys, name):
    text, says, line = CASES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_config("grpo", path)
    assert time.perf_counter() - t0 < 10
    message = info.value.one_line()
    assert says in message and "\n" not in message and str(path) in message
    if line is not None:
        assert f"{path}:{line}" in message
    assert main(["grpo", str(path)]) == 2  # through the CLI: one line, exit 2, no traceback
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]


@pytest.mark.parametrize("override, says", [
    ("env.kwargs={" + laughs(6, "").replace("\n", ", ") + "}", "a 'billion laughs'"),
    ("env.kwargs={x: " + "[" * 50_000 + "]" * 50_000 + "}", "nested deeper than"),
    ("env.kwargs={a: 1, a: 2}", "key 'a' is written twice in one mapping; YAML would silently keep the last"),
    ("env.kwargs={x: &x [1, *x]}", "alias contains itself"),
])
def test_a_hostile_override_is_one_line(capsys, override, says):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        build_config("grpo", {}, [override])
    assert time.perf_counter() - t0 < 10
    assert says in info.value.one_line() and "command line" in info.value.one_line()
    assert "env.kwargs" in info.value.one_line()
    assert main(["grpo", override]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]


def test_ordinary_yaml_still_reads_aliases_merges_and_overrides():
    # anchors a config may use on purpose, a merge key overridden, a moderate shared list
    text = ("base: &base {lr: 1.0e-3, weight_decay: 0.1}\noptim:\n  <<: *base\n  lr: 5.0e-4\n"
            "shared: &s [1, 2, 3]\nuse: [*s, *s]\n")
    data = load_yaml(text)
    assert data["optim"] == {"lr": 5.0e-4, "weight_decay": 0.1} and data["use"] == [[1, 2, 3], [1, 2, 3]]
    keys, value = parse_override("env.kwargs={a: &a [1, 2], b: *a}")
    assert keys == ["env", "kwargs"] and value == {"a": [1, 2], "b": [1, 2]}
    assert load_yaml("a: 1\nA: 2\n'1': x\n1: y\n") == {"a": 1, "A": 2, "1": "x", 1: "y"}  # distinct keys
