"""Training on TRL: one wrapper per trainer, and what they share.

    settings.py    SFTSettings, DPOSettings (shared fields declared once), GRPOSettings; the `trl` pass-through
    runtime.py     run-time config fields, dtype, metrics.jsonl, resume, save (merged or adapter)
    sft.py         run_sft: TRL SFTTrainer on pre-tokenized trajectories (input_ids + completion_mask)
    dpo.py         run_dpo: TRL DPOTrainer on round-wise pairs, reference = adapter disabled
    grpo.py        run_grpo: TRL GRPOTrainer with turnforge's multi-turn rollouts as its rollout_func
    curriculum.py  run_curriculum: Environment Tuning, GRPO through phases (hints on, then off)

Nothing is imported here: `settings.py` is light (recipes read it), the trainers import torch and TRL.
"""
