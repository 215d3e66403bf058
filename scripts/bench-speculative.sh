#!/usr/bin/env bash
# Speculative decoding, side by side: Inferno without speculation, with n-gram lookup and with
# a draft model (the model requantized to Q4_0, made here with `inferno quantize`), and
# llama.cpp's `llama-server` without speculation and with each of its n-gram types, on the
# same greedy 256-token chat requests (benches/speculative/*.txt): a code edit, a summary
# that quotes its source, free text; and Inferno alone on the free text sampled
# (`free_text_sampled`: generate's default sampling, temperature 0.8, seed = the round, the
# same seed with and without speculation), text whose lookups find little that the sampler
# keeps, which is what speculation costs where it has nothing to offer (SAMPLED_SEED fixes
# the seed instead, to repeat one text). REQUESTS and METHODS narrow the run to some
# requests and methods (`off` always runs). One command:
#
#   LLAMA_SERVER=/path/to/llama-server scripts/bench-speculative.sh [MODEL] [ROUNDS]
#
# MODEL defaults to the real test checkpoint (scripts/fetch-test-model.sh). Each round runs
# every configuration once on every request, Inferno's and llama.cpp's blocks in alternating
# order, so both see the same machine conditions; the table gives, per request, the median
# decode tokens/s (after the first token) over the rounds, the ratio to Inferno without
# speculation, and for speculation the acceptance rate (accepted / drafted tokens) and the
# mean accepted drafts per verification step. It also checks that Inferno's tokens are the
# same with and without speculation. THREADS (default 2), N (default 256). The load average
# is printed before and after each round; raw JSON is kept in $RESULTS_DIR (default: a
# temporary directory, printed at the end; not OUT_DIR, which cargo reads: ring's build
# script reruns when it changes). Without LLAMA_SERVER the llama.cpp columns are
# left out.
set -euo pipefail
cd "$(dirname "$0")/.."

model=${1:-$(scripts/fetch-test-model.sh | tail -n 1)}
rounds=${2:-3}
threads=${THREADS:-2}
n=${N:-256}
llama_server=${LLAMA_SERVER:-}
llama_types=${LLAMA_TYPES:-"none ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache"}
port=${PORT:-18089}
out=${RESULTS_DIR:-$(mktemp -d)}
inferno=target/release/inferno
mkdir -p "$out"
cargo build --release --quiet
read -r -a requests <<<"${REQUESTS:-code_edit summary free_text free_text_sampled}"
read -r -a methods <<<"off ${METHODS:-ngram draft}"
methods=(off $(printf '%s\n' "${methods[@]}" | grep -vx off || true))
sampled() { [ "$1" != "${1%_sampled}" ]; }
# llama-server's sampler differs from Inferno's, so it runs only the greedy requests.
llama_requests=()
for req in "${requests[@]}"; do
    sampled "$req" || llama_requests+=("$req")
done

draft=$out/draft-q4_0.gguf
[[ " ${methods[*]} " != *" draft "* ]] || [ -s "$draft" ] || "$inferno" quantize -m "$model" -o "$draft" --dtype q4_0 >&2

run_inferno() { # request method round
    local req=$1 method=$2 round=$3 extra=(--temperature 0)
    sampled "$req" && extra=(--temperature "${SAMPLED_TEMPERATURE:-0.8}" --seed "${SAMPLED_SEED:-$round}")
    [ "$method" = draft ] && extra+=(--draft-model "$draft")
    "$inferno" generate -m "$model" --threads "$threads" --chat -n "$n" \
        --speculative "$method" "${extra[@]}" --output json \
        "$(cat "benches/speculative/${req%_sampled}.txt")" \
        >"$out/inferno-$req-$method-r$round.json" 2>/dev/null
}

run_llama() { # type round
    local type=$1 round=$2
    "$llama_server" -m "$model" -t "$threads" -c 4096 -np 1 --port "$port" \
        --spec-type "$type" >"$out/llama-server-$type-r$round.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.2
    done
    for req in "${llama_requests[@]}"; do
        python3 - "$port" "benches/speculative/$req.txt" "$n" \
            >"$out/llama-$req-$type-r$round.json" <<'EOF'
import json, sys, urllib.request
port, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def post(route, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1200) as r:
        return json.load(r)
text = open(path).read()
prompt = post("/apply-template", {"messages": [{"role": "user", "content": text}]})["prompt"]
out = post("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0,
                           "cache_prompt": False, "seed": 0})
print(json.dumps({"timings": out["timings"], "tokens_predicted": out["tokens_predicted"]}))
EOF
    done
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

avx512=$(grep -qm1 avx512f /proc/cpuinfo && echo "AVX-512" || echo "AVX2, no AVX-512")
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($avx512), $(nproc) vCPU" \
    | tee "$out/machine.txt"
for round in $(seq 1 "$rounds"); do
    echo "round $round start: load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
    inferno_block() {
        # Methods alternate their order each round, so a drift in the machine's speed
        # falls on each equally.
        local order=("${methods[@]}")
        ((round % 2)) || mapfile -t order < <(printf '%s\n' "${methods[@]}" | tac)
        for req in "${requests[@]}"; do
            for method in "${order[@]}"; do
                run_inferno "$req" "$method" "$round"
            done
        done
    }
    llama_block() {
        [ -n "$llama_server" ] && ((${#llama_requests[@]})) || return 0
        for type in $llama_types; do
            run_llama "$type" "$round"
        done
    }
    if ((round % 2)); then inferno_block; llama_block; else llama_block; inferno_block; fi
    echo "round $round end: load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
done

python3 - "$out" "$rounds" "${requests[*]}" "$llama_types" "${llama_server:+yes}" "${methods[*]}" "${llama_requests[*]}" <<'EOF'
import json, statistics, sys
out, rounds, requests, types, llama = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5] == "yes"
methods, llama_requests = sys.argv[6].split(), sys.argv[7].split()
def load(path):
    with open(path) as f:
        return json.load(f)
med = statistics.median
print("| request | engine | speculation | decode t/s | × Inferno off | × off per round | acceptance | accepted per verification | tokens |")
print("|---|---|---|---:|---:|---|---:|---:|---:|")
for req in requests:
    runs = {m: [load(f"{out}/inferno-{req}-{m}-r{r}.json") for r in range(1, rounds + 1)]
            for m in methods}
    for m in methods[1:]:
        for a, b in zip(runs["off"], runs[m]):
            assert a["tokens"] == b["tokens"], f"{req}: {m} changed the tokens"
    base = med(r["metrics"]["decode_tokens_per_second"] for r in runs["off"])
    for m, rs in runs.items():
        tps = med(r["metrics"]["decode_tokens_per_second"] for r in rs)
        mt = rs[0]["metrics"]
        total = lambda k: sum(r["metrics"][k] for r in rs)
        d, a, v = total("drafted_tokens"), total("accepted_tokens"), total("verify_steps")
        acc = f"{a / d:.1%}" if d else "-"
        per = f"{a / v:.2f}" if v else "-"
        name = {"off": "off", "ngram": "ngram", "draft": "draft (Q4_0 self-draft)"}[m]
        rounds_ratio = ", ".join(f"{r['metrics']['decode_tokens_per_second'] / o['metrics']['decode_tokens_per_second']:.3f}"
                                 for o, r in zip(runs["off"], rs))
        print(f"| {req} | Inferno | {name} | {tps:.1f} | {tps / base:.3f} | {rounds_ratio} | {acc} | {per} | {mt['completion_tokens']} |")
    if not llama or req not in llama_requests:
        continue
    best = None
    for t in types:
        rs = [load(f"{out}/llama-{req}-{t}-r{r}.json") for r in range(1, rounds + 1)]
        tps = med(r["timings"]["predicted_per_second"] for r in rs)
        dn = sum(r["timings"].get("draft_n", 0) for r in rs)
        da = sum(r["timings"].get("draft_n_accepted", 0) for r in rs)
        acc = f"{da / dn:.1%}" if dn else "-"
        print(f"| {req} | llama-server | {t} | {tps:.1f} | {tps / base:.2f} | | {acc} | - | {rs[0]['tokens_predicted']} |")
        if t != "none" and (best is None or tps > best[1]):
            best = (t, tps)
    if best and "ngram" in runs:
        ours = med(r["metrics"]["decode_tokens_per_second"] for r in runs["ngram"])
        print(f"| {req} | | Inferno ngram ÷ llama-server's best n-gram ({best[0]}) | | {ours / best[1]:.2f} | | | | |")
EOF
echo "raw results: $out" >&2
