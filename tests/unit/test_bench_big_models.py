"""bench/big_models.py's pure parts: every case's config builds (full size and tiny), plans on one 80 GiB GPU as the
issue asks (the PPO cases with LoRA and with every weight trained under FSDP2 CPU offload, GRPO Qwen3-8B with LoRA),
its word tokenizer covers the whole vocabulary, and its table and 10 % verdict read the figures right. (Running the
cases: ``.venv/bin/python bench/big_models.py --quick`` on CPU, ``--only m`` of gpu_check on a GPU.)"""

from __future__ import annotations

import json

import pytest
from conftest import import_bench

from rlhfkit.models.memory import GiB
from rlhfkit.plan import plan


@pytest.fixture(scope="module")
def bench():
    return import_bench("big_models")


def test_every_case_builds_and_the_full_size_ones_fit_one_80gib_gpu(bench, tmp_path):
    for quick in (True, False):
        for number, spec in bench.case_specs(quick).items():
            if spec.get("needs"):  # QLoRA: the config itself refuses it without CUDA and bitsandbytes
                continue
            cfg, _ = bench.case_config(spec, quick, tmp_path / str(quick))
            p = plan(cfg, world=1, gpu_memory=80 * GiB, checks=False)
            assert [ph.name for ph in p.phases] == list(bench.PHASES)
            if not quick:
                assert p.fits, (number, p.render())
    specs = bench.case_specs(False)
    assert "distributed.cpu_offload=true" in specs[2]["overrides"]
    assert "model.lora.enabled=true" in specs[1]["overrides"]
    assert "model.lora.qlora=true" in specs[4]["overrides"] and specs[4]["needs"] == "bitsandbytes"


def test_the_word_tokenizer_has_the_models_vocabulary(bench, tmp_path):
    from transformers import AutoTokenizer

    d = bench.model_dir("pythia-1.4b", False, tmp_path)
    tok = AutoTokenizer.from_pretrained(d)
    assert len(tok) == json.loads((d / "config.json").read_text())["vocab_size"] == 50304
    assert tok.decode([50303, 7]) == "w50303 w7" and tok.eos_token_id == 1 and tok.pad_token_id == 0
    ids = tok.apply_chat_template([{"role": "user", "content": "w9 w10"}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.convert_ids_to_tokens(ids) == ["<user>", "w9", "w10", "<assistant>"]


def test_table_and_verdict(bench):
    results = [{"name": "a", "phases": [("rollout (generation)", 10 * GiB, 10.5 * GiB), ("train step", 20 * GiB,
                                                                                          None)],
                "s_per_step": 3.25, "note": ""},
               {"name": "b", "skip": "bitsandbytes not installed"}]
    lines = bench.table(results)
    assert "10.00" in lines[2] and "10.50" in lines[2] and "1.05" in lines[2] and "3.2" in lines[2]
    assert "SKIP: bitsandbytes not installed" in lines[-1]
    assert bench.within(results) is True
    results[0]["phases"][0] = ("rollout (generation)", 10 * GiB, 11.5 * GiB)
    assert bench.within(results) is False
    assert bench.within([{"name": "c", "phases": [("train step", GiB, None)]}]) is None
