# A TRL user's GRPO script, written as TRL's documentation writes it (GRPO Trainer: "Quick start", "Using a custom
# reward function"; the PEFT integration's LoraConfig), ported to rlhfkit by changing one import line:
#     from trl import GRPOConfig, GRPOTrainer   ->   from rlhfkit import GRPOConfig, GRPOTrainer
# The model (argv[2], the tiny built-in one in the test) and output directory (argv[1]) come from the command line;
# TRL's docs load `trl-lib/tldr` from the Hub, which this machine cannot reach, so the dataset is built in place.
import sys

from datasets import Dataset
from peft import LoraConfig

from rlhfkit import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{"prompt": f"Summarize: the {w} sat on the mat."} for w in ("cat", "dog", "fox") * 8])


# Define the reward function, which rewards completions that are close to 20 characters
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


training_args = GRPOConfig(
    output_dir=sys.argv[1],
    learning_rate=1e-3,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=16,
    max_steps=2,
    logging_steps=1,
    report_to="none",
)
trainer = GRPOTrainer(
    model=sys.argv[2],
    reward_funcs=reward_len,
    args=training_args,
    train_dataset=dataset,
    peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
)
trainer.train()
