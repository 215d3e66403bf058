#!/usr/bin/env bash
# The gpu backend beside the CPU pool on one host, for BENCHMARKS.md: decode (tg) and prompt
# (pp) speed of the Qwen3-0.6B-shaped Q8_0 model, with the gpu's step-time breakdown (host
# encoding, GPU execution from timestamps, submit/read-back/sync), and the pool at each thread
# count in THREADS (its best is the one to compare with). Builds the release binary and the
# model if they are missing. Prints the bench tables and the breakdown lines.
#
#   scripts/bench-gpu.sh [MODEL] [REPS]
#
# TESTS_GPU / TESTS_CPU (env): `-p` and `-n` lists for each side (default: pp512 and tg128).
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:-models/synth-0.6b-q8_0.gguf}
reps=${2:-5}
threads=${THREADS:-"1,2,4,8,16"}
inferno=${INFERNO:-target/release/inferno}
p=${P:-512}
n=${N:-128}

[ -x "$inferno" ] || cargo build --release
if [ ! -f "$model" ]; then
    "$inferno" synth --preset 0.6b --dtype q8_0 --out "$model"
fi

echo "## gpu"
"$inferno" bench -m "$model" -b gpu -p "$p" -n "$n" -r "$reps"
echo
echo "## pool, threads $threads"
"$inferno" bench -m "$model" -b pool -t "$threads" -p "$p" -n "$n" -r "$reps"
