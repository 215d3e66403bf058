#!/usr/bin/env bash
# Batched decode against one stream: `inferno bench -p 0 -n N -s 1,8` on each GGUF file, with
# one or more inferno binaries run alternately (the binary that goes first rotates each
# round), then, per file and binary, the median tokens/s of every timed sample at 1 and at 8
# streams (8 streams: aggregate tokens/s) and their ratio, as a Markdown table.
#
#   scripts/bench-streams.sh FILE... [-- BIN...]
#
# BINS default to target/release/inferno; ROUNDS (default 2), REPS (timed repetitions per
# run, default 3), THREADS (default 2), N_GEN (default 64) and STREAMS (default 8) are read
# from the environment. Raw JSON goes to $RESULTS_DIR (default: a temporary directory, printed
# at the end).
set -euo pipefail

files=()
while (($#)) && [ "$1" != "--" ]; do
    files+=("$1")
    shift
done
(($#)) && shift
bins=("$@")
((${#bins[@]})) || bins=(target/release/inferno)
((${#files[@]})) || {
    echo "usage: $0 FILE... [-- BIN...]" >&2
    exit 2
}
rounds=${ROUNDS:-2}
reps=${REPS:-3}
threads=${THREADS:-2}
n_gen=${N_GEN:-64}
streams=${STREAMS:-8}
out=${RESULTS_DIR:-$(mktemp -d)}
mkdir -p "$out"

for round in $(seq 1 "$rounds"); do
    for fi in "${!files[@]}"; do
        nb=${#bins[@]}
        for k in $(seq 0 $((nb - 1))); do
            bi=$(((k + round + fi) % nb))
            "${bins[$bi]}" bench -m "${files[$fi]}" -t "$threads" -p 0 -n "$n_gen" \
                -s "1,$streams" -r "$reps" -o json >"$out/f$fi-b$bi-r$round.json" 2>/dev/null
        done
        echo "round $round: ${files[$fi]} done" >&2
    done
done

python3 - "$out" "$streams" "${#files[@]}" "${#bins[@]}" "${files[@]}" "${bins[@]}" <<'EOF'
import glob, json, os, statistics, sys
out, streams, nf, nb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
files, bins = sys.argv[5:5 + nf], sys.argv[5 + nf:5 + nf + nb]
print(f"| file | binary | 1 stream t/s | {streams} streams t/s (aggregate) | ratio | samples |")
print("|---|---|---:|---:|---:|---:|")
for fi, f in enumerate(files):
    for bi, b in enumerate(bins):
        s = {1: [], streams: []}
        for path in sorted(glob.glob(os.path.join(out, f"f{fi}-b{bi}-r*.json"))):
            for row in json.load(open(path)):
                if row["streams"] in s:
                    s[row["streams"]] += row["samples_ts"]
        one = statistics.median(s[1]) if s[1] else float("nan")
        many = statistics.median(s[streams]) if s[streams] else float("nan")
        print(f"| {os.path.basename(f)} | {b} | {one:.2f} | {many:.2f} | {many / one:.2f}× "
              f"| {len(s[1])} + {len(s[streams])} |")
print(f"\nraw JSON: {out}", file=sys.stderr)
EOF
