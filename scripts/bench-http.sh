#!/usr/bin/env bash
# The OpenAI-compatible HTTP API under load: `inferno serve` against llama.cpp's
# `llama-server` on the same GGUF file, driven by the same external load generator
# (guidellm, from PyPI) at each concurrency; then the HTTP API's overhead per token beside
# gRPC's (`inferno loadtest --baseline`, which interleaves each request with the same one run
# in-process). Prints one Markdown table of each; the raw JSON stays in $RESULTS_DIR.
#
#   LLAMA_SERVER=/path/to/llama-server scripts/bench-http.sh [MODEL]
#
# MODEL defaults to the real test checkpoint (scripts/fetch-test-model.sh). Both servers get
# THREADS threads (default 2) and MAX_BATCH concurrent sequences (default 8: inferno's
# --max-batch, llama-server's -np) with a CTX-token context each; every request is a synthetic
# prompt of PROMPT_TOKENS tokens answered with exactly OUTPUT_TOKENS tokens (ignore_eos). Each
# concurrency level (CONCURRENCY, default "1 4 8") runs REQUESTS_PER_STREAM requests per stream
# (at least 8 in all; prompts of its own, see below), ROUNDS times, the servers alternating
# which goes first; the table shows the median over rounds. guidellm 0.8.1 lives in
# .venv-bench/ (it pulls torch: about 6 GB, once); it tokenizes with the model's own tokenizer,
# converted from the GGUF file by transformers once and cached beside it. Nothing here needs
# the Hugging Face Hub. FIXED_CHUNK=N also runs inferno with a fixed prompt chunk of N tokens
# while streams decode (`--prefill-chunk-running N`, the policy before `--target-itl-ms`) as a
# third server; TARGET_ITL_MS sets the target of the first. OVERHEAD=0 skips the gRPC/HTTP
# overhead part. LLAMA_SERVER=none leaves llama-server out (a sweep of inferno's own settings,
# e.g. one run per TARGET_ITL_MS). INFERNO=PATH serves another inferno binary (an older build,
# to compare two builds under the same load). The requests are generated before the servers
# start (see below; SYNTHETIC_IN_RUN=1: during each run, as guidellm does by default).
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:-$(scripts/fetch-test-model.sh | tail -n 1)}
llama_server=${LLAMA_SERVER:-$HOME/.cache/llama-cpp-ref/llama.cpp/build/bin/llama-server}
threads=${THREADS:-2}
max_batch=${MAX_BATCH:-8}
ctx=${CTX:-1024}
prompt_tokens=${PROMPT_TOKENS:-128}
output_tokens=${OUTPUT_TOKENS:-128}
concurrency=${CONCURRENCY:-"1 4 8"}
per_stream=${REQUESTS_PER_STREAM:-4}
rounds=${ROUNDS:-2}
overhead_requests=${OVERHEAD_REQUESTS:-12}
fixed_chunk=${FIXED_CHUNK:-}
target_itl=${TARGET_ITL_MS:-}
overhead=${OVERHEAD:-1}
out=${RESULTS_DIR:-$(mktemp -d)}
mkdir -p "$out"
[ "$llama_server" = none ] || [ -x "$llama_server" ] || { echo "set LLAMA_SERVER to a llama-server binary" >&2; exit 1; }

bench_tools="guidellm==0.8.1 gguf==0.19.0"
if [ "$(cat .venv-bench/.inferno-bench-tools 2>/dev/null)" != "$bench_tools" ]; then
    python3 -m venv .venv-bench
    # shellcheck disable=SC2086 # the list is split on purpose
    .venv-bench/bin/python -m pip install --quiet $bench_tools
    echo "$bench_tools" > .venv-bench/.inferno-bench-tools
fi
tokenizer="${model%.gguf}-tokenizer"
if [ ! -f "$tokenizer/tokenizer.json" ]; then
    echo "converting the model's tokenizer for guidellm into $tokenizer" >&2
    .venv-bench/bin/python - "$model" "$tokenizer" <<'EOF'
import os, sys
from transformers import AutoTokenizer
model, dest = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(os.path.dirname(model), gguf_file=os.path.basename(model))
tok.save_pretrained(dest)
EOF
fi

# Requests one run at concurrency $1 sends: REQUESTS_PER_STREAM per stream, at least 8.
requests_at() {
    local n=$((per_stream * $1))
    [ "$n" -ge 8 ] || n=8
    echo "$n"
}

# The requests, written before any server starts: guidellm's synthetic-text generator
# tokenizes as it samples words until each prompt has exactly PROMPT_TOKENS tokens, and
# doing that during the run took most of a vCPU from the server under test for the first
# seconds (its data worker process), which is when the first burst of prompts is served.
# Read from a file, the rows cost guidellm nothing measurable. SYNTHETIC_IN_RUN=1 keeps
# the generation in the run, as before.
#
# Each concurrency level gets rows of its own: one server process serves every level of a
# round, and llama-server keeps the prompts it has seen (its slots, and up to 8 GiB of
# prompt states in RAM by default) and serves a prompt it saw at an earlier level from that
# cache, 999 of 1,000 tokens cached. With the same rows at every level it so skipped the
# prefill of half the requests at 4 and at 8 clients. Rounds restart the servers, so every
# round reuses the same rows level by level, alike for every server. guidellm's synthesis
# in the run (SYNTHETIC_IN_RUN=1) draws the same prompts for every level from a fixed seed,
# so there the server is restarted before each level instead.
requests=0
for c in $concurrency; do
    requests=$((requests + $(requests_at "$c")))
done
synthetic_in_run=${SYNTHETIC_IN_RUN:-0}
data="kind=synthetic_text,prompt_tokens=$prompt_tokens,output_tokens=$output_tokens"
if [ "$synthetic_in_run" = 0 ]; then
    rows="$out/requests-p$prompt_tokens-o$output_tokens.jsonl"
    if ! .venv-bench/bin/python - "$tokenizer" "$prompt_tokens" "$output_tokens" "$requests" \
        "$rows" 2>"$out/requests.log" <<'EOF'
import itertools, json, sys
from transformers import AutoTokenizer
from guidellm.data.deserializers.synthetic import SyntheticTextDataset
from guidellm.schemas.data.deserializers.synthetic import SyntheticTextDataArgs
tokenizer, prompt, output, n, path = sys.argv[1:6]
args = SyntheticTextDataArgs.model_validate(
    {"kind": "synthetic_text", "prompt_tokens": int(prompt), "output_tokens": int(output)})
rows = SyntheticTextDataset(args, AutoTokenizer.from_pretrained(tokenizer), random_seed=42)
with open(path, "w") as f:
    for row in itertools.islice(iter(rows), int(n)):
        turn = json.loads(row["conversation_turns"])["turns"][0]["columns"]
        f.write(json.dumps({
            "prompt": turn["text_column"][0],
            "prompt_tokens_count": turn["prompt_tokens_count_column"][0],
            "output_tokens_count": turn["output_tokens_count_column"][0],
        }) + "\n")
EOF
    then
        echo "writing the requests failed: see $out/requests.log" >&2
        exit 1
    fi
    written=$(wc -l <"$rows")
    [ "$written" -eq "$requests" ] ||
        { echo "$rows has $written requests, not $requests: see $out/requests.log" >&2; exit 1; }
    first=1
    for c in $concurrency; do
        n=$(requests_at "$c")
        sed -n "${first},$((first + n - 1))p" "$rows" >"${rows%.jsonl}-c$c.jsonl"
        first=$((first + n))
    done
fi

data_at() { # concurrency
    if [ "$synthetic_in_run" = 0 ]; then
        echo "kind=json_file,path=${rows%.jsonl}-c$1.jsonl"
    else
        echo "$data"
    fi
}

# The tree's own build only when no other binary is named.
if [ -z "${INFERNO:-}" ]; then
    cargo build --release --quiet --bin inferno
fi
inferno=${INFERNO:-target/release/inferno}
[ -x "$inferno" ] || { echo "INFERNO=$inferno is not an executable file" >&2; exit 2; }
port=${PORT:-18431}
grpc_port=$((port + 1))

server_pid=""
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
trap stop_server EXIT

wait_ready() { # url
    for _ in $(seq 1 600); do
        if curl -sf "$1" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    echo "the server at $1 never became ready" >&2
    exit 1
}

start_inferno() { # [extra serve flags]
    "$inferno" serve --model "$model" --threads "$threads" --max-batch "$max_batch" \
        --ctx-size "$ctx" --queue-capacity 64 --listen "127.0.0.1:$grpc_port" \
        --http-listen "127.0.0.1:$port" "$@" >>"$out/inferno-serve.log" 2>&1 &
    server_pid=$!
    wait_ready "http://127.0.0.1:$port/health"
}

start_inferno-target() {
    if [ -n "$target_itl" ]; then start_inferno --target-itl-ms "$target_itl"; else start_inferno; fi
}

start_inferno-fixed() { start_inferno --prefill-chunk-running "$fixed_chunk"; }

start_llama() {
    # -c is shared by the slots: each gets CTX.
    "$llama_server" -m "$model" -t "$threads" -tb "$threads" -np "$max_batch" \
        -c $((ctx * max_batch)) --host 127.0.0.1 --port "$port" --no-webui \
        >"$out/llama-server.log" 2>&1 &
    server_pid=$!
    wait_ready "http://127.0.0.1:$port/health"
}

run_guidellm() { # who round concurrency
    local n
    n=$(requests_at "$3")
    # The load generator's CPU seconds (its worker processes included), beside the run's
    # length: on two vCPUs every second it takes is one the server under test does not get.
    .venv-bench/bin/python - "$out/$1-r$2-c$3.cpu" .venv-bench/bin/guidellm run \
        --backend "kind=openai_http,target=http://127.0.0.1:$port,request_format=/v1/completions" \
        --profile "kind=concurrent,streams=$3" \
        --data "$(data_at "$3")" \
        --tokenizer "kind=hf_auto,model=$tokenizer" \
        --constraint "kind=max_requests,count=$n" \
        --output "kind=json,path=$out/$1-r$2-c$3.json" \
        --disable-console >/dev/null 2>"$out/$1-r$2-c$3.log" <<'EOF'
import resource, subprocess, sys, time
start = time.monotonic()
code = subprocess.run(sys.argv[2:]).returncode
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as f:
    f.write(f"{usage.ru_utime + usage.ru_stime:.2f} {time.monotonic() - start:.2f}\n")
sys.exit(code)
EOF
}

load() { uptime | sed 's/.*load average: //'; }
echo "load before: $(load)" | tee "$out/load.txt" >&2
for round in $(seq 1 "$rounds"); do
    order="inferno-target"
    [ "$llama_server" = none ] || order="$order llama"
    [ -z "$fixed_chunk" ] || order="$order inferno-fixed"
    ((round % 2)) || order=$(echo "$order" | tr ' ' '\n' | tac | tr '\n' ' ')
    for who in $order; do
        "start_$who"
        first_level=1
        for c in $concurrency; do
            if [ "$synthetic_in_run" != 0 ] && [ "$first_level" = 0 ]; then
                stop_server
                "start_$who"
            fi
            first_level=0
            run_guidellm "$who" "$round" "$c"
            echo "round $round: $who at concurrency $c done (load $(load))" >&2
        done
        # Inferno's counters (steps, speculation) over the server's runs, for the record.
        [ "$who" = llama ] || curl -sf "http://127.0.0.1:$port/metrics" >"$out/$who-r$round.metrics" || true
        stop_server
    done
done

# HTTP against gRPC, one stream at a time, each request interleaved with the same one run
# in-process on the same model and threads.
[ "$overhead" = 0 ] || start_inferno-target
for round in $(seq 1 "$rounds"); do
    [ "$overhead" != 0 ] || break
    for proto in grpc http; do
        addr="http://127.0.0.1:$grpc_port"
        [ "$proto" = http ] && addr="http://127.0.0.1:$port"
        "$inferno" loadtest --protocol "$proto" --addr "$addr" --baseline --model "$model" \
            --threads "$threads" --ctx-size "$ctx" --requests "$overhead_requests" \
            --max-tokens 64 --ignore-eos --output json \
            >"$out/overhead-$proto-r$round.json" 2>/dev/null
        echo "round $round: $proto overhead done (load $(load))" >&2
    done
done
stop_server
echo "load after: $(load)" | tee -a "$out/load.txt" >&2

python3 - "$out" "$concurrency" "$rounds" "$fixed_chunk" "$llama_server" <<'EOF'
import glob, json, statistics, sys
out, levels, rounds, fixed = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
llama = sys.argv[5] != "none"

def summary(path):
    b = json.load(open(path))["benchmarks"][0]
    m = b["metrics"]
    ok = lambda k: m[k]["successful"]
    tokens = ok("output_token_count")["total_sum"]
    return {
        "tps": tokens / b["duration"],
        "ttft50": ok("time_to_first_token_ms")["percentiles"]["p50"],
        "ttft99": ok("time_to_first_token_ms")["percentiles"]["p99"],
        "itl50": ok("inter_token_latency_ms")["percentiles"]["p50"],
        "itl99": ok("inter_token_latency_ms")["percentiles"]["p99"],
        "errors": m["request_totals"]["errored"],
    }

def client_cpu(path):
    """The load generator's CPU seconds over its run, start-up included (None if not
    recorded)."""
    try:
        return float(open(path[: -len(".json")] + ".cpu").read().split()[0])
    except (OSError, ValueError, IndexError):
        return None

def median(who, c, key):
    vals = [summary(p)[key] for p in sorted(glob.glob(f"{out}/{who}-r*-c{c}.json"))]
    return statistics.median(vals), len(vals)

def client_cpu_median(who, c):
    vals = [v for p in sorted(glob.glob(f"{out}/{who}-r*-c{c}.json"))
            if (v := client_cpu(p)) is not None]
    return f"{statistics.median(vals):.1f}" if vals else "-"

print("| concurrency | server | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
      "| errors | guidellm CPU s |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for c in levels:
    row = {}
    servers = [("inferno-target", "inferno serve")] + ([("llama", "llama-server")] if llama else [])
    if fixed:
        servers.append(("inferno-fixed", f"inferno, fixed chunk {fixed}"))
    for who, name in servers:
        vals = {k: median(who, c, k)[0] for k in ("tps", "ttft50", "ttft99", "itl50", "itl99", "errors")}
        row[who] = vals
        print(f"| {c} | {name} | {vals['tps']:.1f} | {vals['ttft50']:.0f} | {vals['ttft99']:.0f} "
              f"| {vals['itl50']:.1f} | {vals['itl99']:.1f} | {vals['errors']:.0f} | {client_cpu_median(who, c)} |")
    if not llama:
        continue
    i, l = row["inferno-target"], row["llama"]
    print(f"| {c} | inferno / llama-server | {i['tps'] / l['tps']:.2f}x | {i['ttft50'] / l['ttft50']:.2f}x "
          f"| {i['ttft99'] / l['ttft99']:.2f}x | {i['itl50'] / l['itl50']:.2f}x | {i['itl99'] / l['itl99']:.2f}x | | |")
print()
if not glob.glob(f"{out}/overhead-*.json"):
    print("load average (1, 5, 15 min):", " / ".join(open(f"{out}/load.txt").read().split("\n")[:2]))
    sys.exit(0)
print("| protocol | service ms/token | in-process ms/token | overhead ms/token | ± noise |")
print("|---|---:|---:|---:|---:|")
per_token = {}
for proto in ("grpc", "http"):
    runs = [json.load(open(p))["baseline"] for p in sorted(glob.glob(f"{out}/overhead-{proto}-r*.json"))]
    med = lambda k: statistics.median(r[k] for r in runs)
    per_token[proto] = med("service_stream_mean_inter_token_ms_p50")
    print(f"| {proto} | {per_token[proto]:.3f} | {med('in_process_run_mean_inter_token_ms_p50'):.3f} "
          f"| {med('overhead_raw_ms_per_token'):.3f} | {med('overhead_noise_ms_per_token'):.3f} |")
print(f"\nHTTP's time per token is {100 * (per_token['http'] / per_token['grpc'] - 1):+.1f}% of gRPC's "
      f"({rounds} rounds; raw JSON in {out})")
print("load average (1, 5, 15 min):", " / ".join(open(f"{out}/load.txt").read().split("\n")[:2]))
EOF
