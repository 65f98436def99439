"""The server's memory of its replies: for each one, the rendered conversation up to the end of the reply and the
exact ids behind it, so that a client's next request continues from the ids the model wrote (`turnforge serve`).
"""

from __future__ import annotations

from collections import OrderedDict


class ReplyMemory:
    """(model, rendered conversation up to the end of a reply) -> the exact ids, least recently used dropped.

    At most `max_tokens` ids are held.
    """

    def __init__(self, eos_text: str, max_tokens: int = 4_000_000):
        self.eos_text, self.max_tokens = eos_text, max_tokens
        self.entries: OrderedDict[tuple[str, str], list[int]] = OrderedDict()
        self.tokens = 0

    def lookup(self, model: str, text: str) -> tuple[int, list[int]] | None:
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

    def store(self, model: str, text: str, ids: list[int]) -> None:
        key = (model, text)
        if key in self.entries:
            self._drop(key)
        self.entries[key] = ids
        self.tokens += len(ids)
        while self.tokens > self.max_tokens and len(self.entries) > 1:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: tuple[str, str]) -> None:
        self.tokens -= len(self.entries.pop(key))
