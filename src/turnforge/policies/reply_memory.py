"""The server's memory of its replies: for each one, the rendered conversation up to the end of the reply and the
exact ids behind it, so that a client's next request continues from the ids the model wrote (`turnforge serve`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass


@dataclass
class Remembered:
    ids: list[int]
    key: tuple[str, int]  # the hf policy's prefix-cache key for this conversation


class ReplyMemory:
    """(model, rendered conversation up to the end of a reply) -> the exact ids, least recently used dropped.

    At most `max_tokens` ids and `max_conversations` prefix-cache keys are held (the keys/values behind each
    key live in the hf policy's prefix cache). `store` returns the keys no entry uses any more, to release.
    """

    def __init__(self, eos_text: str, max_tokens: int = 4_000_000, max_conversations: int = 512):
        self.eos_text, self.max_tokens, self.max_conversations = eos_text, max_tokens, max_conversations
        self.entries: OrderedDict[tuple[str, str], Remembered] = OrderedDict()
        self.tokens = 0
        self.uses: Counter[tuple[str, int]] = Counter()

    def lookup(self, model: str, text: str) -> tuple[int, Remembered] | None:
        """(length of the remembered text, its entry) for the longest remembered prefix of `text` that ends
        with the end-of-turn text; None when no reply of this conversation is remembered."""
        end = len(text)
        while (at := text.rfind(self.eos_text, 0, end)) >= 0:
            cut = at + len(self.eos_text)
            hit = self.entries.get((model, text[:cut]))
            if hit is not None:
                self.entries.move_to_end((model, text[:cut]))
                return cut, hit
            end = at
        return None

    def store(self, model: str, text: str, entry: Remembered) -> list[tuple[str, int]]:
        key = (model, text)
        if key in self.entries:
            self._drop(key)
        self.entries[key] = entry
        self.tokens += len(entry.ids)
        self.uses[entry.key] += 1
        released = []
        while (self.tokens > self.max_tokens or len(self.uses) > self.max_conversations) and len(self.entries) > 1:
            released += self._drop(next(iter(self.entries)))
        return released

    def _drop(self, key: tuple[str, str]) -> list[tuple[str, int]]:
        entry = self.entries.pop(key)
        self.tokens -= len(entry.ids)
        self.uses[entry.key] -= 1
        if self.uses[entry.key] > 0:
            return []
        del self.uses[entry.key]
        return [entry.key]
