#!/usr/bin/env bash
# The wheels `benchmarks/gpu_check.py` needs on the lent GPU machine beyond its image, into .whl/ (ignored).
#
# That machine has no network; what it lacks travels with the working tree (64 MiB in all, this repo ~2 MiB).
# Its image ('cuda', Python 3.12) has torch 2.11, transformers 5.17, accelerate 1.15, peft, numpy, pandas,
# pyarrow, xxhash, fsspec, tokenizers, huggingface-hub 1.33, safetensors, typer, rich, jinja2, matplotlib
# (/work/.library/device/KINDS.md). Carried, pinned to what this repo's .venv runs (`pip freeze`):
#   - trl, datasets (+ dill, multiprocess) and pydantic (+ pydantic-core, annotated-types, typing-inspection,
#     typing-extensions >= 4.16 that pydantic 2.14 requires): not in the image;
#   - transformers 5.24 and peft 0.21.2: the versions every CPU test ran; the image's transformers 5.17 takes
#     other branches in TRL (trl.trainer.base_trainer checks < 5.19), so the GPU run would test other code;
#     regex: transformers checks regex >= 2025.10.22 at import, which the image's may not meet;
#   - liger-kernel 0.8.5 (0.9 MiB): the SFT rows with TRL's `use_liger_kernel` (Triton comes with the image's torch).
# Not carried: pyarrow (~40 MiB; datasets 5.2 asks >= 24, the image's is read by the run's first line) and torch
# (GBs: the image's CUDA build). The project itself travels as source (PYTHONPATH=src).
#
#     bash benchmarks/gpu_wheels.sh          # then see BENCHMARKS.md, "GPU check"
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl
WHEELS=(
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  transformers==5.24.0 peft==0.21.2 regex==2026.11.19
  liger-kernel==0.8.5
)
LIMIT_MIB=48  # of the 64 MiB that travel: the repo's own files and the run's room to spare take the rest
rm -rf "$DEST" && mkdir -p "$DEST"
# The GPU machine's Python is CPython 3.12 on x86-64 (glibc): wheels for it, whatever this machine runs.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "${WHEELS[@]}" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
count=$(ls "$DEST"/*.whl | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
  echo "gpu_wheels: got $count wheels for ${#WHEELS[@]} pins in $DEST; see pip's message above" >&2
  exit 1
fi
ls -l "$DEST"
bytes=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "gpu_wheels: $count wheels, $((bytes / 1024)) KiB in $DEST (limit ${LIMIT_MIB} MiB)"
if [ "$bytes" -gt $((LIMIT_MIB * 1024 * 1024)) ]; then
  echo "gpu_wheels: over ${LIMIT_MIB} MiB: they would not travel with the working tree" >&2
  exit 1
fi
