#!/usr/bin/env python3
"""Compares `inferno quantize` with llama.cpp's `llama-quantize` on one model: for each
requested type (Q4_K_M, Q5_K_M, Q6_K, ...) both quantize the same F16/F32 GGUF file, and
this script reports

  * whether every tensor got the same type in both files (the mixture rules), and
  * the RMSE of each file's dequantized matrices against the input, per tensor and
    over each group of same-typed tensors (ours vs theirs, lower is better).

Dequantization is gguf-py's (`gguf.quants.dequantize`), the same code for both files.

Usage:
  python3 scripts/compare-kquants.py --llama-quantize PATH [--inferno target/release/inferno]
      [--model IN.gguf] [--types Q4_K_M,Q5_K_M,Q6_K] [--work DIR] [--reuse]

Without --model, a random-weight Qwen3-0.6B-shaped F16 file is made with
`inferno synth --preset 0.6b --dtype f16`. The llama-quantize path may also come from
$LLAMA_QUANTIZE. Needs `pip install gguf numpy`. Exits 1 if any tensor's type differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, quants

ROOT = Path(__file__).resolve().parents[1]


def tensors(path: Path) -> dict[str, object]:
    return {t.name: t for t in GGUFReader(str(path)).tensors}


def values(t) -> np.ndarray:
    qtype = T(int(t.tensor_type))
    data = np.asarray(t.data)
    if qtype == T.F32:
        return data.astype(np.float32).reshape(-1)
    if qtype in (T.F16, T.BF16):
        return np.asarray(quants.dequantize(data.view(np.uint8), qtype), dtype=np.float32).reshape(-1)
    return np.asarray(quants.dequantize(data.view(np.uint8).reshape(-1), qtype), dtype=np.float32).reshape(-1)


def rmse_sums(ref: np.ndarray, got: np.ndarray) -> float:
    d = (got.astype(np.float64) - ref.astype(np.float64))
    return float(np.dot(d, d))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"))
    ap.add_argument("--inferno", type=Path, default=ROOT / "target/release/inferno")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--types", default="Q4_K_M,Q5_K_M,Q6_K")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--reuse", action="store_true", help="keep quantized files already in --work")
    args = ap.parse_args()
    if not args.llama_quantize:
        ap.error("--llama-quantize (or $LLAMA_QUANTIZE) is required")
    work = args.work or Path(tempfile.mkdtemp(prefix="kquants-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        model = work / "synth-0.6b-f16.gguf"
        if not model.exists():
            subprocess.run([str(args.inferno), "synth", "--preset", "0.6b", "--dtype", "f16",
                            "-o", str(model)], check=True)
    src = tensors(model)
    mismatched = 0
    for ftype in args.types.split(","):
        ours_path, theirs_path = work / f"inferno-{ftype}.gguf", work / f"llama-{ftype}.gguf"
        if not (args.reuse and theirs_path.exists()):
            # --allow-requantize: a quantized input (e.g. Q8_0) is dequantized first, as ours.
            subprocess.run([args.llama_quantize, "--allow-requantize", str(model), str(theirs_path),
                            ftype, str(args.threads)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not (args.reuse and ours_path.exists()):
            subprocess.run([str(args.inferno), "quantize", "-m", str(model), "-o", str(ours_path),
                            "--dtype", ftype.lower()], check=True, stderr=subprocess.DEVNULL)
        ours, theirs = tensors(ours_path), tensors(theirs_path)
        print(f"\n## {ftype} ({model.name})\n")
        by_type: dict[str, list[float]] = {}
        rows = []
        for name, t in src.items():
            o, th = ours[name], theirs[name]
            to, tt = T(int(o.tensor_type)).name, T(int(th.tensor_type)).name
            if to != tt:
                mismatched += 1
                print(f"TYPE MISMATCH {name}: inferno {to}, llama-quantize {tt}")
                continue
            if to == T(int(t.tensor_type)).name:
                continue  # left as it was (norms)
            ref = values(t)
            so, st = rmse_sums(ref, values(o)), rmse_sums(ref, values(th))
            acc = by_type.setdefault(to, [0.0, 0.0, 0])
            acc[0] += so
            acc[1] += st
            acc[2] += ref.size
            rows.append((name, to, np.sqrt(so / ref.size), np.sqrt(st / ref.size)))
        print("| tensors | type | count | RMSE inferno | RMSE llama-quantize | ratio |")
        print("|---|---|---:|---:|---:|---:|")
        for ty, (so, st, n) in sorted(by_type.items()):
            count = sum(1 for r in rows if r[1] == ty)
            ro, rt = np.sqrt(so / n), np.sqrt(st / n)
            print(f"| all {ty} | {ty} | {count} | {ro:.4e} | {rt:.4e} | {ro / rt:.4f} |")
        # One tensor of each role and type (the first in the file), e.g. attn_v in Q4_K and Q6_K.
        seen, picks = set(), []
        for r in rows:
            key = (r[0].split(".")[-2], r[1])
            if key not in seen:
                seen.add(key)
                picks.append(r)
        for name, ty, ro, rt in picks:
            print(f"| {name} | {ty} | 1 | {ro:.4e} | {rt:.4e} | {ro / rt:.4f} |")
        worse = [r for r in rows if r[2] > r[3]]
        print(f"\n{len(rows)} tensors quantized, types identical: {mismatched == 0}; "
              f"tensors where inferno's RMSE is higher: {len(worse)}"
              + (f" (worst ratio {max(r[2] / r[3] for r in worse):.4f})" if worse else ""))
        sys.stdout.flush()
    return 1 if mismatched else 0


if __name__ == "__main__":
    raise SystemExit(main())
