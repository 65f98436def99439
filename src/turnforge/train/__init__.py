"""Training stages on TRL: SFT (`sft.py`); DPO, GRPO and the curriculum follow the same shape."""

from turnforge.train.sft import SFTSettings, run_sft

__all__ = ["SFTSettings", "run_sft"]
