#!/usr/bin/env bash
# Reproduce models/tiny-qwen2vl from scratch: build the tokenizer offline and train the tiny
# Qwen2-VL in the four stages the committed weights came from (shape on single images, then
# 1-8-image requests, then an annealed polish, then a fine-tune on styled drawings with the
# question before, between or after the images). Stages 1-3 take about 4,100 CPU-seconds with
# 2 threads; stage 4 about 800 with 1 thread: under 90 minutes on an idle 2-core machine.
# Seeds are fixed; the result is deterministic for a given thread count.
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
  --single-steps 0 --init-from "$work/tiny-stage2" --anneal-steps 600 --out "$work/tiny-stage3" --no-final-eval
# Stage 4: half the images in other styles (scripts/tiny_vlm_styles.py: outlines, sizes,
# positions, shades, noise, JPEG), half the questions before or between the images.
$PY scripts/train_tiny_vlm.py --steps 1300 --seed 1240 --batch 24 --lr 0.0007 --ramp 0 \
  --single-steps 0 --init-from "$work/tiny-stage3" --anneal-steps 1300 --style-frac 0.5 \
  --question-mix 0.5 --threads 1 --out "$OUT"
