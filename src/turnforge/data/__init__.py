"""Data: turning trajectories and conversations into training examples.

    sft.py   SFTExample, assistant_mask (which tokens carry loss), trajectory_examples, conversation_examples
"""

from __future__ import annotations

from turnforge.data.sft import SFTExample, assistant_mask, conversation_examples, trajectory_examples

__all__ = ["SFTExample", "assistant_mask", "conversation_examples", "trajectory_examples"]
