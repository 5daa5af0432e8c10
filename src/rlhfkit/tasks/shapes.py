"""The built-in ``shapes`` task: which of two coloured squares in a picture is larger, for vision-language models.

Each picture (32 x 32 pixels, PNG, written next to the data files under ``images/``) holds a red and a blue square
on a black background, one in each half (which one where is drawn at random), of sides 3 to 14 pixels that differ
by at least 6; the question is ``Which square is larger, red or blue?`` and the answer ``red`` or ``blue``. Nothing
in the text tells them apart: a model answers better than a coin only by looking at the picture.

* ``sft.jsonl``: demonstrations of the answer's form, right for ``correct_fraction`` of them (default 70 %), so
  SFT teaches the form, and the picture only as far as 70 % right demonstrations do;
* ``prompts.jsonl`` / ``eval_prompts.jsonl`` (held out, another seed): ``prompt``, ``image`` and ``answer`` (what
  the ``exact_match`` reward reads: ``reward.functions=[{fn: exact_match}]``);
* the gold metric (:meth:`ShapesTask.gold`) measures the two squares in the picture itself (a program: the
  coloured pixels of each half), so ``rlhfkit eval --task shapes`` needs no answer column.

A tiny VLM (``tiny:arch=qwen2_5_vl,image=64`` with ``model.train_vision=true``) learns it on a CPU: SFT answers
right greedily but samples the demonstrations' noise, GRPO raises the held-out sampled accuracy (0.65 -> 0.90;
``tests/e2e/test_vision.py::test_grpo_learns_the_visual_task``). With the tower frozen at 32 pixels it stays a coin.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .base import DataFile

SIDE = 32
QUESTION = "Which square is larger, red or blue?"
COLOURS = {"red": (230, 40, 40), "blue": (40, 70, 240)}


@dataclass(frozen=True)
class ShapesTask:
    name: str = "shapes"
    correct_fraction: float = 0.7
    low: int = 3
    high: int = 14
    gap: int = 6

    writes_files: ClassVar[bool] = True  # its records name image files it writes beside them (make_task_data)
    uses_images: ClassVar[bool] = True  # its gold metric reads the record's images
    FILES: ClassVar[dict[str, DataFile]] = {
        "sft.jsonl": DataFile("sft_records", False, "demonstrations of the answer's form ('red' / 'blue', right "
                              "for 70 % of them) with their pictures", "rlhfkit sft"),
        "prompts.jsonl": DataFile("prompt_records", False, "pictures with the question: prompt, image, answer",
                                  "rlhfkit grpo / rloo / reinforce / ppo with reward.functions=[{fn: exact_match}]"),
        "eval_prompts.jsonl": DataFile("prompt_records", True, "held-out pictures (another seed)",
                                       "data.eval of the online recipes; rlhfkit eval --task shapes"),
    }

    def picture(self, rng: random.Random) -> tuple[bytes, str]:
        """(a PNG, its answer): a red and a blue square, the larger one's colour named."""
        import numpy as np
        from PIL import Image

        a = rng.randint(self.low, self.high)
        b = rng.choice([s for s in range(self.low, self.high + 1) if abs(s - a) >= self.gap])
        pixels = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
        half = SIDE // 2
        halves = (0, half) if rng.random() < 0.5 else (half, 0)
        for side, x0, colour in ((a, halves[0], COLOURS["red"]), (b, halves[1], COLOURS["blue"])):
            x = x0 + rng.randint(0, half - side)
            y = rng.randint(0, SIDE - side)
            pixels[y:y + side, x:x + side] = colour
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        return buf.getvalue(), "red" if a > b else "blue"

    def _records(self, n: int, seed: int, kind: str, out: Path | None) -> list[tuple[str, str]]:
        """``n`` (image path relative to the data files, answer) pairs; the PNGs written under ``out/images``."""
        rng = random.Random(f"{self.name}-{kind}-{seed}")
        folder = Path(out or ".") / "images"
        folder.mkdir(parents=True, exist_ok=True)
        pairs = []
        for i in range(n):
            png, answer = self.picture(rng)
            name = f"images/{kind}-{seed}-{i}.png"
            (Path(out or ".") / name).write_bytes(png)
            pairs.append((name, answer))
        return pairs

    def prompt_records(self, n: int, seed: int = 0, out: Path | None = None) -> list[dict]:
        return [{"prompt": QUESTION, "image": path, "answer": answer}
                for path, answer in self._records(n, seed, "prompt", out)]

    def sft_records(self, n: int, seed: int = 0, out: Path | None = None) -> list[dict]:
        rng = random.Random(f"{self.name}-sft-answers-{seed}")
        out_rows = []
        for path, answer in self._records(n, seed, "sft", out):
            if rng.random() >= self.correct_fraction:
                answer = "blue" if answer == "red" else "red"
            out_rows.append({"prompt": QUESTION, "image": path, "completion": answer})
        return out_rows

    @staticmethod
    def measure(image) -> str | None:
        """The colour ('red' / 'blue') with more pixels in a picture (a PIL image), or None."""
        import numpy as np

        pixels = np.asarray(image.convert("RGB")).astype(int)
        red = int(((pixels[..., 0] > 128) & (pixels[..., 2] < 128)).sum())
        blue = int(((pixels[..., 2] > 128) & (pixels[..., 0] < 128)).sum())
        return None if red == blue else "red" if red > blue else "blue"

    @classmethod
    def gold(cls, prompt: str, completion: str, images: list | None = None) -> float:
        """1.0 when the completion's first word names the colour whose square the picture shows larger."""
        from ..data.images import open_image

        if not images:
            return 0.0
        want = cls.measure(open_image(images[0]))
        words = completion.strip().lower().split()
        return float(bool(words) and want is not None and words[0].strip(".,!") == want)


TASK = ShapesTask()
