"""DeepSeek-R1-distill's reasoning is split as vLLM's `deepseek_r1` reasoning parser splits it (`--reasoning-parser
deepseek_r1`): its non-streaming `extract_reasoning` and `Family.split_reasoning` on 60 seeded replies, as they follow
the generation prompt `<｜Assistant｜><think>\\n` (the reply starts inside the reasoning).

    .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_reasoning_deepseek_r1.py -q
"""

from __future__ import annotations

import random

import pytest

from vllm_engines import needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm]

PIECES = ["Okay, so the task is to look.", "Zoë sees 東京 — ünïcode ✓", "", "\n", "ACTION: go to desk 1",
          "Thought: the apple.\nACTION: take apple 1 from desk 1", "  spaces  ", "<｜end▁of▁sentence｜>", "</thin", "<thi"]


def seeded_replies(count: int = 60, seed: int = 0) -> list[str]:
    """Replies as an R1-distill model writes them after its prompt: reasoning, then maybe `</think>` and text, with
    the edge shapes vLLM's parser meets (no close tag: cut off while reasoning; empty reasoning; a stray `<think>`
    at the start or inside; a second `</think>`; nothing after the close tag)."""
    rng = random.Random(seed)
    out = []
    for k in range(count):
        reasoning, rest = rng.choice(PIECES), rng.choice(PIECES)
        shape = k % 6
        if shape == 0:
            out.append(f"{reasoning}\n</think>\n\n{rest}")
        elif shape == 1:
            out.append(reasoning + rest)  # never closed
        elif shape == 2:
            out.append(f"</think>{rest}")  # empty reasoning
        elif shape == 3:
            out.append(f"<think>\n{reasoning}</think>{rest}")  # the model opens it again
        elif shape == 4:
            out.append(f"{reasoning}<think>{rest}</think>{rng.choice(PIECES)}</think>{rest}")
        else:
            out.append(f"{reasoning}</think>")  # nothing after it
    return out


@pytest.fixture(scope="module")
def vllm_split():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager

    from turnforge.formats.families import get_family
    from turnforge.tiny_model import train_tokenizer

    # vLLM's parser looks `<think>` / `</think>` up in the tokenizer: a small one with the family's added tokens
    tokenizer = train_tokenizer(iter(seeded_replies()), get_family("deepseek_r1"), vocab_size=600)
    parser = ReasoningParserManager.get_reasoning_parser("deepseek_r1")(tokenizer)
    request = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])

    def split(text: str) -> tuple[str, str]:
        reasoning, content = parser.extract_reasoning(text, request)
        return reasoning or "", content or ""  # vLLM's None: no such part

    return split


def test_split_reasoning_is_vllms_deepseek_r1_parser(vllm_split):
    from turnforge.formats.families import get_family

    family = get_family("deepseek_r1").with_prompt_reasoning("<｜Assistant｜><think>\n")  # as the renderer reads it
    assert family.prompt_reasoning is True
    replies = seeded_replies()
    agree = [family.split_reasoning(text) == vllm_split(text) for text in replies]
    assert sum(agree) == len(replies) == 60, [text for text, ok in zip(replies, agree, strict=True) if not ok]
