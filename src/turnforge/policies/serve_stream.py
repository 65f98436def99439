"""`stream: true` for `turnforge serve`: a reply as OpenAI's `chat.completion.chunk` deltas, token by token.

The hf engine reports each reply as it grows (`HFPolicy.generate(on_token=...)`); the server sends what is
already certain (`EarlyPieces`): the text cut at token boundaries (one chunk per token, or per few tokens where
a token ends inside a UTF-8 character), holding back the last piece (the next token may still change how it
decodes) and any tail that could begin a stop string. When the reply ends, the rest follows (`choice_chunks`,
skipping what was sent), so a client sees the same chunks, and the same concatenated text, as the non-streamed
reply cut the same way. The chunks never hold text past the reply's content (a stop string and what follows
it are cut away), and their log-probabilities and token ids (vLLM's `return_token_ids`), put together, are the
non-streamed reply's. A request with tools streams its reply when it ends: whether the text is a tool call is
known only then.

Shapes follow OpenAI's chat-completions streaming: the first delta of a choice has the role, then content
deltas, a tool call as {index, id, type, function.name, arguments ""} followed by its arguments, and a last
chunk with an empty delta and `finish_reason`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from turnforge.policies.base import Generation


@dataclass
class Choice:
    """One finished choice of a completion: its OpenAI message, finish reason and the generation behind it."""

    index: int
    message: dict[str, Any]
    finish: str
    gen: Generation


@dataclass
class Piece:
    """A streamed slice of a reply's content and the tokens [start, end) that wrote it."""

    text: str
    start: int
    end: int


def text_pieces(decode: Callable[[list[int]], str], ids: list[int], content: str, shown: int = 0, start: int = 0,
                window: int = 0) -> list[Piece]:
    """`content` cut at the token boundaries of `ids`; the pieces join to exactly `content`. (`shown`, `start`,
    `window`: resume after pieces already cut — the characters they hold, the token after the last one, and that
    piece's first token.)

    Each step decodes a short window (from the start of the previous piece) rather than the whole prefix, as
    vLLM's incremental detokenizer does: linear in the reply, and a tokenizer that treats a sequence's first
    token apart (a dropped leading space) sees the window's first token mid-text. A window whose text ends in
    U+FFFD (a token cut inside a UTF-8 character) waits for the next token. Tokens after the end of `content`
    (the end-of-turn token, a stop string) belong to no piece; text the tokens never decoded to (not seen:
    the content is the decoded ids, cut) goes in a last piece with the remaining tokens.
    """
    pieces: list[Piece] = []
    for end in range(start + 1, len(ids) + 1):
        if shown >= len(content):
            break
        before, now = decode(ids[window:start]), decode(ids[window:end])
        if now.endswith("\ufffd") or len(now) <= len(before) or not now.startswith(before):
            continue
        new = now[len(before):]
        text = content[shown : shown + len(new)]
        if not new.startswith(text):
            continue
        pieces.append(Piece(text, start, end))
        shown, window, start = shown + len(text), start, end
    if shown < len(content):
        pieces.append(Piece(content[shown:], start, len(ids)))
    return pieces


class EarlyPieces:
    """The pieces of a growing reply that the finished reply will begin with, whatever comes next, each handed out
    once: `text_pieces` over its text so far, without a trailing end-of-turn id, without the longest tail that could
    start a stop string, and without the last piece (a token cut inside a character, or a window the next token
    re-decodes). A stop string already in the text: nothing more (the finished reply is cut there). Each update
    resumes the walk after the pieces already handed out (one decode of the text, then only the new tokens'
    windows), so a reply of n tokens costs O(n) window decodes, not O(n^2).

    >>> early = EarlyPieces(lambda ids: "".join("abcde"[i] for i in ids), [], ["dx"])
    >>> [p.text for p in early.update([0, 1])], [p.text for p in early.update([0, 1, 2, 3])]
    (['a'], ['b'])
    """

    def __init__(self, decode: Callable[[list[int]], str], stop_ids: list[int], stop: list[str]) -> None:
        self.decode, self.stop_ids, self.stop = decode, stop_ids, stop
        self.shown = self.start = self.window = 0
        self.stopped = False
        self.handed = 0
        """Pieces handed out so far."""

    def update(self, ids: list[int]) -> list[Piece]:
        """The new pieces of the reply whose tokens so far are `ids`."""
        if ids and ids[-1] in self.stop_ids:
            ids = ids[:-1]
        text = self.decode(ids)
        if self.stopped or any(s in text for s in self.stop):
            self.stopped = True
            return []
        held = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        pieces = text_pieces(self.decode, ids, text[: len(text) - held], self.shown, self.start, self.window)[:-1]
        for piece in pieces:
            self.shown, self.window, self.start = self.shown + len(piece.text), piece.start, piece.end
        self.handed += len(pieces)
        return pieces


def role_chunk(index: int) -> dict[str, Any]:
    """A choice's first chunk, sent before its reply is written."""
    return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}


def piece_chunk(index: int, piece: Piece, gen: Generation, logprobs: list[dict] | None, with_ids: bool) -> dict[str, Any]:
    """A content delta: the piece's text, and its tokens' log-probabilities (and ids, if asked)."""
    return _chunk(index, {"content": piece.text}, _tokens(gen, logprobs, with_ids, piece.start, piece.end))


def choice_chunks(choice: Choice, decode: Callable[[list[int]], str], logprobs: list[dict] | None,
                  with_ids: bool, sent: int = 0) -> Iterator[dict[str, Any]]:
    """A choice's chunks after its role chunk and the `sent` content pieces streamed before it ended: content (or
    tool-call) deltas, then the finish chunk.

    `logprobs`: one OpenAI logprob entry per generated token, or None when the request did not ask for them.
    A tool-call reply's tokens have no text of their own in the deltas: they ride on the finish chunk, like
    the tokens after the content (the end-of-turn token, a stop string's).
    """
    message, gen = choice.message, choice.gen
    taken = 0
    if message.get("reasoning"):  # a thinking model's: streamed at the end, before the reply (vLLM's delta field)
        yield _chunk(choice.index, {"reasoning": message["reasoning"]})
    if message.get("tool_calls"):
        if message.get("content"):
            yield _chunk(choice.index, {"content": message["content"]})
        for delta in _tool_call_deltas(message["tool_calls"]):
            yield _chunk(choice.index, delta)
    else:
        for k, piece in enumerate(text_pieces(decode, gen.ids, message["content"] or "")):
            if k >= sent:
                yield piece_chunk(choice.index, piece, gen, logprobs, with_ids)
            taken = piece.end
    yield _chunk(choice.index, {}, _tokens(gen, logprobs, with_ids, taken, len(gen.ids)), choice.finish)


def _tool_call_deltas(calls: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for k, call in enumerate(calls):
        fn = call["function"]
        yield {"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                               "function": {"name": fn["name"], "arguments": ""}}]}
        yield {"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]}


def _tokens(gen: Generation, logprobs: list[dict] | None, with_ids: bool, start: int, end: int) -> dict[str, Any]:
    """The fields a chunk gets for the tokens [start, end): their log-probabilities and, if asked, their ids."""
    out: dict[str, Any] = {"logprobs": {"content": logprobs[start:end]} if logprobs is not None and end > start else None}
    if with_ids:
        out["token_ids"] = gen.ids[start:end]
    return out


def _chunk(index: int, delta: dict[str, Any], tokens: dict[str, Any] | None = None,
           finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, **(tokens or {}), "finish_reason": finish}


def sse(data: dict[str, Any]) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
