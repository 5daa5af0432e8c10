"""Big models on one GPU (issue 32, part 3): the seeds' cases run by rlhfkit's own online loop with random weights
built from published configs (``configs/models/``: Llama-2-7B, Pythia-1.4B, Qwen3-8B; no weights file, no download),
the peak of each phase measured (``torch.cuda.max_memory_allocated``, reset at each phase's start) against what
``rlhfkit plan`` predicts for the same config, and the time of a step.

Cases (``--cases 1,2,3,4,5``):
  1  PPO: Llama-2-7B-shaped policy with LoRA (r=16; the reference = the adapter off), Pythia-1.4B-shaped reward model
     and critic, 128 new tokens, rollout batch 8;
  2  the same with every weight trained: FSDP2 with CPU offload on the one GPU (``distributed.strategy=fsdp2
     distributed.cpu_offload=true``: parameters, gradients and AdamW states in host memory), bf16 weights so the host
     holds 8 bytes per trained parameter (the machine has 128 GiB);
  3  GRPO: Qwen3-8B-shaped policy with LoRA, 512 new tokens, 8 prompts x 8 completions;
  4  the same with QLoRA (bitsandbytes 4-bit base; skipped, with why, when bitsandbytes is not installed);
  5  GRPO on pictures: a Qwen2.5-VL-3B-shaped vision-language model (``configs/models/qwen2.5-vl-3b``: its 669M
     tower and 3.1B language model), LoRA r=16 on the language model (``model.lora.enabled=true``, set explicitly),
     the tower frozen, 8 prompts x 8 completions, each prompt 64 words and one 448 x 448 picture drawn with PIL (256
     image tokens), 256 new tokens, a reward reading the picture and the answer (``PICTURE_REWARD``).

How: ``rlhfkit.train.online.synchronous.run_online`` on the case's config, as the CLI runs it, with two substitutions
made only
here: model loading builds the model from its ``config.json`` straight on the device with transformers' own random
initialisation (QLoRA: saved once to a temporary directory and loaded through the real 4-bit path), and the final
model is neither gathered nor written (a 7B directory per case would cost minutes and disk; the loop up to that
point is unchanged).
The tokenizer is a word-level one with the model's vocabulary size, made here; prompts are random words; the reward
of GRPO is the built-in ``length_target``. Case 5's directory also holds the model's ``preprocessor_config.json``
with its largest image set to the pictures' size (``max_pixels``: the processor makes 256 image tokens of each, and
``plan`` counts what the processor makes), and its word tokenizer has Qwen2's special tokens at the config's ids and
the family's chat template, so rlhfkit loads the processor as it loads a real model's (no torchvision needed).
Two steps per case: the second gives s/step, the peaks are over both.

The prediction's phases and the measured ones: ``rollout (generation)`` = ``rollout``; ``scoring and forward passes``
= the largest of ``reward``, ``old_logprobs``, ``reference``, ``values``; ``train step`` = ``update``.

    python bench/big_models.py [--cases 1,2,3,4,5]    # CUDA: well under 8 minutes on an H100 (gpu_check --only m)
    .venv/bin/python bench/big_models.py --quick      # CPU: the same control flow at a tiny scale (no peaks)
"""

from __future__ import annotations

import contextlib
import gc
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "configs" / "models"
GiB = 1024**3
PHASES = {"rollout (generation)": ("rollout",), "scoring and forward passes": ("reward", "old_logprobs", "reference",
                                                                               "values"),
          "train step": ("update",)}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16}


def case_specs(quick: bool) -> dict[int, dict]:
    """The five cases: the models (config names), the recipe and its overrides; ``quick``: the same at a tiny scale
    (two layers, hidden 64, the vocabularies cut to 1024; case 5: a two-block tower, 56 x 56 pictures), 8 new
    tokens, 4 prompts."""
    new = (lambda n: 8) if quick else (lambda n: n)
    side = 56 if quick else 448  # the VLM case's pictures: 4 / 256 image tokens each
    ppo = ["algo.rollout_batch_size=" + ("2" if quick else "8"), "algo.num_generations=1",
           "algo.mini_batch_size=" + ("2" if quick else "8"), "train.batch_size=" + ("2" if quick else "8"),
           f"generation.max_new_tokens={new(128)}", "model.gradient_checkpointing=true"]
    grpo = ["algo.rollout_batch_size=" + ("2" if quick else "8"), "algo.num_generations=" + ("2" if quick else "8"),
            "algo.mini_batch_size=" + ("4" if quick else "64"), "train.batch_size=" + ("2" if quick else "8"),
            f"generation.max_new_tokens={new(512)}", "model.gradient_checkpointing=true",
            "reward.functions=[{fn: length_target, kwargs: {target: 200}}]"]
    return {
        1: {"name": "PPO Llama-2-7B LoRA + Pythia-1.4B RM/critic", "recipe": "ppo", "policy": "llama2-7b",
            "others": {"reward.model": "pythia-1.4b", "critic.model": "pythia-1.4b"},
            "overrides": ppo + ["model.lora.enabled=true", "model.lora.r=16"]},
        2: {"name": "PPO Llama-2-7B full (FSDP2 CPU offload)", "recipe": "ppo", "policy": "llama2-7b",
            "others": {"reward.model": "pythia-1.4b", "critic.model": "pythia-1.4b"},
            "overrides": ppo + ["distributed.strategy=fsdp2", "distributed.cpu_offload=true", "model.dtype=bfloat16"]},
        3: {"name": "GRPO Qwen3-8B LoRA 8x8", "recipe": "grpo", "policy": "qwen3-8b", "others": {},
            "overrides": grpo + ["model.lora.enabled=true", "model.lora.r=16"]},
        4: {"name": "GRPO Qwen3-8B QLoRA 8x8", "recipe": "grpo", "policy": "qwen3-8b", "others": {},
            "overrides": grpo + ["model.lora.enabled=true", "model.lora.r=16", "model.lora.qlora=true"],
            "needs": "bitsandbytes"},
        5: {"name": "GRPO Qwen2.5-VL-3B LoRA, tower frozen, 8x8", "recipe": "grpo", "policy": "qwen2.5-vl-3b",
            "others": {}, "side": side, "words": 16 if quick else 64,
            "overrides": grpo[:4] + [f"generation.max_new_tokens={new(256)}", "model.gradient_checkpointing=true",
                                     "model.lora.enabled=true", "model.lora.r=16", "model.train_vision=false"],
            "about": f"Qwen2.5-VL-3B's config.json ({'tiny-scaled, vocabulary cut to 1,024' if quick else 'its sizes'}"
                     ", random weights, a word tokenizer of its vocabulary), "
                     f"{grpo[0].split('=')[1]} prompts x {grpo[1].split('=')[1]} completions, each prompt "
                     f"{16 if quick else 64} words and one {side} x {side} picture ({(side // 28) ** 2} image tokens), "
                     f"{new(256)} new tokens, LoRA r=16 on the language model, the vision tower frozen, a reward "
                     "reading the picture"},
    }


# ───────────────────────────────────────────── files of a case ──────────────────────────────────────────────


def word_tokenizer(vocab: int, out: Path) -> None:
    """A word-level tokenizer of exactly ``vocab`` ids (specials, role markers, then ``w5``..): every id a model with
    random weights samples decodes to a word."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>", "<user>", "<assistant>"]
    words = {w: i for i, w in enumerate(specials + [f"w{i}" for i in range(len(specials), vocab)])}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}<assistant>{% endif %}")
    fast.save_pretrained(out)


def model_dir(name: str, quick: bool, tmp: Path, vocab: int | None = None) -> Path:
    """``configs/models/<name>``'s config.json (tiny-scaled with ``quick``) and a word tokenizer of ``vocab`` ids (the
    model's own by default) in a directory of ``tmp``."""
    cfg = json.loads((MODELS / name / "config.json").read_text())
    if quick:
        cfg.update({k: v for k, v in TINY.items() if k in cfg or k != "head_dim"})
        cfg["vocab_size"] = min(cfg["vocab_size"], 1024)
        cfg.pop("bos_token_id", None)
        cfg.pop("eos_token_id", None)
        if cfg.get("model_type") == "gpt_neox":
            cfg.pop("num_key_value_heads", None)
            cfg.pop("head_dim", None)
    out = tmp / f"{name}-{vocab or cfg['vocab_size']}"
    if not out.exists():
        out.mkdir(parents=True)
        (out / "config.json").write_text(json.dumps(cfg))
        word_tokenizer(vocab or cfg["vocab_size"], out)
    return out


def prompts_file(tmp: Path, n: int, words: int, vocab: int) -> Path:
    g = torch.Generator().manual_seed(0)
    path = tmp / f"prompts-{n}-{words}.jsonl"
    with path.open("w") as fh:
        for _ in range(n):
            ids = torch.randint(5, vocab, (words,), generator=g).tolist()
            fh.write(json.dumps({"prompt": " ".join(f"w{i}" for i in ids)}) + "\n")
    return path


# ───────────────────────────────────────────── files of the VLM case ─────────────────────────────────────────
# Qwen2's special tokens at their real ids (the config's bos / eos / image ids point at them); ``quick`` moves them
# to the top of the cut vocabulary
QWEN_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
                 "<|vision_end|>": 151653, "<|vision_pad|>": 151654, "<|image_pad|>": 151655, "<|video_pad|>": 151656}
TINY_TOWER = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "fullatt_block_indexes": [1]}
PICTURE_REWARD = '''
def picture_words(prompts, completions, image, **kwargs):
    """How near the answer's share of even-numbered words (``w2``, ``w4``, ...) is to the picture's brightness: reads
    the image column (PIL images in kwargs, TRL's convention) and the answer, as a VLM task's reward does, and
    differs between the samples of a group (answers of one length all), so every update has a signal."""
    out = []
    for text, picture in zip(completions, image):
        bright = sum(picture.convert("L").resize((8, 8)).getdata()) / (64 * 255)
        words = text.split() or [""]
        even = sum(w[1:].isdigit() and int(w[1:]) % 2 == 0 for w in words) / len(words)
        out.append(-abs(even - bright))
    return out
'''


def vlm_model_dir(name: str, quick: bool, tmp: Path, side: int) -> Path:
    """A Qwen2.5-VL directory: ``configs/models/<name>``'s config.json (``quick``: tiny text model and tower, the
    vocabulary cut to 1024 and the special tokens' ids moved into it), its preprocessor_config.json with the largest
    image ``side`` x ``side`` pixels (the pictures' size: the processor makes (side / 28)^2 image tokens of each, and
    ``plan`` counts that many), and a word tokenizer of the model's vocabulary with Qwen2's special tokens at the
    config's ids and the family's chat template (``{"type": "image"}`` parts; ``models/tiny_vlm.py``'s). rlhfkit
    loads the processor from these files as it loads a real model's (``models/vision.py``: no torchvision needed)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlhfkit.models.tiny_vlm import chat_template

    cfg = json.loads((MODELS / name / "config.json").read_text())
    vocab = 1024 if quick else cfg["vocab_size"]
    base = vocab - 24 if quick else QWEN_SPECIALS["<|endoftext|>"]
    ids = {t: i - QWEN_SPECIALS["<|endoftext|>"] + base for t, i in QWEN_SPECIALS.items()}
    if quick:
        cfg.update({k: v for k, v in TINY.items() if k in cfg}, vocab_size=vocab)
        cfg["rope_scaling"] = {**cfg["rope_scaling"], "mrope_section": [2, 3, 3]}  # head 16: 8 rotary pairs
        cfg["vision_config"].update(TINY_TOWER, out_hidden_size=TINY["hidden_size"])
        for key, token in (("bos_token_id", "<|endoftext|>"), ("eos_token_id", "<|im_end|>"),
                           ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
                           ("vision_token_id", "<|vision_pad|>"), ("image_token_id", "<|image_pad|>"),
                           ("video_token_id", "<|video_pad|>")):
            cfg[key] = ids[token]
    out = tmp / f"{name}-{vocab}-{side}px"
    if out.exists():
        return out
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg))
    pre = json.loads((MODELS / name / "preprocessor_config.json").read_text())
    pixels = side * side
    pre.update(min_pixels=min(pre["min_pixels"], pixels), max_pixels=pixels,
               size={"shortest_edge": min(pre["min_pixels"], pixels), "longest_edge": pixels})
    (out / "preprocessor_config.json").write_text(json.dumps(pre))
    words = {"<unk>": 0, "system": 1, "user": 2, "assistant": 3}
    words.update({f"w{i}": i for i in range(len(words), vocab) if i not in ids.values()})
    core = Tokenizer(models.WordLevel({**words, **ids}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.add_special_tokens(list(ids))  # split out of the text before the words (the image tokens run together)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                  unk_token="<unk>", additional_special_tokens=["<|im_start|>"],
                                  extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                                                        "vision_start_token": "<|vision_start|>",
                                                        "vision_end_token": "<|vision_end|>"})
    tok.chat_template = chat_template("qwen2_5_vl")
    tok.save_pretrained(out)
    return out


def picture_prompts_file(tmp: Path, n: int, words: int, top: int, side: int) -> Path:
    """``n`` prompts of random words (ids below ``top``, the first special token's), each with its own ``side`` x
    ``side`` picture (coloured rectangles on a coloured ground, drawn with PIL) in a folder beside the file."""
    from PIL import Image, ImageDraw

    g = torch.Generator().manual_seed(0)
    folder = tmp / f"pictures-{side}"
    folder.mkdir(exist_ok=True)
    path = tmp / f"picture-prompts-{n}-{words}-{side}.jsonl"
    with path.open("w") as fh:
        for i in range(n):
            colours = [tuple(torch.randint(0, 256, (3,), generator=g).tolist()) for _ in range(4)]
            picture = Image.new("RGB", (side, side), colours[0])
            draw = ImageDraw.Draw(picture)
            for colour in colours[1:]:
                x0, y0 = torch.randint(0, side // 2, (2,), generator=g).tolist()
                x1, y1 = torch.randint(side // 2, side, (2,), generator=g).tolist()
                draw.rectangle((x0, y0, x1, y1), fill=colour)
            picture.save(folder / f"{i}.png")
            ids = torch.randint(4, top, (words,), generator=g).tolist()
            fh.write(json.dumps({"prompt": " ".join(f"w{j}" for j in ids),
                                 "image": f"{folder.name}/{i}.png"}) + "\n")
    return path


# ───────────────────────────────────────────── the substitutions ─────────────────────────────────────────────


def random_weights(device: torch.device, tmp: Path):
    """A stand-in for ``rlhfkit.models.loading._from_pretrained``: the model built from the directory's config.json
    on ``device`` with transformers' random initialisation (seeded by the directory's name, so the reference equals
    the policy); with a quantization config (QLoRA), those random weights saved once and loaded the real way."""
    from transformers import AutoConfig

    from rlhfkit.models import loading

    real = loading._from_pretrained

    def build(cls, source: str, dtype: torch.dtype, **kwargs):
        config = kwargs.pop("config", None) or AutoConfig.from_pretrained(source)
        quantized = kwargs.get("quantization_config") is not None
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(sum(map(ord, Path(source).name)))
            with torch.device(device if not quantized else "cpu"):
                model = cls.from_config(config, dtype=torch.bfloat16 if quantized else dtype)
        if not quantized:
            return model
        saved = tmp / f"{Path(source).name}-weights"
        if not saved.exists():
            model.save_pretrained(saved)
            shutil.copy(Path(source) / "tokenizer.json", saved)
        del model
        gc.collect()
        return real(cls, str(saved), dtype, **kwargs)

    return build


@contextlib.contextmanager
def substituted(device: torch.device, tmp: Path, peaks: dict):
    """Random weights for every model, no final model written, each timed phase's peak recorded in ``peaks``."""
    import rlhfkit.train.online.online_run as online
    from rlhfkit.models import loading
    from rlhfkit.track import timing
    from rlhfkit.train.lifecycle.distributed import FSDP2Strategy

    saved = (loading._from_pretrained, online.save_model, timing.PhaseTimer.phase, FSDP2Strategy.full_model)
    original_phase = timing.PhaseTimer.phase

    @contextlib.contextmanager
    def phase(self, name):
        if self._open is None and device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        with original_phase(self, name):
            yield
        if self._open is None and device.type == "cuda":
            peaks[name] = max(peaks.get(name, 0), torch.cuda.max_memory_allocated(device))

    loading._from_pretrained = random_weights(device, tmp)
    online.save_model = lambda model, tok, out_dir, **kw: (Path(out_dir) / "model-not-saved.txt").write_text(
        "bench/big_models.py: the final model is not written\n")
    timing.PhaseTimer.phase = phase
    # the final model is not written, so not gathered either (FSDP2 would build a plain fp32 7B on the host for it)
    FSDP2Strategy.full_model = lambda self, accelerator, model: accelerator.unwrap_model(model)
    try:
        yield
    finally:
        loading._from_pretrained, online.save_model, timing.PhaseTimer.phase, FSDP2Strategy.full_model = saved


# ───────────────────────────────────────────── a case ─────────────────────────────────────────────────────


def run_case(spec: dict, device: torch.device, quick: bool, tmp: Path) -> dict:
    """Plan, run two steps, compare: ``{"name", "phases": [(phase, predicted, measured)], "s_per_step", "note"}``."""
    import importlib.util

    from accelerate.state import AcceleratorState

    from rlhfkit.plan import plan
    from rlhfkit.train.online.synchronous import run_online

    if spec.get("needs") and importlib.util.find_spec(spec["needs"]) is None:
        return {"name": spec["name"], "skip": f"{spec['needs']} not installed (bench/README.md: the wheel to carry)"}
    if spec.get("needs") and device.type != "cuda":
        return {"name": spec["name"], "skip": f"{spec['needs']} needs CUDA"}
    cfg, out = case_config(spec, quick, tmp)
    note = ""
    if quick and cfg.distributed.cpu_offload:  # the path runs on CPU (gloo), its point needs CUDA
        note = "CPU: FSDP2 over a group of one, offload to where it already is"
    predicted = {p.name: p.total for p in plan(cfg, world=1, device=device.type, checks=False).phases}
    peaks: dict = {}
    AcceleratorState._reset_state()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    with substituted(device, tmp, peaks), (_cpu_offload_allowed() if note else contextlib.nullcontext()):
        metrics = run_online(cfg)
    wall = time.perf_counter() - t0
    _end_process_group()
    shutil.rmtree(out, ignore_errors=True)
    rows = []
    for phase, measured_names in PHASES.items():
        seen = [peaks[m] for m in measured_names if m in peaks]
        rows.append((phase, predicted.get(phase), max(seen) if seen else None))
    return {"name": spec["name"], "phases": rows, "s_per_step": metrics.get("time/step"), "wall": wall,
            "note": note, "about": spec.get("about", "")}


def case_config(spec: dict, quick: bool, tmp: Path):
    """The case's config (its model directories and prompts written into ``tmp``) and its run directory."""
    from rlhfkit.config import build_config

    side = spec.get("side")  # a VLM case: pictures of side x side pixels
    policy = vlm_model_dir(spec["policy"], quick, tmp, side) if side else model_dir(spec["policy"], quick, tmp)
    vocab = json.loads((policy / "config.json").read_text())["vocab_size"]
    others = {k: model_dir(v, quick, tmp, vocab=vocab) for k, v in spec["others"].items()}  # the policy's tokenizer
    k = next((int(o.split("=")[1]) for o in spec["overrides"] if o.startswith("algo.num_generations=")), 1)
    n = next(int(o.split("=")[1]) for o in spec["overrides"] if o.startswith("algo.rollout_batch_size="))
    if side:  # the words, the picture's image tokens and the chat template's 7 tokens
        prompt_words = spec["words"]
        prompt_len = prompt_words + (side // 28) ** 2 + 8
        top = json.loads((policy / "config.json").read_text())["bos_token_id"]  # <|endoftext|>, the first special
        data = picture_prompts_file(tmp, n * 2, prompt_words, top, side)
        reward = tmp / "picture_reward.py"
        reward.write_text(PICTURE_REWARD)
        spec = {**spec, "overrides": [*spec["overrides"], f"reward.functions=[{{fn: '{reward}:picture_words'}}]"]}
    else:
        prompt_words = 16 if quick else 250
        prompt_len = prompt_words + 8
        data = prompts_file(tmp, n * 2, prompt_words, vocab)
    out = tmp / f"run-{spec['recipe']}-{abs(hash(spec['name']))}"
    overrides = [f"model.name={policy}", *(f"{key}={path}" for key, path in others.items()), *spec["overrides"],
                 f"data.train={data}", f"output_dir={out}", f"algo.total_episodes={2 * n * k}",
                 f"data.max_prompt_length={prompt_len}", f"data.max_length={prompt_len}",
                 "train.eval_every=0", "train.save_every=0", "track.report=false", "track.progress=false",
                 "data.eval_fraction=0"]
    return build_config(spec["recipe"], {}, overrides), out


@contextlib.contextmanager
def _cpu_offload_allowed():
    """The CPU rehearsal only: ``distributed.cpu_offload`` is refused on CPU by the config check (it would move
    nothing); the rehearsal lets it through to run the FSDP2 path."""
    from rlhfkit.config import checks

    real = checks._inputs_distributed
    checks._inputs_distributed = lambda cfg: None
    try:
        yield
    finally:
        checks._inputs_distributed = real


def _end_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def run(device: torch.device, quick: bool, cases: list[int]) -> list[dict]:
    specs = case_specs(quick)
    results = []
    tmp = Path(tempfile.mkdtemp(prefix="rlhfkit-big-"))
    try:
        for c in cases:
            t0 = time.perf_counter()
            try:
                r = run_case(specs[c], device, quick, tmp)
            except Exception as e:  # a failed case is a FAIL row, the others still run
                import traceback

                traceback.print_exc()
                r = {"name": specs[c]["name"], "fail": f"{type(e).__name__}: {str(e).splitlines()[0][:140]}"}
            print(f"[{time.perf_counter() - t0:6.1f}s] case {c}: {r.get('skip') or r.get('fail') or 'ran'}",
                  flush=True)
            results.append(r)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def table(results: list[dict]) -> list[str]:
    """case | phase | predicted GiB | measured GiB | measured / predicted | s/step."""
    gib = lambda x: "n/a" if x is None else f"{x / GiB:7.2f}"  # noqa: E731
    lines = [f"{'case':46} {'phase':28} {'predicted GiB':>13} {'measured GiB':>12} {'meas/pred':>9} {'s/step':>7}",
             "-" * 120]
    for r in results:
        if "phases" not in r:
            lines.append(f"{r['name']:46} {'SKIP: ' + r['skip'] if 'skip' in r else 'FAIL: ' + r['fail']}")
            continue
        for i, (phase, pred, meas) in enumerate(r["phases"]):
            ratio = f"{meas / pred:9.2f}" if pred and meas else f"{'n/a':>9}"
            step = f"{r['s_per_step']:7.1f}" if i == 0 and r["s_per_step"] else ""
            lines.append(f"{r['name'] if i == 0 else '':46} {phase:28} {gib(pred):>13} {gib(meas):>12} {ratio} {step}")
        if r.get("note"):
            lines.append(f"{'':46} ({r['note']})")
    return lines


def within(results: list[dict], tolerance: float = 0.10) -> bool | None:
    """Every measured phase within ``tolerance`` of its prediction (None: nothing measured, e.g. on CPU)."""
    pairs = [(p, m) for r in results for _, p, m in r.get("phases", []) if p and m]
    return None if not pairs else all(abs(m / p - 1) <= tolerance for p, m in pairs)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny scale (the default on CPU)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--cases", default="1,2,3,4,5")
    args = ap.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    quick = args.quick or device.type == "cpu"
    results = run(device, quick, [int(c) for c in args.cases.split(",")])
    print("\n".join(table(results)))
    ok = within(results)
    print("plan within 10 % of every measured phase:", "n/a (no CUDA peaks)" if ok is None else ok)


if __name__ == "__main__":
    main()
