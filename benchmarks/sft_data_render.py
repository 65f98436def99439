"""Building SFT data from rendered episodes: each conversation's chat-template renders through a memo of its last
renders (`ChatTemplateRenderer(memo=True)`, as `data.sft.conversation_examples` does) vs every render computed.

Scripted experts record messages, not ids, so SFT renders every episode turn by turn with the chat template (a
turn's completion and its observation are the differences between renders of the conversation's prefixes). The
two ways build the dataset of the given trajectories file with the given tokenizer, in turn, `--repeats` times,
in one process, and the datasets are compared.

    .venv/bin/python benchmarks/sft_data_render.py --data RUN/stages/01-collect/trajectories.jsonl --model RUN/models/tiny
"""

from __future__ import annotations

import argparse
import time

from transformers import AutoTokenizer

import turnforge.data.sft as sft_data
from turnforge.formats.chat_template import ChatTemplateRenderer
from turnforge.train.settings import SFTSettings
from turnforge.train.sft import build_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True)
    parser.add_argument("--model", required=True, help="a folder with the tokenizer")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    settings = SFTSettings(max_length=1024)
    ways = {"every render computed": False, "a memo of the conversation's last renders (turnforge)": True}
    seconds = dict.fromkeys(ways, 0.0)
    built = {}
    for _ in range(args.repeats):
        for way, memo in ways.items():
            sft_data.ChatTemplateRenderer = lambda tok, window=None, memo=True, _on=memo: ChatTemplateRenderer(
                tok, window, memo=_on)
            start = time.perf_counter()
            dataset, _ = build_dataset([args.data], tokenizer, settings)
            seconds[way] += time.perf_counter() - start
            built[way] = dataset.to_list()
    sft_data.ChatTemplateRenderer = ChatTemplateRenderer
    first, second = built.values()
    print(f"{len(first)} examples; the same both ways: {first == second}\n")
    print("| way | seconds to build the dataset |")
    print("|---|---:|")
    for way, s in seconds.items():
        print(f"| {way} | {s / args.repeats:.2f} |")


if __name__ == "__main__":
    main()
