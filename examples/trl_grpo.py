"""TRL's own GRPOTrainer on turnforge's code env: its tool, its tasks, its verification as the reward."""
import sys

from trl import GRPOConfig, GRPOTrainer

from turnforge.integrations.trl import env_reward, environment_factory, task_dataset

model = sys.argv[1] if len(sys.argv) > 1 else "Qwen/Qwen3-4B-Instruct-2507"
options = {"generate": 500}  # 500 generated math problems (or data=problems.jsonl)
trainer = GRPOTrainer(
    model=model,
    reward_funcs=env_reward,
    train_dataset=task_dataset("code", "train", **options),
    environment_factory=environment_factory("code", **options),
    args=GRPOConfig(output_dir="runs/trl-code", max_completion_length=2048, max_steps=200),
)
trainer.train()
