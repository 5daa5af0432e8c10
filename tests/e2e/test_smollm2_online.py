"""Online RL on a real model: PPO and GRPO with LoRA on SmolLM2-135M-Instruct from its GGUF file.

Skipped, with the reason, when the GGUF file is not on this machine (``examples/smollm2.py`` says where it looks;
``docs/real-models.md`` how to get it); deselected by default (``-m "not gguf"`` in pyproject's addopts). Run with
``pytest -m gguf tests/e2e/test_smollm2_online.py``: about 3-4 minutes on 2 busy CPU cores with
``OMP_NUM_THREADS=1`` (a reward model of 2 updates, 2 PPO steps, 2 GRPO steps, each saving a merged 540 MB model).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

_HELPER = Path(__file__).resolve().parents[2] / "examples" / "smollm2.py"


def _load_helper():
    spec = importlib.util.spec_from_file_location("rlhfkit_example_smollm2", _HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_smollm2 = _load_helper()
GGUF = _smollm2.find_smollm2_gguf()

pytestmark = [
    pytest.mark.gguf,
    pytest.mark.skipif(GGUF is None, reason=_smollm2.search_report()),
]

MAX_NEW = 24
SUFFIX = " Answer in one short sentence."  # SmolLM2 then usually stops at <|im_end|> well within 24 tokens
QUESTIONS = [("What is the capital of France?", "Paris"), ("How many days are in a week?", "seven"),
             ("What do bees make?", "honey"), ("What is 2+2?", "4"), ("Which animal says moo?", "a cow"),
             ("What is frozen water called?", "ice"), ("What is the opposite of hot?", "cold"),
             ("Which planet do we live on?", "Earth")]


def _user(q: str) -> list[dict]:
    return [{"role": "user", "content": q + SUFFIX}]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _metrics(run_dir: Path) -> list[dict]:
    from rlhfkit.track.metrics import read_run_metrics

    return [r for r in read_run_metrics(run_dir) if "objective/scores" in r]  # rlhfkit's names (it writes TRL's)


def _assert_finite(rows: list[dict]) -> None:
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isfinite(value), (key, value)


def _assert_reloads(run_dir: Path) -> None:
    """The run directory holds a merged model that plain transformers loads and generates from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert not (run_dir / "adapter_config.json").exists()  # the root is merged weights, the adapter in adapter/
    assert (run_dir / "adapter" / "adapter_config.json").is_file()
    tok = AutoTokenizer.from_pretrained(run_dir)
    model = AutoModelForCausalLM.from_pretrained(run_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not any("lora_" in n for n, _ in model.named_parameters())
    assert tok.eos_token == "<|im_end|>"
    enc = tok.apply_chat_template(_user("What is the capital of Italy?"), add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**enc, max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    assert tok.decode(gen[0, enc["input_ids"].shape[1]:], skip_special_tokens=True).strip()


@pytest.fixture(scope="module")
def converted() -> Path:
    from rlhfkit.models.loading import _gguf_cache_dir, resolve_source

    if not (_gguf_cache_dir(Path(GGUF)) / "config.json").is_file() and importlib.util.find_spec("gguf") is None:
        pytest.skip("converting the GGUF file needs the `gguf` package: pip install 'rlhfkit[gguf]'")
    return Path(resolve_source(GGUF)[0])


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("smollm2-online-data")
    return _write_jsonl(out / "prompts.jsonl", [{"prompt": _user(q), "answer": a} for q, a in QUESTIONS])


@pytest.fixture(scope="module")
def tiny_rm(converted, tmp_path_factory) -> Path:
    """A reward model from the GGUF (LoRA + fresh score head) after 2 updates on polite-vs-rude pairs."""
    from rlhfkit.config import build_config
    from rlhfkit.train.supervised.reward import run_rm

    out = tmp_path_factory.mktemp("smollm2-rm")
    pairs = [{"prompt": _user(q), "chosen": f"Happy to help! The answer is {a}.",
              "rejected": f"Ugh, {a}. Obviously. Stop asking me that."} for q, a in QUESTIONS]
    data = _write_jsonl(out / "pref.jsonl", pairs)
    metrics = run_rm(build_config("rm", {}, [
        f"model.name={GGUF}", "model.lora.enabled=true", "model.lora.r=8", "train.max_steps=2", "train.batch_size=4",
        "data.max_length=64", "data.max_prompt_length=48", "optim.lr=5e-4", f"data.train={data}",
        "data.eval_fraction=0", f"output_dir={out}", "track.report=false", "track.progress=false",
    ]))
    assert math.isfinite(metrics["train/loss"])
    return out


def test_ppo_lora_with_reward_model_from_smollm2(tiny_rm, prompts_file, tmp_path):
    from rlhfkit.config import build_config
    from rlhfkit.models.loading import is_peft
    from rlhfkit.train.lifecycle.run import start_run
    from rlhfkit.train.online.synchronous import OnlineTrainer

    class Recording(OnlineTrainer):
        """Keeps every training rollout, to check where responses stopped."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.rollouts: list = []
            real = self.producer.rollout

            def rollout(policy, prompts, seed, k=None, **kw):
                exp = real(policy, prompts, seed, k=k, **kw)
                if k is None:
                    self.rollouts.append(exp.rollout)
                return exp

            self.producer.rollout = rollout

    out = tmp_path / "ppo"
    cfg = build_config("ppo", {}, [
        f"model.name={GGUF}", "model.lora.enabled=true", "model.lora.r=8", "model.lora.dropout=0",
        f"reward.model={tiny_rm}", "critic.init=reward", f"data.train={prompts_file}", "data.eval_fraction=0",
        f"output_dir={out}", f"generation.max_new_tokens={MAX_NEW}", "algo.rollout_batch_size=4",
        "algo.mini_batch_size=4", "train.batch_size=2", "algo.total_episodes=8", "algo.kl.coef=0.05",
        "optim.lr=1e-4", "critic.lr=1e-4", "track.report=false", "track.progress=false", "track.sample_every=0",
    ])
    with start_run(cfg) as run:
        assert run.session.begin() is None
        trainer = Recording(cfg, run)
        # LoRA: the reference is the policy with its adapter disabled; no second causal LM is loaded
        learner, producer = trainer.learner, trainer.producer
        assert learner.ref is None and is_peft(learner.policy)
        assert learner.critic is not None and producer.scorer is not None and producer.scorer.same_tokenizer
        last = trainer.train()

    rows = _metrics(out)
    assert len(rows) == 2
    _assert_finite(rows)
    assert math.isfinite(last["objective/scores"])
    for key in ("objective/kl", "val/ratio", "loss/policy_avg", "loss/value_avg", "policy/approxkl_avg",
                "rewards/model/mean", "response/length_mean"):
        assert key in rows[-1], key
    assert rows[0]["objective/kl"] == pytest.approx(0.0, abs=1e-5)  # LoRA B starts at 0: policy == reference
    assert 0.5 < rows[-1]["val/ratio"] < 2.0

    eos = set(trainer.producer.eos_ids)
    ended_lengths = []
    for r in trainer.rollouts:
        for ids, mask, n, ended in zip(r.response_ids, r.response_mask, r.lengths.tolist(), r.ended.tolist()):
            assert int(mask.sum()) == n and 0 < n <= MAX_NEW
            if ended:
                assert int(ids[n - 1]) in eos  # the response's last token is <|im_end|>; nothing after is masked in
                ended_lengths.append(n)
    assert len(trainer.rollouts) == 2
    assert len(ended_lengths) >= 2 and len(set(ended_lengths)) >= 2, ended_lengths  # stop at EOS, various lengths
    _assert_reloads(out)


def test_grpo_lora_with_rule_rewards_on_smollm2(converted, tmp_path):
    from rlhfkit.config import build_config
    from rlhfkit.train.online.synchronous import run_online

    sums = [(2, 3), (4, 4), (1, 6), (3, 5)]
    data = _write_jsonl(tmp_path / "sums.jsonl", [
        {"prompt": f"What is {a}+{b}? Answer with the number only.", "answer": str(a + b)} for a, b in sums])
    rewards = [{"fn": "regex_match", "name": "correct", "kwargs": {"pattern": r"(\d+)\D*$"}},
               {"fn": "exact_match", "weight": 0.5},
               {"fn": "length_target", "weight": 0.1, "kwargs": {"target": 10}}]
    out = tmp_path / "grpo"
    cfg = build_config("grpo", {"reward": {"functions": rewards}}, [
        f"model.name={GGUF}", "model.lora.enabled=true", "model.lora.r=8", "model.lora.dropout=0",
        f"data.train={data}", "data.eval_fraction=0", f"output_dir={out}", f"generation.max_new_tokens={MAX_NEW}",
        "algo.num_generations=4", "algo.rollout_batch_size=2", "algo.mini_batch_size=8", "train.batch_size=4",
        "algo.total_episodes=16", "optim.lr=1e-4", "track.report=false", "track.progress=false",
        "track.sample_every=1",
    ])
    last = run_online(cfg)

    rows = _metrics(out)
    assert len(rows) == 2
    _assert_finite(rows)
    for key in ("rewards/correct/mean", "rewards/exact_match/mean", "rewards/length_target/mean", "objective/kl"):
        assert key in rows[-1], key
    assert rows[0]["objective/kl"] == pytest.approx(0.0, abs=1e-5)
    assert all(r["objective/kl"] >= 0 for r in rows)  # k3 is never negative
    assert math.isfinite(last["objective/scores"])
    # responses end at EOS at different lengths: some ended, lengths vary, not all forced to the limit
    assert sum(r["val/num_eos_tokens"] for r in rows) >= 2
    assert all(r["response/length_std"] > 0 for r in rows)
    assert min(r["response/length_mean"] for r in rows) < MAX_NEW
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines() if x.strip()]
    assert len(samples) == 2 * 8 and all("<|im_end|>" not in s["response"] for s in samples)
    _assert_reloads(out)
