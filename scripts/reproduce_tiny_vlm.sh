#!/usr/bin/env bash
# Reproduce models/tiny-qwen2vl from scratch: build the tokenizer offline and train the tiny
# Qwen2-VL in the three stages the committed weights came from (shape on single images, then
# 1-8-image requests, then an annealed polish). About 4,100 CPU-seconds in all with 2 threads,
# i.e. under an hour on an idle 2-core machine. Seeds are fixed; the result is deterministic.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${1:-models/tiny-qwen2vl}
# The stage folders are recorded in training_report.json; keep these names to get the same report.
work=/tmp
$PY scripts/train_tiny_vlm.py --steps 3200 --out "$work/tiny-stage1" --no-final-eval
$PY scripts/train_tiny_vlm.py --steps 3009 --seed 1235 --batch 24 --lr 0.001 --ramp 0 \
  --single-steps 0 --init-from "$work/tiny-stage1" --anneal-steps 2500 --out "$work/tiny-stage2" --no-final-eval
$PY scripts/train_tiny_vlm.py --steps 671 --seed 1236 --batch 24 --lr 0.0002 --ramp 0 \
  --single-steps 0 --init-from "$work/tiny-stage2" --anneal-steps 600 --out "$OUT"
