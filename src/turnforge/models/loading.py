"""Load any Hugging Face causal LM with its tokenizer (and LoRA through PEFT); save it merged.

    model, tokenizer = load_model("Qwen/Qwen3-4B-Instruct-2507", lora=LoraSpec(r=16))
    model, tokenizer = load_model(resolve_model("tiny", Path("runs/cache")))   # turnforge.tiny_model

The tokenizer comes back ready for batched generation: a pad token (the eos when the model has none) and
`padding_side="left"`. A folder holding a PEFT adapter (`adapter_config.json`) may be given as the model
itself: its base model is loaded and the adapter put on top.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import peft
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from turnforge.formats.families import Family

DTYPES = ("auto", "float32", "bfloat16", "float16")
ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class LoraSpec:
    """A LoRA adapter (PEFT `LoraConfig`) with the knobs recipes set."""

    r: int = 16
    """Rank of the update matrices."""
    alpha: int = 32
    """Scale: the update is multiplied by alpha / r."""
    dropout: float = 0.05
    """Dropout on the adapter's input."""
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt (e.g. ["q_proj", "k_proj", "v_proj", "o_proj"]), or "all-linear" (every linear layer
    but the output head, PEFT's shorthand)."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"lora r must be at least 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"lora alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError('lora target_modules is empty; give module names or "all-linear"')

    def to_peft(self) -> peft.LoraConfig:
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            task_type="CAUSAL_LM",
        )


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when a GPU is visible, else "cpu"; anything else as given."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """"auto" -> bfloat16 on a GPU that has it (float16 on one that has not), float32 on CPU."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_model(
    path_or_id: str | Path,
    dtype: str = "auto",
    device: str = "auto",
    lora: LoraSpec | None = None,
    adapter: str | Path | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) of a local folder or a Hub id, on `device`, in `dtype`.

    `adapter` (a PEFT adapter folder) is loaded on top for inference. `lora` adds a new trainable adapter; with
    both, the existing adapter is merged into the weights first and the new one trains on top (the DPO-after-SFT
    setup). A folder that holds an adapter may be passed as `path_or_id`: its base model comes from its config.
    """
    base, adapter = _base_and_adapter(str(path_or_id), str(adapter) if adapter is not None else None)
    for folder in (base, adapter):
        if folder is not None:
            check_model_folder(folder)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # after the check: a typo is refused at once

    from turnforge.machine import watch_cpu_threads

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    tokenizer_from = adapter if adapter is not None and _has_tokenizer(Path(adapter)) else base
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype)
    except OSError as e:  # transformers' "not found" (locally and on the Hub, or no network)
        raise FileNotFoundError(f"cannot load model {base!r}: {e}\n{_WHAT_TO_GIVE}") from e
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device)
    if device == "cpu":  # its threads: the cores other processes leave free, re-measured (machine.CpuThreads)
        watch_cpu_threads(model)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
        if lora is not None:
            model = model.merge_and_unload()
    if lora is not None:
        from peft import get_peft_model

        model = get_peft_model(model, lora.to_peft())
    model.eval()  # as from_pretrained leaves it (get_peft_model switches to train mode); trainers call .train()
    return model, tokenizer


def _base_and_adapter(path_or_id: str, adapter: str | None) -> tuple[str, str | None]:
    """(base model, adapter): an adapter folder given as the model stands for its base + itself."""
    config = Path(path_or_id) / ADAPTER_CONFIG
    if not config.is_file():
        return path_or_id, adapter
    if adapter is not None:
        raise ValueError(f"{path_or_id} is itself a PEFT adapter; give it as the model or as adapter=, not with another adapter")
    base = json.loads(config.read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{config} names no base_model_name_or_path; load the base model and pass adapter={path_or_id!r}")
    return base, path_or_id


_WHAT_TO_GIVE = (
    'give a local folder with config.json (e.g. a run\'s model/ folder), a Hugging Face model id, or "tiny" '
    "(the offline tiny model: a recipe and `turnforge eval` build it into OUT/models/tiny, `turnforge serve` at start)"
)


def check_model_folder(spec: str) -> None:
    """Refuse (FileNotFoundError) a model that is clearly a local path and is not there, before the Hub is asked
    about it (transformers retried a missing `runs/nothere` on the Hub for ~50 s)."""
    if looks_local(spec) and not Path(spec).expanduser().is_dir():
        raise FileNotFoundError(f"model folder {spec} does not exist; {_WHAT_TO_GIVE}")


def looks_local(spec: str) -> bool:
    """A filesystem path rather than a Hub id ("name" or "org/name"): it starts with `/`, `.` or `~`, has more than
    two parts, exists, or its first part is a folder here (`runs/nothere` beside a `runs/` folder). Only the rest
    could be a Hub id."""
    if spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or Path(spec).exists():
        return True
    first, slash, _ = spec.partition("/")
    return bool(slash) and Path(first).is_dir()


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file()


def family_folder(spec: str, family: Family, out_dir: str | Path) -> str:
    """`spec` (a local folder or Hub id) read as `family`: `spec` itself where its chat template already reads as it,
    else `out_dir/NAME-as-FAMILY`, rebuilt: links to each of its files, and its tokenizer saved with its template (the
    family's, where it has none) naming the family (`families.named_template`), so that every process and engine
    loading it, and every model trained from it, reads the family. `turnforge_family.json` there says what it was."""
    from transformers import AutoTokenizer

    from turnforge.formats.chat_template import trl_chat_template
    from turnforge.formats.families import detect_family, named_template

    check_model_folder(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec)
        read_as = detect_family(tokenizer.chat_template)
        if read_as is not None and read_as.name == family.name:
            return spec
        if looks_local(spec):
            source = Path(spec).expanduser()
        else:
            from huggingface_hub import snapshot_download

            source = Path(snapshot_download(spec))
    except OSError as e:
        raise FileNotFoundError(f"cannot load model {spec!r}: {e}\n{_WHAT_TO_GIVE}") from e
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    folder = out_dir / f"{source.resolve().name}-as-{family.name}"
    own = tokenizer.chat_template
    tokenizer.chat_template = named_template(own or trl_chat_template(family.template), family)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=out_dir))
    try:
        tokenizer.save_pretrained(staging)  # first: no tokenizer file may be written through a link into `source`
        for item in source.iterdir():
            if not (staging / item.name).exists() and not item.name.startswith("."):
                (staging / item.name).symlink_to(item.resolve())
        (staging / FAMILY_FILE).write_text(json.dumps({
            "model": spec, "family": family.name, "template_read_as": read_as and read_as.name,
            "template": "its own" if own else f"the family's ({family.template})"}, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(folder)


FAMILY_FILE = "turnforge_family.json"


def merge_and_save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Save `model` (its PEFT adapter merged into the weights, when it has one) and `tokenizer` to `out_dir`."""
    from peft import PeftModel

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(model, PeftModel):
        model = model.merge_and_unload()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
