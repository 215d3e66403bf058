#!/usr/bin/env bash
# Side-by-side speed of `inferno bench` and llama.cpp's `llama-bench` on one GGUF file.
#
# Runs each test alternately with both engines, ROUNDS times (the engine that goes first
# alternates too), so both see the same machine conditions; then prints, per test, the
# median tokens/s of every timed sample of each engine and their ratio, as a Markdown table.
#
#   LLAMA_BENCH=/path/to/llama-bench scripts/bench-vs-llama.sh MODEL [ROUNDS] [BACKEND]
#
# TESTS (env) lists the tests as `threads:n_prompt:n_gen:depth` separated by spaces;
# the default covers the targets in BENCHMARKS.md. Raw JSON goes to $RESULTS_DIR
# (default: a temporary directory, printed at the end).
set -euo pipefail

model=${1:?usage: LLAMA_BENCH=... $0 MODEL [ROUNDS] [BACKEND]}
rounds=${2:-3}
backend=${3:-pool}
llama_bench=${LLAMA_BENCH:?set LLAMA_BENCH to a llama-bench binary}
inferno=${INFERNO:-target/release/inferno}
reps=${REPS:-2}
tests=${TESTS:-"1:128:0:0 1:512:0:0 1:0:64:0 2:128:0:0 2:512:0:0 2:0:64:0 2:0:64:512 1:0:64:512"}
out=${RESULTS_DIR:-$(mktemp -d)}
mkdir -p "$out"

run_ours() { # threads p n d file
    "$inferno" bench -m "$model" -b "$backend" -t "$1" -p "$2" -n "$3" -d "$4" -r "$reps" \
        -o json >"$5" 2>/dev/null
}
run_llama() {
    "$llama_bench" -m "$model" -t "$1" -p "$2" -n "$3" -d "$4" -r "$reps" -o json \
        >"$5" 2>/dev/null
}

for round in $(seq 1 "$rounds"); do
    for t in $tests; do
        IFS=: read -r th p n d <<<"$t"
        tag="t${th}-p${p}-n${n}-d${d}-r${round}"
        if ((round % 2)); then
            run_ours "$th" "$p" "$n" "$d" "$out/ours-$tag.json"
            run_llama "$th" "$p" "$n" "$d" "$out/llama-$tag.json"
        else
            run_llama "$th" "$p" "$n" "$d" "$out/llama-$tag.json"
            run_ours "$th" "$p" "$n" "$d" "$out/ours-$tag.json"
        fi
        echo "round $round: $t done" >&2
    done
done

python3 - "$out" "$tests" "$backend" <<'EOF'
import glob, json, os, statistics, sys
out, tests, backend = sys.argv[1], sys.argv[2].split(), sys.argv[3]
print(f"| threads | test | inferno `{backend}` t/s | llama.cpp t/s | ratio | samples |")
print("|---:|---|---:|---:|---:|---:|")
for t in tests:
    th, p, n, d = t.split(":")
    tag = f"t{th}-p{p}-n{n}-d{d}"
    med = {}
    count = 0
    for who in ("ours", "llama"):
        samples = []
        for f in sorted(glob.glob(os.path.join(out, f"{who}-{tag}-r*.json"))):
            for row in json.load(open(f)):
                samples += row["samples_ts"]
        med[who] = statistics.median(samples) if samples else float("nan")
        count = len(samples)
    name = f"pp{p}" if p != "0" else f"tg{n}"
    if d != "0":
        name += f" @ d{d}"
    print(f"| {th} | {name} | {med['ours']:.2f} | {med['llama']:.2f} | "
          f"{med['ours'] / med['llama']:.2f}× | {count} + {count} |")
print(f"\nraw JSON: {out}", file=sys.stderr)
EOF
