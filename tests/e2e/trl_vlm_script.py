# A TRL user's vision-language GRPO script, written as TRL's documentation and examples write one (GRPO Trainer,
# "Vision-Language Model (VLM) training"; examples/scripts/grpo_vlm.py: conversational prompts with an image part, the
# image column beside them, a reward reading the `solution` column, the PEFT integration's LoraConfig), ported to
# rlhfkit by changing one import line:
#     from trl import GRPOConfig, GRPOTrainer   ->   from rlhfkit import GRPOConfig, GRPOTrainer
# The model (argv[2], a tiny Qwen2.5-VL in the test) and output directory (argv[1]) come from the command line; the
# example loads `lmms-lab/multimodal-open-r1-8k-verified` from the Hub, which this machine cannot reach, so the
# dataset is built in place: pictures of a red or a blue square.
import sys

from datasets import Dataset
from peft import LoraConfig
from PIL import Image

from rlhfkit import GRPOConfig, GRPOTrainer

COLOURS = {"red": (230, 40, 40), "blue": (40, 70, 240)}
dataset = Dataset.from_list([{"image": Image.new("RGB", (16, 16), COLOURS[c]), "problem": "What colour is it?",
                              "solution": c} for c in ("red", "blue") * 12])


def make_conversation(example):
    conversation = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": example["problem"]}]},
    ]
    return {"prompt": conversation, "image": example["image"]}


dataset = dataset.map(make_conversation)


def accuracy_reward(completions, solution, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if content.strip() == sol else 0.0 for content, sol in zip(contents, solution)]


training_args = GRPOConfig(
    output_dir=sys.argv[1],
    learning_rate=1e-3,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=8,
    max_steps=2,
    logging_steps=1,
    report_to="none",
)
trainer = GRPOTrainer(
    model=sys.argv[2],
    reward_funcs=[accuracy_reward],
    args=training_args,
    train_dataset=dataset,
    peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
)
trainer.train()
