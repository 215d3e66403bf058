#!/usr/bin/env python3
"""Aggregate decode throughput of a running llama.cpp `llama-server`, measured the way
`inferno loadtest` measures Inferno's service: CONCURRENCY clients send REQUESTS greedy
completions of N_PREDICT tokens each (end-of-generation ignored); the figure is completion
tokens over wall time.

    llama-server -m MODEL -t 2 -np 8 -cb --port 8089 &
    scripts/bench-llama-server.py http://127.0.0.1:8089 8 16 64 "Once upon a time"

Standard library only.
"""

import json
import sys
import threading
import time
import urllib.request


def complete(url, prompt, n_predict):
    body = json.dumps(
        {
            "prompt": prompt,
            "n_predict": n_predict,
            "ignore_eos": True,
            "temperature": 0,
            "cache_prompt": False,
        }
    ).encode()
    req = urllib.request.Request(
        url + "/completion", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    return out.get("tokens_predicted", 0)


def main():
    url, conc, total, n_predict = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    prompt = sys.argv[5] if len(sys.argv) > 5 else "Once upon a time"
    complete(url, prompt, 4)  # warm-up
    lock = threading.Lock()
    state = {"next": 0, "tokens": 0}

    def client():
        while True:
            with lock:
                if state["next"] >= total:
                    return
                state["next"] += 1
            n = complete(url, prompt, n_predict)
            with lock:
                state["tokens"] += n

    start = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    print(
        json.dumps(
            {
                "concurrency": conc,
                "requests": total,
                "completion_tokens": state["tokens"],
                "wall_seconds": wall,
                "aggregate_tokens_per_second": state["tokens"] / wall,
            }
        )
    )


if __name__ == "__main__":
    main()
