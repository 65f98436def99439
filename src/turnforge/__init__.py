"""turnforge: train and evaluate small LLM agents on multi-turn, tool-using environments."""

__version__ = "0.1.0"
