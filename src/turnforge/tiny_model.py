"""The tiny offline model: a random Qwen3 with a byte-level BPE tokenizer trained on the environment's text.

Nothing is downloaded. `build_tiny_model(out_dir, envs)`:
  1. runs each env's expert on a few hundred train tasks for every grammar and for the act_line and tool_call
     formats (or the format the env's options name), and renders each episode with the chat template (system
     prompts, tool schemas, observations, expert actions, the template's own text). `envs` are the envs a recipe
     plays, with the options that choose their text (`EnvSpec.corpus_options`: a tau2 domain's data folder, a
     DBBench file): a retail recipe's tokenizer is trained on retail text (4.3 characters a token on its first
     prompt, where the household tokenizer every recipe had before issue 40 gave 2.1);
  2. trains a byte-level BPE on it and on the envs' names (`EnvSpec.vocabulary`), with Qwen2/Qwen3's pre-tokenizer
     regex but a word and its number as one piece (`TINY_SPLIT`), no normalizer, so any text round-trips:
     `decode(encode(x)) == x`) and adds Qwen3's added tokens with Qwen3's flags (`<|im_start|>`, `<|im_end|>`,
     `<|endoftext|>`... special; `<tool_call>`, `<tool_response>`, `<think>`... plain added tokens);
  3. sets the chat template to Qwen3-4B-Instruct-2507's, read from the installed TRL package
     (`trl/chat_templates/qwen3_instruct_2507.jinja`), eos = `<|im_end|>`, pad = `<|endoftext|>`, so the
     tiny model and the real one render conversations, tools and tool calls identically;
  4. initialises a small `Qwen3ForCausalLM` (see `SIZES`) and saves both with `save_pretrained`, loadable by
     the same `load_model` that real models go through.

Departures from Qwen3's tokenizer: no NFC normalizer (so arbitrary text round-trips exactly), a word and the
number after it as one piece (`TINY_SPLIT`), and a vocab of at most 3k instead of 151k. A recipe's
`model = "tiny"` builds it once under the run's cache, for the recipe's envs (`resolve_model`).

`tiny:FAMILY` (`tiny:llama3`, `tiny:qwen3_thinking`, `tiny:lfm2`; `turnforge.formats.families`) is the same model with
another family's tokenizer side: that family's chat template (TRL's copy), added tokens, end-of-turn and pad, and a
corpus whose tool calls are written in the family's own format. The network stays a Qwen3 (random weights): what a
family changes for turnforge is its text, not its layers. `tiny` is `tiny:qwen3`, the quickstart's model.

This module sits above the rollout engine (it plays the env's expert for its corpus), hence its own module
beside `rollout.py` rather than in `turnforge.models`, which the policies (below the rollout engine) load with.

    python -c "from turnforge.tiny_model import build_tiny_model; print(build_tiny_model('runs/tiny'))"
    python -c "from turnforge.tiny_model import build_tiny_model; print(build_tiny_model('runs/tiny-sql', [('sql', {})]))"
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from turnforge.envs.base import get_env_spec, load_tasks, make_env, split_size
from turnforge.formats.chat_template import (
    OWN_TEMPLATES,
    template_messages,
    template_on_day,
    tool_arguments,
    trl_chat_template,
)
from turnforge.formats.families import Family, get_family, is_tiny, model_family
from turnforge.formats.harmony import render_conversation
from turnforge.policies.scripted import ExpertPolicy
from turnforge.rollout import run_episodes
from turnforge.types import Message, StopReason

TINY = "tiny"
"""The quickstart's model: `tiny:qwen3`, Qwen3-4B-Instruct-2507's template (`trl/chat_templates/qwen3_instruct_2507.jinja`)."""

# The tiny tokenizer's split: Qwen2 / Qwen3's (tokenizer.json of Qwen/Qwen3-4B-Instruct-2507), except that a word
# and the number after it ("cabinet 12", "apple 2") are one piece, and so one token once BPE has merged it: the
# model copies an entity's name from an observation as one token. With the name and its digits apart, a "take
# apple 1" for the "apple 2" just seen was the tiny model's most frequent failure in some trainings
# (docs/quickstart.md, "Eighth session"). Qwen's reads `\p{L}+|\p{N}|` where this reads `\p{L}+(?: \p{N}+)?| ?\p{N}+|`.
TINY_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+(?: \p{N}+)?| ?\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class TinySize:
    """The shape of one tiny model (embeddings tied to the output head, as in Qwen3-4B)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


SIZES: dict[str, TinySize] = {
    "tiny": TinySize(256, 512, 4, 4, 2, 64),  # 2.8 M parameters with the household vocab (1,678): the default
    "small": TinySize(384, 896, 6, 6, 2, 64),  # 9.2 M parameters with the household vocab
}
VOCAB_SIZE = 3072
"""Vocab cap (BPE merges + byte alphabet + Qwen3's 26 added tokens). BPE stops once every word of the corpus is
one token, so the household corpus and its 673 names give 1,678: its language is small."""
MAX_POSITIONS = 16384
"""RoPE context of the tiny model (no weights depend on it): room for a whole tau2 retail episode, whose first prompt
(policy + 16 tool schemas, 20,205 characters) is 4,681 tokens with the retail tokenizer and whose expert episodes
take up to 10,060 (benchmarks/tiny_tokenizer.py); 4,096 until issue 40, which no retail prompt fit."""
CORPUS_TASKS = 300
"""Expert episodes per (grammar, format) variant in the tokenizer corpus."""
CORPUS_FORMATS = ("act_line", "tool_call")
CORPUS_DATE = "26 Jul 2024"
"""The day Llama 3's template writes as today's in a tokenizer corpus (its own fallback), and the day a template that
reads the clock writes (SmolLM3's, gpt-oss's: `template_on_day`), so that a tiny model built on any day is the same
model; templates without a date ignore it."""


TinyEnvs = Sequence[tuple[str, dict[str, Any]]]
"""(env name, options) of every env a tiny tokenizer serves: a recipe's [env] and its stages' own envs."""
HOUSEHOLD: TinyEnvs = (("household", {}),)


def build_tiny_model(out_dir: str | Path, envs: TinyEnvs = HOUSEHOLD, size: str = "tiny", seed: int = 0,
                     family: str = "qwen3") -> Path:
    """Build the tokenizer (on the text of `envs`, in `family`'s template and formats) and a random Qwen3 of `size`
    ("tiny" | "small") into `out_dir`.

    The files are written to a temporary folder next to `out_dir` and moved in place at the end, so a killed
    build never leaves a half-written model behind.
    """
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of: {', '.join(SIZES)}")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    chosen = get_family(family)
    sources = corpus_envs(envs)
    tokenizer = train_tokenizer((text for env, options in sources for text in env_corpus(env, options, chosen)), chosen)
    model = tiny_model(tokenizer, size, seed, chosen)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "turnforge_tiny.json").write_text(
            json.dumps({"envs": [{"env": env, "options": options} for env, options in sources], "size": size,
                        "seed": seed, "family": family, "chat_template": chosen.template if chosen.template.startswith(OWN_TEMPLATES) else f"trl/chat_templates/{chosen.template}",
                        "parameters": model.num_parameters()}, indent=2) + "\n"
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def resolve_model(spec: str, cache_dir: Path, envs: TinyEnvs = HOUSEHOLD, family: str | None = None) -> str:
    """"tiny" -> `cache_dir/tiny` ("tiny:FAMILY" -> `cache_dir/tiny-FAMILY`), built there first (for `envs`) when
    absent; any other spec (path or Hub id) unchanged. A tiny model already there is kept: the stages of its run were
    trained with its tokenizer.

    `family` (a recipe's `[model] family`): "tiny" is that family's tiny model; a model whose template reads as
    another family, or has none, resolves to `cache_dir/NAME-as-FAMILY`, links to its files with a template naming the
    family (`models.loading.family_folder`)."""
    if family is not None and not is_tiny(spec):
        from turnforge.models.loading import family_folder

        return family_folder(spec, get_family(family), cache_dir)
    if not is_tiny(spec):
        return spec
    if family is not None and model_family(spec).name != family:
        if spec != TINY:
            raise ValueError(f"[model] name {spec!r} is a tiny {model_family(spec).name} model, not of family {family!r}: "
                             f'name "{TINY}:{family}", or leave family out')
        spec = f"{TINY}:{family}"
    family = model_family(spec).name
    path = Path(cache_dir) / (TINY if spec == TINY else f"{TINY}-{family}")
    if not (path / "config.json").is_file():
        build_tiny_model(path, envs=envs, family=family)
    return str(path)


def corpus_envs(envs: TinyEnvs) -> list[tuple[str, dict[str, Any]]]:
    """Each env with only the options that choose its text (`EnvSpec.corpus_options`, validated), in order, once.

    The other options keep their defaults, under which the corpus covers every grammar and format: one tokenizer
    serves every setting of them. Household has none, so every household recipe gets the tokenizer the quickstart's
    figures were measured with."""
    out: list[tuple[str, dict[str, Any]]] = []
    for env, options in envs:
        spec = get_env_spec(env)
        chosen = spec.coerce_options({k: v for k, v in options.items() if k in spec.corpus_options})
        if (env, chosen) not in out:
            out.append((env, chosen))
    if not out:
        raise ValueError("a tiny model needs at least one env to train its tokenizer on")
    return out


def env_corpus(env: str, env_options: dict[str, Any], family: Family | None = None) -> Iterator[str]:
    """Rendered expert episodes (`family`'s chat template text; Qwen3's by default) for every grammar and format the
    env offers (tool calls in the family's format), then the env's names (`EnvSpec.vocabulary`)."""
    from transformers.utils.chat_template_utils import render_jinja_template  # ~0.5 s: as the builders below

    family = family or get_family("qwen3")
    spec = get_env_spec(env)
    template = template_on_day(trl_chat_template(family.template), CORPUS_DATE)

    def head(messages: list[dict[str, Any]], tools: list[dict] | None, add_generation_prompt: bool = True) -> str:
        text, _ = render_jinja_template(conversations=[messages], **tool_arguments(family, tools), chat_template=template,
                                        add_generation_prompt=add_generation_prompt, bos_token=family.bos or "",
                                        date_string=CORPUS_DATE)
        return text[0]

    def render(messages: list[Message], tools: list[dict] | None) -> str:
        if family.channels:  # gpt-oss's template renders no raw reply: harmony's renderer, as the rollouts
            return render_conversation(messages, tools, True, partial(head, add_generation_prompt=False))
        return head(template_messages(messages, family), tools)  # Gemma 4: calls as tool_calls, as the renderer

    split = "train" if "train" in spec.splits else spec.splits[0]
    # a smaller split: all of it
    tasks = load_tasks(env, split, limit=min(CORPUS_TASKS, split_size(env, split, **env_options)), **env_options)
    for variant in _variants(spec, env_options, family):
        trajs = run_episodes(ExpertPolicy(), lambda variant=variant: make_env(env, **variant), tasks, 1)
        for traj in trajs:
            if traj.stop_reason is StopReason.env_error:  # the corpus would silently miss this variant's text
                raise RuntimeError(f"the {env} expert failed on {traj.task_id} ({variant}): {traj.score.details['error']}")
            yield render(traj.messages, traj.tools)
    if spec.vocabulary is not None:  # names no sampled episode showed still become whole tokens
        yield "".join(f" {name}" for name in spec.words(env_options))


def _variants(spec: Any, env_options: dict[str, Any], family: Family) -> list[dict[str, Any]]:
    """One env option set per (grammar, format) the env accepts, tool calls in `family`'s format (none where its
    template renders no tools); the caller's options win, a tool format among them written in the family's."""
    options = {o.name: o for o in spec.options}
    grammars = list(options["grammar"].choices or ()) if "grammar" in options else [None]
    formats = [f for f in CORPUS_FORMATS if "format" in options and f in (options["format"].choices or ())] or [None]
    formats = [family.tool_format if f == "tool_call" else f for f in formats if f != "tool_call" or family.tool_format]
    if env_options.get("format") == "tool_call" and family.tool_format:
        env_options = {**env_options, "format": family.tool_format}
    variants = []
    for grammar in grammars:
        for fmt in formats:
            variant = {k: v for k, v in (("grammar", grammar), ("format", fmt)) if v is not None}
            variant |= env_options
            if variant not in variants:
                variants.append(variant)
    return variants


def train_tokenizer(texts: Iterator[str], family: Family | None = None, vocab_size: int = VOCAB_SIZE) -> Any:
    """A byte-level BPE on `texts` with `family`'s added tokens and chat template (Qwen3's by default), as a
    transformers tokenizer."""
    import re

    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    family = family or get_family("qwen3")
    added = [token for token, _ in family.tokens]
    splitter = re.compile("|".join(re.escape(t) for t in added))
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TINY_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(added),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: any text encodes
        show_progress=False,
    )
    # The added tokens are cut out of the corpus: they are single ids, never BPE pieces.
    bpe.train_from_iterator((piece for text in texts for piece in splitter.split(text) if piece), trainer)
    bpe.add_tokens([AddedToken(t, special=special, normalized=False, rstrip=t in family.rstrip_tokens)
                    for t, special in family.tokens])
    named = {"eos_token": family.eos, "pad_token": family.pad} | ({"bos_token": family.bos} if family.bos else {})
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        **named,
        extra_special_tokens=[t for t, special in family.tokens if special and t not in named.values()],
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
        chat_template=trl_chat_template(family.template),
    )


def tiny_config(size: str, vocab_size: int, eos_token_id: int | None = None, pad_token_id: int | None = None) -> Any:
    """The `Qwen3Config` of a tiny model (tied embeddings like Qwen3-4B)."""
    from transformers import Qwen3Config

    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of: {', '.join(SIZES)}")
    shape = SIZES[size]
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        dtype="float32",
    )


def tiny_model(tokenizer: Any, size: str, seed: int, family: Family | None = None) -> Any:
    """A randomly initialised `Qwen3ForCausalLM` sized for `tokenizer`, stopping at the family's end-of-turn or pad
    (Qwen3's: `<|im_end|>` or `<|endoftext|>`) or any token that ends its replies (`Family.turn_ends`)."""
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    family = family or get_family("qwen3")
    end, pad = tokenizer.convert_tokens_to_ids([family.eos, family.pad])
    config = tiny_config(size, len(tokenizer), eos_token_id=end, pad_token_id=pad)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    # As Qwen3-4B-Instruct-2507's generation_config.json: both end tokens stop generation.
    # GLM-4.5's stops on every token that can end a reply (<|user|>, <|observation|>) besides its eos (= its pad);
    # gpt-oss's on <|call|> besides <|return|>.
    stops = list(dict.fromkeys([end, pad, *tokenizer.convert_tokens_to_ids(list(family.turn_ends))]))
    model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=pad, bos_token_id=None)
    return model
