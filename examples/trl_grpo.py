"""TRL's own GRPOTrainer on turnforge's code env: its tool, its tasks, its verification as the reward."""
import argparse

from trl import GRPOConfig, GRPOTrainer

from turnforge.integrations.trl import env_reward, environment_factory, task_dataset
from turnforge.train.runtime import runtime_args

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("model", nargs="?", default="Qwen/Qwen3-4B-Instruct-2507", help="a model folder or hub id")
parser.add_argument("--max-steps", type=int, default=200)
parser.add_argument("--max-completion-length", type=int, default=2048, help="tokens per episode, tool results included")
args = parser.parse_args()

options = {"generate": 500}  # 500 generated math problems (or data=problems.jsonl)
trainer = GRPOTrainer(
    model=args.model,
    reward_funcs=env_reward,
    train_dataset=task_dataset("code", "train", **options),
    environment_factory=environment_factory("code", **options),
    # runtime_args(): the device and precision TRL expects here (bf16 on a GPU that has it, else float32 and,
    # without a GPU, use_cpu: TRL's default bf16=True stops a CPU run with "Your setup doesn't support bf16/gpu").
    args=GRPOConfig(output_dir="runs/trl-code", max_completion_length=args.max_completion_length,
                    max_steps=args.max_steps,
                    **runtime_args()),
)
trainer.train()
