"""Every recipe end to end on a tiny vision-language model (Qwen2.5-VL's code paths: M-RoPE, 2 x 2 patch merging),
each asserting it learned something measurable, on pictures made here: a red or a blue square, ``Colour?``.

* SFT on demonstrations that name the square's colour: held-out loss falls, and greedy answers follow the picture;
* DPO on pairs that prefer the picture's colour, from the untrained model: held-out preference accuracy;
* GRPO, RLOO, REINFORCE++, PPO and online DPO from a model answering red or blue at random, with a reward function
  that reads the picture (TRL's convention: the ``image`` column arrives as a PIL image) and pays for answering
  ``red``; distillation from a teacher VLM that always answers ``red``: each raises the policy's probability of
  ``red`` on held-out pictures;
* Qwen3-VL (DeepStack, interleaved M-RoPE): SFT's greedy answers follow the picture, GRPO raises ``red``;
* export writes processor and vision tower, reloads with transformers and generates the same tokens;
* ``rlhfkit eval`` / ``generate`` with images; a TRL VLM GRPO script with only its imports changed;
* SmolVLM's family (tiny Idefics3, images split into tiles): SFT's greedy answers follow the picture, its export
  generates the same tokens, GRPO raises ``red``.

The visual task that needs the picture to be answered (``shapes``: which square is larger) is learned by GRPO in
``test_grpo_learns_the_visual_task`` (cluster-marked: minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

pytestmark = pytest.mark.slow  # every test here trains a tiny VLM (seconds to about a minute each on 2 quiet cores)
ROOT = Path(__file__).resolve().parents[2]
VLM = "tiny:arch=qwen2_5_vl,hidden=64,layers=2,kv_heads=2,intermediate=128"
VLM3 = "tiny:arch=qwen3_vl,hidden=64,layers=2,kv_heads=2,intermediate=128"  # Qwen3-VL: DeepStack, interleaved M-RoPE
IDEFICS3 = VLM.replace("qwen2_5_vl", "idefics3")  # SmolVLM's family: a square picture is 2 x 2 tiles + the whole
COLOURS = {"red": (230, 40, 40), "blue": (40, 70, 240)}
REWARD = '''
def says_red(prompts, completions, image, **kwargs):
    assert all(hasattr(im, "getpixel") for im in image), [type(im) for im in image]  # PIL images, TRL's way
    return [1.0 if c.strip() == "red" else 0.0 for c in completions]
'''


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def colours(tmp_path_factory) -> Path:
    """Pictures of a red or a blue square (32 x 32), and the files every test reads."""
    root = tmp_path_factory.mktemp("colours")
    (root / "pics").mkdir()
    rng = np.random.RandomState(0)
    rows = []
    for i in range(96):
        colour = ("red", "blue")[i % 2]
        pixels = np.zeros((32, 32, 3), dtype=np.uint8)
        x, y = rng.randint(0, 12, 2)
        pixels[y:y + 20, x:x + 20] = COLOURS[colour]
        Image.fromarray(pixels).save(root / "pics" / f"{i}.png")
        rows.append((f"pics/{i}.png", colour))
    train, held = rows[:80], rows[80:]
    write_jsonl(root / "sft.jsonl", [{"prompt": "Colour?", "image": p, "completion": c} for p, c in train])
    write_jsonl(root / "eval_sft.jsonl", [{"prompt": "Colour?", "image": p, "completion": c} for p, c in held])
    write_jsonl(root / "red.jsonl", [{"prompt": "Colour?", "image": p, "completion": "red"} for p, _ in train])
    coin = np.random.RandomState(1).randint(0, 2, len(train))  # an answer drawn whatever the picture
    write_jsonl(root / "coin.jsonl", [{"prompt": "Colour?", "image": p, "completion": ("red", "blue")[k]}
                                      for (p, _), k in zip(train, coin)])
    for name, part in (("prompts.jsonl", train), ("eval_prompts.jsonl", held)):
        write_jsonl(root / name, [{"prompt": "Colour?", "image": p, "answer": c} for p, c in part])
    other = {"red": "blue", "blue": "red"}
    for name, part in (("pairs.jsonl", train), ("eval_pairs.jsonl", held)):
        write_jsonl(root / name, [{"prompt": "Colour?", "image": p, "chosen": c, "rejected": other[c]}
                                  for p, c in part])
    (root / "rw.py").write_text(REWARD)
    return root


def sft(colours: Path, out: Path, data: str = "sft.jsonl", epochs: int = 8, model: str = VLM, length: int = 64) -> dict:
    from rlhfkit.config import build_config
    from rlhfkit.train.supervised.sft import run_sft

    return run_sft(build_config("sft", {}, [
        f"model.name={model}", f"data.train={colours / data}", f"data.eval={colours / 'eval_sft.jsonl'}",
        f"output_dir={out}", "train.batch_size=16", f"train.epochs={epochs}", "optim.lr=5e-3", "track.report=false",
        "track.progress=false", f"data.max_length={length}", "model.lora.enabled=false"]))  # every weight: tiny


@pytest.fixture(scope="module")
def sft_dir(colours, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vlm-sft")
    sft(colours, out)
    return out


@pytest.fixture(scope="module")
def coin_dir(colours, tmp_path_factory) -> Path:
    """SFT on answers drawn whatever the picture: it answers red or blue, about half of each (the online tests'
    start: a group of samples then holds both answers)."""
    out = tmp_path_factory.mktemp("vlm-coin")
    sft(colours, out, "coin.jsonl")
    return out


def metrics(run: Path) -> list[dict]:
    """The run's metrics.jsonl under rlhfkit's names (it writes TRL's for the recipes TRL has)."""
    from rlhfkit.track.metrics import read_run_metrics

    return read_run_metrics(run)


def answers(model_dir, colours: Path, temperature: float = 0.0) -> list[tuple[str, str]]:
    """(wanted colour, the model's answer) on the held-out pictures."""
    from rlhfkit.evaluate import evaluate

    result = evaluate(str(model_dir), str(colours / "eval_prompts.jsonl"), temperature=temperature,
                      max_new_tokens=6, show=False, out=Path(model_dir) / "eval-colours.json")
    rows = [json.loads(line) for line in (colours / "eval_prompts.jsonl").read_text().splitlines()]
    return [(r["answer"], s["response"].strip()) for r, s in zip(rows, result["samples"])]


def logp_of(model_dir, colours: Path, length: int = 64) -> float:
    """Mean log-probability (its tokens and the end) of answering ``red`` on the held-out pictures."""
    from rlhfkit.config import ModelConfig
    from rlhfkit.data import LengthPolicy, load_dataset_records, tokenize_dataset
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.train.shared.forward import completion_stats

    model, tok = load_causal_lm(ModelConfig(name=str(model_dir)), trainable=False)
    records = load_dataset_records(str(colours / "eval_prompts.jsonl"), "prompt")
    ex, _ = tokenize_dataset(records, "prompt", tok, LengthPolicy(length))
    total = 0.0
    with torch.no_grad():
        answer = tok("red", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        for e in ex:
            x = torch.tensor([e["prompt_ids"] + answer])
            labels = torch.tensor([[-100] * len(e["prompt_ids"]) + answer])
            total += float(completion_stats(model, x, torch.ones_like(x), labels, media=[e["media"]]).logprobs.sum())
    return total / len(ex)


# ─────────────────────────────────────────── supervised ───────────────────────────────────────────


def test_sft_learns_to_name_the_pictures_colour(sft_dir, colours):
    rows = [r for r in metrics(sft_dir) if "eval/loss" in r]
    assert rows[-1]["eval/loss"] < 0.5 * rows[0]["eval/loss"], rows
    got = answers(sft_dir, colours)
    assert sum(w == a for w, a in got) >= 0.75 * len(got), got  # greedy answers follow the picture


def test_dpo_learns_to_prefer_the_pictures_colour(colours, tmp_path):
    from rlhfkit.config import build_config
    from rlhfkit.train.supervised.preference import run_preference

    m = run_preference(build_config("dpo", {}, [
        f"model.name={VLM}", f"data.train={colours / 'pairs.jsonl'}", f"data.eval={colours / 'eval_pairs.jsonl'}",
        f"output_dir={tmp_path}", "train.batch_size=8", "train.epochs=4", "optim.lr=3e-3", "track.report=false",
        "track.progress=false", "data.max_length=64"]))
    assert m["eval/rewards/accuracies"] >= 0.75, m  # held-out pairs: only the picture tells chosen from rejected


# ─────────────────────────────────────────── online ───────────────────────────────────────────


ONLINE = {"grpo": [], "rloo": [], "reinforce": [], "online-dpo": [],
          "ppo": ["critic.init=policy", "algo.kl.coef=0.01"]}


@pytest.mark.parametrize("recipe", [*ONLINE, "distill"])
def test_online_recipe_moves_the_policy_as_rewarded(recipe, colours, coin_dir, tmp_path, tmp_path_factory):
    from rlhfkit.config import build_config
    from rlhfkit.train.online.synchronous import run_online

    if recipe == "distill":  # a teacher VLM that answers red, whatever the picture
        teacher = tmp_path_factory.mktemp("red-teacher")
        sft(colours, teacher, "red.jsonl")
        extra = [f"teacher.model={teacher}"]
    else:
        extra = [f"reward.functions=[{{fn: {colours / 'rw.py'}:says_red}}]", *ONLINE[recipe]]
    before = logp_of(coin_dir, colours)
    run_online(build_config(recipe, {}, [
        f"model.name={coin_dir}", f"data.train={colours / 'prompts.jsonl'}", f"output_dir={tmp_path}",
        "algo.rollout_batch_size=8", "algo.num_generations=4", "train.batch_size=16", "algo.mini_batch_size=32",
        "train.max_steps=6", "generation.max_new_tokens=6", "optim.lr=1e-3", "track.report=false",
        "track.progress=false", "data.eval_fraction=0", "model.lora.enabled=false", *extra]))
    after = logp_of(tmp_path, colours)
    assert after > before + 0.05, (before, after)


def test_grpo_trains_lora_on_the_language_model_by_default(colours, coin_dir, tmp_path, capsys):
    """No LoRA setting: rlhfkit's default for a VLM, said in one line; the adapters alone learn what is rewarded."""
    before, after = grpo_for_red(coin_dir, colours, tmp_path, lr="3e-3", every_weight=False)
    said = capsys.readouterr().out
    assert "LoRA (r=16) on the language model, rlhfkit's default for a vision-language model" in said
    assert "vision tower and projector are frozen" in said
    assert after > before + 0.05, (before, after)


# model, SFT epochs, data.max_length, GRPO from a model SFT-trained on coin-flip answers (else from the SFT model: its
# samples hold both answers); tiny Idefics3's SFT model answers the picture's colour too surely for GRPO to move it
FAMILIES = {"qwen3_vl": (VLM3, 8, 64, False), "idefics3": (IDEFICS3, 5, 96, True)}


@pytest.mark.cluster  # about a minute on 2 CPU cores each (its own SFT): in make test-cluster's group (budget)
@pytest.mark.parametrize("family", FAMILIES)
def test_another_family_learns_the_pictures_colour_by_sft_and_moves_as_rewarded_by_grpo(family, colours, tmp_path):
    """Qwen3-VL's code paths (DeepStack, interleaved M-RoPE, a Qwen3 text stack) and SmolVLM's (tiny Idefics3: a
    square picture is 2 x 2 tiles + the whole, 20 image tokens and 13 markers, hence ``data.max_length`` 96), their
    rollouts on the default engine: SFT's greedy answers follow the picture, and its export reloads in transformers
    and generates the same tokens; GRPO from that model, paid for ``red``, raises ``red`` on the held-out pictures
    (half of them blue)."""
    model, epochs, length, coin = FAMILIES[family]
    sft(colours, tmp_path / "sft", epochs=epochs, model=model, length=length)
    got = answers(tmp_path / "sft", colours)
    assert sum(w == a for w, a in got) >= 0.75 * len(got), got
    assert_export_generates_the_same(tmp_path / "sft", colours, tmp_path, length)
    if coin:
        sft(colours, tmp_path / "coin", "coin.jsonl", model=model, length=length)
    before, after = grpo_for_red(tmp_path / ("coin" if coin else "sft"), colours, tmp_path / "rl", length)
    assert after > before + 0.05, (before, after)


def grpo_for_red(start: Path, colours: Path, out: Path, length: int = 64, *, lr: str = "1e-3",
                 every_weight: bool = True) -> tuple[float, float]:
    """(before, after): the mean log-probability of ``red`` on the held-out pictures before and after 6 GRPO steps
    from ``start`` paid for answering ``red``: every weight trained, or (``every_weight=False``) no LoRA setting
    given, rlhfkit's default for a VLM."""
    from rlhfkit.config import build_config
    from rlhfkit.train.online.synchronous import run_online

    before = logp_of(start, colours, length)
    run_online(build_config("grpo", {}, [
        f"model.name={start}", f"data.train={colours / 'prompts.jsonl'}", f"output_dir={out}",
        "algo.rollout_batch_size=8", "algo.num_generations=4", "train.batch_size=16", "algo.mini_batch_size=32",
        "train.max_steps=6", "generation.max_new_tokens=6", f"optim.lr={lr}", "track.report=false",
        "track.progress=false", "data.eval_fraction=0", f"reward.functions=[{{fn: {colours / 'rw.py'}:says_red}}]",
        *(["model.lora.enabled=false"] if every_weight else [])]))
    return before, logp_of(out, colours, length)


# ─────────────────────────────────────────── export, eval, generate, the API ───────────────────────────────


def test_export_keeps_processor_and_tower_and_generates_the_same_tokens(sft_dir, colours, tmp_path):
    assert_export_generates_the_same(sft_dir, colours, tmp_path)


def assert_export_generates_the_same(sft_dir: Path, colours: Path, tmp_path: Path, length: int = 64) -> None:
    from transformers import AutoModelForImageTextToText

    from rlhfkit.config import ModelConfig
    from rlhfkit.data import LengthPolicy, load_dataset_records, tokenize_dataset
    from rlhfkit.models.export import export_model
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.models.vision import load_processor
    from rlhfkit.rollout import SamplingParams, make_engine

    out = export_model(sft_dir, tmp_path / "exported", log=None)
    assert {"preprocessor_config.json", "processor_config.json"} & {p.name for p in out.iterdir()}
    reloaded = AutoModelForImageTextToText.from_pretrained(str(out), local_files_only=True).eval()
    processor = load_processor(str(out))  # AutoProcessor, or without its video processor when torchvision is missing
    source, tok = load_causal_lm(ModelConfig(name=str(sft_dir)), trainable=False)
    ex, _ = tokenize_dataset(load_dataset_records(str(colours / "eval_prompts.jsonl"), "prompt"), "prompt",
                             processor.tokenizer, LengthPolicy(length))
    params = SamplingParams(max_new_tokens=6, greedy=True)
    ids, media = [e["prompt_ids"] for e in ex], [e["media"] for e in ex]
    a = make_engine("hf", processor.tokenizer, reloaded).generate(reloaded, ids, params, media=media)
    b = make_engine("hf", tok, source).generate(source, ids, params, media=media)
    assert torch.equal(a.response_ids, b.response_ids)


def test_eval_and_generate_with_images(sft_dir, colours, tmp_path, monkeypatch, capsys):
    from rlhfkit.cli import main

    monkeypatch.chdir(colours)
    assert main(["eval", str(sft_dir), "--data", "eval_prompts.jsonl", "--functions", "exact_match",
                 "--temperature", "0", "--max-new-tokens", "6", "--out", str(tmp_path / "eval.json")]) == 0
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["rewards"]["exact_match"]["mean"] >= 0.75  # the answers follow the pictures
    capsys.readouterr()
    assert main(["generate", str(sft_dir), "--image", "pics/0.png", "--prompt", "Colour?", "--temperature", "0",
                 "--max-new-tokens", "6"]) == 0
    assert capsys.readouterr().out.strip() == "red"  # pics/0.png is a red square
    assert main(["generate", str(sft_dir), "--image", "pics/nope.png", "--prompt", "Colour?"]) == 2


def test_a_trl_vlm_grpo_script_runs_with_changed_imports(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "trl_vlm_script.py"), str(out), VLM], env=env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [r for r in metrics(out) if "rewards/accuracy_reward/mean" in r]
    assert rows and all(0 <= r["rewards/accuracy_reward/mean"] <= 1 for r in rows)
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert {"preprocessor_config.json", "processor_config.json"} & {p.name for p in out.iterdir()}  # the processor


# ─────────────────────────────────────────── the visual task ───────────────────────────────────────────


@pytest.mark.cluster  # minutes on 2 CPU cores: in make test-cluster's group (make test is near its budget)
def test_grpo_learns_the_visual_task(tmp_path):
    """``shapes``: which of a red and a blue square is larger, on a tiny VLM seeing 64 x 64 pictures (16 image tokens)
    with its tower trained. SFT on demonstrations right 70 % of the time teaches the form and the picture (greedy:
    nearly always right) but samples the demonstrations' noise (~65 % right); GRPO with the exact-match reward
    raises the held-out sampled accuracy well above the SFT model's, greedy staying right. (With the tower frozen at
    32 x 32 pixels neither SFT nor GRPO got above a coin: 0.46.)"""
    from rlhfkit.config import ModelConfig, build_config
    from rlhfkit.data import load_dataset_records
    from rlhfkit.models.loading import load_causal_lm
    from rlhfkit.tasks import get_task, make_task_data
    from rlhfkit.tasks.gold import gold_metric
    from rlhfkit.train.online.synchronous import run_online
    from rlhfkit.train.supervised.sft import run_sft

    data = tmp_path / "data"
    make_task_data("shapes", data, n=512, n_eval=128)
    held = load_dataset_records(str(data / "eval_prompts.jsonl"), "prompt")

    def gold(model_dir, temperature: float) -> float:
        model, tok = load_causal_lm(ModelConfig(name=str(model_dir)), trainable=False)
        return gold_metric(model, tok, get_task("shapes"), held, max_new_tokens=8, temperature=temperature,
                           seed=1)["gold"]

    quiet = ["data.eval_fraction=0", "track.report=false", "track.progress=false", "model.train_vision=true"]
    run_sft(build_config("sft", {}, [
        f"model.name={VLM},image=64", f"data.train={data / 'sft.jsonl'}", f"output_dir={tmp_path / 'sft'}",
        "train.batch_size=32", "train.epochs=6", "optim.lr=5e-3", *quiet]))
    run_online(build_config("grpo", {}, [
        f"model.name={tmp_path / 'sft'}", f"data.train={data / 'prompts.jsonl'}", f"output_dir={tmp_path / 'grpo'}",
        "reward.functions=[{fn: exact_match}]", "algo.rollout_batch_size=16", "algo.num_generations=8",
        "algo.ppo_epochs=1", "algo.mini_batch_size=128", "train.batch_size=32", "train.max_steps=12",
        "generation.max_new_tokens=8", "optim.lr=1e-3", *quiet]))
    before = {t: gold(tmp_path / "sft", t) for t in (0.0, 1.0)}
    after = {t: gold(tmp_path / "grpo", t) for t in (0.0, 1.0)}
    # measured 2026-11-28: SFT 0.99 greedy / 0.65 sampled; GRPO's training reward 0.66 -> 0.91 in 12 steps
    assert after[1.0] >= before[1.0] + 0.12, (before, after)
    assert after[0.0] >= 0.9, (before, after)
