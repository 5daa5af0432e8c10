"""``rlhfkit eval`` (gold metric, reward functions, reward-model score, win rate with its Wilson interval),
``rlhfkit export`` (LoRA merge, reload verification) and ``rlhfkit generate`` on the tiny models of the session
fixtures (SFT policy, reward model)."""

from __future__ import annotations

import io
import json
import math
import shutil

import pytest
import torch

from rlhfkit.cli import main
from rlhfkit.errors import ConfigError, DataError, ModelError
from rlhfkit.evaluate import wilson_interval

TINY = "tiny:hidden=64,layers=2,intermediate=128"


# ───────────────────────────────────────────── Wilson interval (hand values) ─────────────────────────────────


@pytest.mark.parametrize("k, n, lo, hi", [
    # p = 0.5, n = 10: z²/n = 0.38415, denom 1.38415, center 0.5,
    # half = 1.96/1.38415 * sqrt(0.025 + 0.0096037) = 1.41600 * 0.18602 = 0.26340
    (5, 10, 0.23659, 0.76341),
    # k = 0: center = (z²/2n)/denom = 0.19207/1.38415 = 0.13877 = half  ->  [0, 0.27753]
    (0, 10, 0.0, 0.27753),
    (10, 10, 0.72247, 1.0),
    # p = 0.8, n = 100: denom 1.038415, center (0.8 + 0.019207)/1.038415 = 0.788903,
    # half = 1.887458 * sqrt(0.0016 + 0.0000960) = 0.077731  (the textbook 80/100 interval: 0.7112 to 0.8666)
    (80, 100, 0.71117, 0.86663),
    # one success in one trial: center (1 + 1.92073)/4.84146 = 0.60327, half = 0.40483 * sqrt(0.96036) = 0.39672
    (1, 1, 0.20655, 1.0),
    # fractional successes (ties counted half), p = 0.25, n = 2: denom 2.920730, center 1.210365/2.920730 = 0.414405,
    # half = 0.671055 * sqrt(0.09375 + 0.240091) = 0.387728
    (0.5, 2, 0.02668, 0.80213),
])
def test_wilson_interval_hand_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=2e-4)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
    lo, hi = wilson_interval(500, 1000)
    assert hi - lo == pytest.approx(2 * 1.959964 * math.sqrt(0.25 / 1000), rel=2e-3)  # ~ normal approx at large n


def test_win_rate_counts_ties_half():
    from rlhfkit.evaluate import win_rate

    w = win_rate([1.0, 2.0, 0.5, 3.0], [0.0, 2.0, 1.0, 1.0])
    assert (w["wins"], w["ties"], w["losses"], w["n"]) == (2, 1, 1, 4)
    assert w["rate"] == pytest.approx(2.5 / 4)
    assert w["ci95"][0] < w["rate"] < w["ci95"][1]


# ───────────────────────────────────────────── eval ─────────────────────────────────────────────


def test_eval_gold_rewards_rm_score_and_win_rate(sft_dir, rm_dir, task_data, tmp_path, capsys):
    out = tmp_path / "results.json"
    rc = main(["eval", str(sft_dir), "--data", str(task_data / "eval_prompts.jsonl"), "--task", "quickstart",
               "--reference", TINY, "--reward-model", str(rm_dir), "--functions", "exact_match",
               "rlhfkit.tasks.quickstart:reward", "--n", "64", "--max-new-tokens", "16", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["n"] == 64 and res["sampling"]["temperature"] == 1.0
    # SFT shouts ~40% of the time; the reward functions are the same exact-answer check as the gold metric
    assert 0.1 < res["gold"]["mean"] < 0.9
    assert res["rewards"]["exact_match"]["mean"] == pytest.approx(res["gold"]["mean"])
    assert res["rewards"]["reward"]["mean"] == pytest.approx(res["gold"]["mean"])
    assert res["responses"]["eos_frac"] > 0.9  # the SFT model stops at EOS
    assert math.isfinite(res["reward_model"]["mean"])
    w = res["win_rate"]
    samples = res["samples"]
    assert len(samples) == 64 and all("reference_response" in s for s in samples)
    assert w["n"] == 64 and w["wins"] + w["ties"] + w["losses"] == 64
    # the counts are the pairwise comparisons of the two answers' reward-model scores
    assert w["wins"] == sum(s["rm_score"] > s["reference_rm_score"] for s in samples)
    assert w["ties"] == sum(s["rm_score"] == s["reference_rm_score"] for s in samples)
    assert w["rate"] == pytest.approx((w["wins"] + 0.5 * w["ties"]) / 64)
    assert w["ci95"] == pytest.approx(list(wilson_interval(w["wins"] + 0.5 * w["ties"], 64)))
    lo, hi = w["ci95"]
    assert 0 <= lo < w["rate"] < hi <= 1 and hi - lo < 0.3
    # the judge is sensible: exact answers beat the untrained model's noise, one by one and on average (the RM ranks
    # lower-case echoes below noise, so neither the overall win rate nor the overall mean is asserted: with the SFT
    # model's ~40% exact answers the two means sit within 0.01 of each other and their order is the seed's)
    exact = [s for s in samples if s["gold"] == 1]
    assert exact and sum(s["rm_score"] > s["reference_rm_score"] for s in exact) >= 0.8 * len(exact)
    assert sum(s["rm_score"] for s in exact) > sum(s["reference_rm_score"] for s in exact)
    assert res["reward_model"]["mean"] == pytest.approx(sum(s["rm_score"] for s in samples) / 64)
    assert res["samples"][0]["prompt"].startswith("shout: ")
    for needle in ("gold (quickstart)", "reward model score", "win rate", "95% CI", str(out)):
        assert needle in stdout


def test_eval_against_itself_is_all_ties(sft_dir, rm_dir, task_data, tmp_path):
    from rlhfkit.evaluate import evaluate

    res = evaluate(str(sft_dir), str(task_data / "eval_prompts.jsonl"), reference=str(sft_dir),
                   reward_model=str(rm_dir), n=20, temperature=0.0, max_new_tokens=12, out=tmp_path / "e.json",
                   show=False)
    w = res["win_rate"]
    assert (w["wins"], w["ties"], w["losses"], w["rate"]) == (0, 20, 0, 0.5)
    assert w["ci95"] == pytest.approx(list(wilson_interval(10, 20)))
    assert w["ci95"][0] == pytest.approx(1 - w["ci95"][1])  # symmetric around 1/2


def test_eval_default_output_and_greedy_is_deterministic(sft_dir, task_data, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(sft_dir, model)
    args = ["eval", str(model), "--data", str(task_data / "eval_prompts.jsonl"), "--n", "8", "--greedy",
            "--max-new-tokens", "12"]
    assert main(args) == 0
    first = json.loads((model / "eval.json").read_text())
    assert main(args) == 0
    second = json.loads((model / "eval.json").read_text())
    assert first["sampling"]["greedy"] and first["samples"] == second["samples"]
    assert "gold" not in first  # never computed unless asked ...
    assert "add --task quickstart" in capsys.readouterr().out  # ... but suggested


def test_eval_function_receives_extra_fields(sft_dir, tmp_path):
    from rlhfkit.evaluate import evaluate

    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "shout: cat"}], "answer": "CAT"}) + "\n")
    fn = tmp_path / "myreward.py"
    fn.write_text("def score(prompts, completions, answer, **kw):\n"
                  "    assert prompts == ['shout: cat'] and answer == ['CAT']\n"
                  "    return [float(len(c)) for c in completions]\n")
    res = evaluate(str(sft_dir), str(data), functions=[f"{fn}:score"], temperature=0.0, max_new_tokens=8,
                   out=tmp_path / "e.json", show=False)
    assert res["rewards"]["score"]["mean"] == len(res["samples"][0]["response"])


def test_eval_takes_the_training_field_mapping(sft_dir, tmp_path, capsys):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "shout: cat", "solution": "CAT"}) + "\n")
    out = tmp_path / "e.json"
    assert main(["eval", str(sft_dir), "--data", str(data), "--n", "1", "--max-new-tokens", "4", "--out", str(out),
                 "--field", "prompt=question", "--functions", "exact_match"]) == 2  # exact_match needs `answer`
    capsys.readouterr()
    assert main(["eval", str(sft_dir), "--data", str(data), "--max-new-tokens", "4", "--out", str(out),
                 "--field", "prompt=question", "--field", "answer=solution", "--functions", "exact_match"]) == 0
    assert json.loads(out.read_text())["n"] == 1
    assert main(["eval", str(sft_dir), "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--field prompt=" in err and "data.fields" not in err  # the fix names the flag of this command


def test_eval_of_a_run_reuses_its_field_mapping(sft_dir, tmp_path, capsys):
    """`rlhfkit eval RUN_DIR` maps the columns as the run's own data.fields did (config.yaml), without --field;
    a --field given on the command line wins, and the completion / pair columns a prompt file lacks are left out."""
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(sft_dir, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["fields"] = {"prompt": "question", "answer": "solution", "completion": "reply"}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "shout: cat", "solution": "CAT"}) + "\n")
    out = tmp_path / "e.json"
    assert main(["eval", str(run), "--data", str(data), "--max-new-tokens", "4", "--out", str(out),
                 "--functions", "exact_match"]) == 0
    assert json.loads(out.read_text())["n"] == 1
    err = capsys.readouterr().err
    assert "the run's data.fields (config.yaml): " in err and "prompt=question" in err and "answer=solution" in err
    assert "completion=reply" not in err  # a prompt file has no completion column
    data.write_text(json.dumps({"q2": "shout: cat", "solution": "CAT"}) + "\n")
    assert main(["eval", str(run), "--data", str(data), "--max-new-tokens", "4", "--out", str(out),
                 "--field", "prompt=q2", "--functions", "exact_match"]) == 0


def test_eval_checks_its_inputs_before_generating(sft_dir, rm_dir, task_data, tmp_path):
    from rlhfkit.evaluate import evaluate

    data = str(task_data / "eval_prompts.jsonl")
    with pytest.raises(ConfigError, match="needs a judge"):
        evaluate(str(sft_dir), data, reference=TINY, show=False)
    with pytest.raises(ModelError, match="is a reward model"):
        evaluate(str(rm_dir), data, show=False)
    with pytest.raises(ModelError, match="not a reward model"):
        evaluate(str(sft_dir), data, reward_model=str(sft_dir), show=False)
    with pytest.raises(ConfigError, match="unknown task"):
        evaluate(str(sft_dir), data, task="nope", show=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"answer": "b"}\n')
    with pytest.raises(DataError, match="bad.jsonl:2"):
        evaluate(str(sft_dir), str(bad), show=False)
    assert not (sft_dir / "eval.json").exists()


# ───────────────────────────────────────────── export ─────────────────────────────────────────────


@pytest.fixture(scope="module")
def lora_run(task_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora-run")
    rc = main(["sft", f"data.train={task_data / 'sft.jsonl'}", f"model.name={TINY}", "model.lora.enabled=true",
               "train.max_steps=3", "optim.lr=1e-2", "train.batch_size=16", "track.report=false",
               "data.max_length=64", "data.limit=200", f"output_dir={out}"])
    assert rc == 0
    assert (out / "adapter" / "adapter_config.json").is_file()
    return out


def _logits(model_dir, cls_name="AutoModelForCausalLM"):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = getattr(transformers, cls_name).from_pretrained(model_dir).eval()
    text = tok.apply_chat_template([{"role": "user", "content": "shout: zebra"}, {"role": "assistant",
                                                                                  "content": "ZEBRA"}], tokenize=False)
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return model(**enc).logits


@pytest.mark.parametrize("which", ["run", "adapter"])
def test_export_merges_a_lora_run_and_verifies_the_reload(which, lora_run, tmp_path, capsys):
    src = lora_run if which == "run" else lora_run / "adapter"
    out = tmp_path / "exported"
    assert main(["export", str(src), "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "merging" in stdout and "verified: reloaded with AutoModelForCausalLM" in stdout
    assert "base + adapter (unmerged)" in stdout and "agrees" in stdout
    # a full model: no adapter files, loads with plain transformers, same chat template
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    assert not (out / "adapter").exists()
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(lora_run).chat_template
    exported = _logits(out)
    torch.testing.assert_close(exported, _logits(lora_run), atol=1e-4, rtol=1e-4)
    # the merge is not a no-op: the adapter moved the model away from its (seed-42) base
    from rlhfkit.config import ModelConfig
    from rlhfkit.models.loading import load_causal_lm

    base, tok = load_causal_lm(ModelConfig(name=TINY), seed=42, trainable=False)
    text = tok.apply_chat_template([{"role": "user", "content": "shout: zebra"}, {"role": "assistant",
                                                                                 "content": "ZEBRA"}], tokenize=False)
    with torch.no_grad():
        base_logits = base(**tok(text, return_tensors="pt", add_special_tokens=False)).logits
    assert (exported - base_logits).abs().max() > 1e-3


def test_export_with_a_wrong_base_is_refused(lora_run, tmp_path):
    from rlhfkit.models.export import export_model

    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    cfg = (run / "config.yaml").read_text().replace("seed: 42", "seed: 7")  # the base can no longer be rebuilt
    (run / "config.yaml").write_text(cfg)
    with pytest.raises(ModelError, match="does not reproduce the run's merged model"):
        export_model(run, tmp_path / "out", log=None)


@pytest.mark.parametrize("seed", [".inf", "forty-two", "true"])
def test_export_names_a_run_seed_that_is_not_an_integer(seed, lora_run, tmp_path):
    from rlhfkit.models.export import export_model

    run = tmp_path / "run"
    shutil.copytree(lora_run, run)
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("seed: 42", f"seed: {seed}"))
    with pytest.raises(ModelError, match=r"train.seed is .*not an integer") as err:
        export_model(run, tmp_path / "out", log=None)
    assert "config.yaml: train.seed" in err.value.one_line() and not (tmp_path / "out").exists()


def test_export_reward_model_reloads_as_sequence_classifier(rm_dir, tmp_path, capsys):
    out = tmp_path / "rm-export"
    assert main(["export", str(rm_dir), "--out", str(out)]) == 0
    assert "AutoModelForSequenceClassification" in capsys.readouterr().out
    torch.testing.assert_close(_logits(out, "AutoModelForSequenceClassification"),
                               _logits(rm_dir, "AutoModelForSequenceClassification"))


def test_export_refuses_its_own_source(sft_dir, tmp_path):
    from rlhfkit.models.export import export_model

    with pytest.raises(ConfigError, match="--out is the source"):
        export_model(sft_dir, sft_dir, log=None)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="holds no model"):
        export_model(empty, tmp_path / "out", log=None)
    # a directory that holds anything, an existing GGUF file, a link: refused before anything loads, nothing changed
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "config.json").write_text("mine")
    (tmp_path / "mine.gguf").write_text("mine")
    (tmp_path / "link").symlink_to(empty)
    for out in (taken, tmp_path / "mine.gguf", tmp_path / "link"):
        with pytest.raises(ConfigError, match="already exists.*an export never writes over it") as info:
            export_model(sft_dir, out, log=None)
        assert info.value.where == "--out" and "\n" not in str(info.value)
    assert (taken / "config.json").read_text() == "mine" and sorted(p.name for p in taken.iterdir()) == ["config.json"]
    assert (tmp_path / "mine.gguf").read_text() == "mine" and not any(empty.iterdir())
    assert main(["export", str(sft_dir), "--out", str(taken)]) == 2  # the CLI: one line, exit 2


# ───────────────────────────────────────────── generate ─────────────────────────────────────────────


def test_generate_prompt_answers_once_and_stops_at_eos(sft_dir, capsys):
    assert main(["generate", str(sft_dir), "--prompt", "shout: cat", "--temperature", "0",
                 "--max-new-tokens", "40"]) == 0
    out = capsys.readouterr().out
    # one short line: the answer ended at EOS instead of running on for 40 tokens
    assert out.count("\n") == 1 and out.strip().lower() == "cat"


def test_generate_interactive_keeps_the_conversation(sft_dir, monkeypatch, capsys):
    import rlhfkit.evaluate as ev

    seen = []
    real = ev.reply

    def spy(model, tok, messages, **kw):
        seen.append([m["content"] for m in messages])
        return real(model, tok, messages, **kw)

    monkeypatch.setattr(ev, "reply", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO("shout: cat\nshout: dog\n/reset\nshout: owl\n/exit\nshout: bee\n"))
    assert main(["generate", str(sft_dir), "--temperature", "0", "--max-new-tokens", "12",
                 "--system", "be loud"]) == 0
    # turn 2 sees turn 1 (multi-turn); /reset starts over (system kept); /exit stops before "bee"
    assert seen[0] == ["be loud", "shout: cat"]
    assert seen[1][:3] == ["be loud", "shout: cat", seen[1][2]] and seen[1][-1] == "shout: dog" and len(seen[1]) == 4
    assert seen[2] == ["be loud", "shout: owl"]
    assert len(seen) == 3
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 3 and "/exit" in captured.err


def test_eval_plays_episodes_with_an_environment(sft_dir, task_data, two_questions_env, tmp_path, capsys):
    """--env: each prompt is an episode of the training's episode code; the environment's metrics, the whole
    transcript per prompt, and the final turn as the answer the gold metric scores."""
    out = tmp_path / "eval.json"
    rc = main(["eval", str(sft_dir), "--data", str(task_data / "eval_prompts.jsonl"), "--n", "16", "--task",
               "quickstart", "--env", two_questions_env, "--env-kwargs", "{limit: 100}",
               "--max-turns", "3", "--max-new-tokens", "12", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    env = result["env"]
    assert env["turns_seen"] == 2.0 and env["turns_mean"] == 2.0  # the environment ended every episode after 2 turns
    assert env["episode_reward_mean"] == 2.0  # two turns, each of at most 12 tokens <= limit 100: reward 1 each
    for s in result["samples"]:
        roles = [m["role"] for m in s["transcript"]]
        assert roles == ["assistant", "user", "assistant"] and s["transcript"][1]["content"] == "and again?"
        assert s["response"] == s["transcript"][-1]["content"]  # the final turn is the scored answer
    assert 0.0 <= result["gold"]["mean"] <= 1.0
    assert "env: turns_seen" in capsys.readouterr().out
