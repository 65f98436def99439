"""The server's memory of its replies: for each one, the rendered conversation up to the end of the reply and the
exact ids behind it, so that a client's next request continues from the ids the model wrote (`turnforge serve`).

A remembered text ends where the reply ends, before the token the template writes after it: the eos for most
families, `<|end|>` for Phi-3, the next role's token for GLM-4.5 (which writes none after a reply until something
follows), `<|end|>` where gpt-oss's model wrote `<|return|>`. A later request's rendering is looked up at every
added token it holds (`boundaries`), and the rest is tokenized from that token on: a BPE never merges across an added
token, and a token that swallows the whitespace after it (Phi-3's `rstrip`) swallows it as in the whole text.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable


class ReplyMemory:
    """(model, rendered conversation up to the end of a reply) -> the exact ids, least recently used dropped.

    At most `max_tokens` ids are held.
    """

    def __init__(self, boundaries: Iterable[str], max_tokens: int = 4_000_000):
        # Longest first: where one added token's text starts another's, the longer is the token.
        self.boundary = re.compile("|".join(re.escape(b) for b in sorted(set(boundaries), key=len, reverse=True)))
        self.max_tokens = max_tokens
        self.entries: OrderedDict[tuple[str, str], list[int]] = OrderedDict()
        self.tokens = 0

    def lookup(self, model: str, text: str) -> tuple[int, list[int]] | None:
        """(length of the remembered text, its entry) for the longest remembered prefix of `text` that an added token
        follows; None when no reply of this conversation is remembered."""
        for at in sorted({m.start() for m in self.boundary.finditer(text)}, reverse=True):
            hit = self.entries.get((model, text[:at]))
            if hit is not None:
                self.entries.move_to_end((model, text[:at]))
                return at, hit
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
