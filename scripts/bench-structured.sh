#!/usr/bin/env bash
# What a JSON-schema constraint costs in decode throughput, measured by `inferno bench`:
# 1 and 8 streams, each generation test run unconstrained and then constrained to
# benches/schemas/catalog.json (alternating, in one process), printed as a Markdown table.
#
#   scripts/bench-structured.sh MODEL [THREADS] [N_GEN] [REPETITIONS]
#
# Defaults: 2 threads, 128 tokens, 5 repetitions. The model needs its tokenizer (a GGUF
# from `inferno synth` carries one). Needs a release build (target/release/inferno).
# Both runs decode greedily through the engine's per-sequence sampling and grammar mask
# worker; a stream whose JSON completes starts the schema over (counted as restarts).
set -euo pipefail

model=${1:?usage: $0 MODEL [THREADS] [N_GEN] [REPETITIONS]}
threads=${2:-2}
n_gen=${3:-128}
reps=${4:-5}
bin=${INFERNO:-target/release/inferno}
schema=${SCHEMA:-$(dirname "$0")/../benches/schemas/catalog.json}

json=$("$bin" bench -m "$model" -b pool -t "$threads" -p 0 -n "$n_gen" -s 1,8 \
    -r "$reps" --json-schema "$schema" -o json)

python3 - "$json" "$model" "$threads" "$reps" <<'PY'
import json, os, sys
rows = json.loads(sys.argv[1])
model, threads, reps = os.path.basename(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"`{model}`, pool backend, {threads} threads, mean ± sd of {reps} runs")
print()
print("| test | streams | unconstrained t/s | constrained t/s | ratio "
      "| mask p50 / p99 / max (ms) | sampling waited p50 / p99 / max (ms) | masks | restarts |")
print("| :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
# Each constrained row follows its unconstrained twin.
for free, held in zip(rows, rows[1:]):
    c = held.get("constraint")
    if c is None or free.get("constraint") is not None:
        continue
    m, w = c["mask"], c["mask_wait"]
    print(f"| {free['test']} | {free['streams']} "
          f"| {free['avg_ts']:.2f} ± {free['stddev_ts']:.2f} "
          f"| {held['avg_ts']:.2f} ± {held['stddev_ts']:.2f} | {c['ratio']:.3f} "
          f"| {m['p50_ms']:.3f} / {m['p99_ms']:.3f} / {m['max_ms']:.3f} "
          f"| {w['p50_ms']:.3f} / {w['p99_ms']:.3f} / {w['max_ms']:.3f} "
          f"| {m['n']} | {c['restarts']} |")
PY
