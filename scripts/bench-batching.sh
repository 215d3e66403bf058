#!/usr/bin/env bash
# Continuous batching through the gRPC service, measured by `inferno loadtest`:
#   1. aggregate decode tokens/s of 1 stream and of 8 concurrent streams;
#   2. inter-token latency of 4 running streams while a 512-token prompt is admitted, for
#      several --prefill-chunk-running sizes (the prompt chunk per step while others run);
#   3. time to first token of a ~1000-token prompt, cold and then repeated (prefix cache).
#
#   scripts/bench-batching.sh MODEL [THREADS]
#
# Starts its own servers on 127.0.0.1:50170..; prints one JSON line per measurement and a
# summary. Needs a release build (target/release/inferno).
set -euo pipefail

model=${1:?usage: $0 MODEL [THREADS]}
threads=${2:-2}
bin=${INFERNO:-target/release/inferno}
port=50170
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

start_server() { # extra serve args...
    port=$((port + 1))
    "$bin" serve -m "$model" --threads "$threads" --listen "127.0.0.1:$port" "$@" \
        >/dev/null 2>&1 &
    pids+=($!)
    # Ready when the health check says so (the model loads first).
    for _ in $(seq 1 120); do
        if "$bin" loadtest --addr "http://127.0.0.1:$port" -c 1 -n 1 --max-tokens 1 \
            --output json 2>/dev/null | grep -q '"OK":1'; then
            return
        fi
        sleep 0.5
    done
    echo "server on port $port did not come up" >&2
    exit 1
}
stop_server() { kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; }
load() { "$bin" loadtest --addr "http://127.0.0.1:$port" --output json "$@"; }

words() { # N: about N tokens of text for a byte-level vocabulary
    python3 -c "import sys; n=int(sys.argv[1]); s=' '.join('w%03d' % (i % 997) for i in range(n)); print(s[:n])" "$1"
}

# 1. One stream against eight.
start_server --max-batch 8
one=$(load -c 1 -n 3 --max-tokens 64 --ignore-eos)
eight=$(load -c 8 -n 16 --max-tokens 64 --ignore-eos)
stop_server
echo "{\"test\":\"streams_1\",\"report\":$one}"
echo "{\"test\":\"streams_8\",\"report\":$eight}"

# 2. Running streams while a long prompt is admitted.
long=$(words 512)
for chunk in 256 32 8; do
    start_server --max-batch 8 --prefill-chunk-running "$chunk"
    load -c 4 -n 4 --max-tokens 120 --ignore-eos >/tmp/inferno-bench-running.json &
    running=$!
    sleep 3
    admitted=$(load -c 1 -n 1 --max-tokens 1 --prompt "$long")
    wait "$running"
    echo "{\"test\":\"admit_512_chunk_$chunk\",\"running\":$(cat /tmp/inferno-bench-running.json),\"admitted\":$admitted}"
    stop_server
done

# 3. A repeated long prompt: cold, then from the prefix cache.
prompt=$(words 1000)
start_server --max-batch 8
cold=$(load -c 1 -n 1 --max-tokens 1 --prompt "$prompt")
warm=$(load -c 1 -n 1 --max-tokens 1 --prompt "$prompt")
stop_server
echo "{\"test\":\"prefix_cold\",\"report\":$cold}"
echo "{\"test\":\"prefix_warm\",\"report\":$warm}"

python3 - "$one" "$eight" "$cold" "$warm" <<'EOF'
import json, sys
one, eight, cold, warm = (json.loads(a) for a in sys.argv[1:5])
r = eight["aggregate_tokens_per_second"] / one["aggregate_tokens_per_second"]
print(f"aggregate decode: 1 stream {one['aggregate_tokens_per_second']:.1f} tok/s, "
      f"8 streams {eight['aggregate_tokens_per_second']:.1f} tok/s ({r:.2f}x)", file=sys.stderr)
c, w = cold["ttft_ms"]["p50"], warm["ttft_ms"]["p50"]
print(f"TTFT of a ~1000-token prompt: cold {c:.1f} ms, repeated {w:.1f} ms ({c / w:.1f}x); "
      f"reused {warm['cached_prompt_tokens']} prompt tokens", file=sys.stderr)
EOF
