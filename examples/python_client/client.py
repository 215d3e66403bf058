#!/usr/bin/env python3
"""Streams a completion from an Inferno server to the terminal.

The gRPC stubs are generated from proto/ at run time with grpcio-tools, so the example
always matches the server's API. Requires: pip install grpcio grpcio-tools

    python3 examples/python_client/client.py --addr 127.0.0.1:50051 "Once upon a time"
"""

import argparse
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc

PROTO_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto")
PROTO_FILE = "inferno/v1/inference.proto"


def load_stubs():
    """Compiles the proto into a temporary directory and imports the generated modules.

    The directory is removed once they are imported: Python keeps imported modules in memory.
    """
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    with tempfile.TemporaryDirectory(prefix="inferno_stubs_") as out:
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"-I{include}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                PROTO_FILE,
            ]
        )
        if rc != 0:
            sys.exit(f"protoc failed with exit code {rc}")
        sys.path.insert(0, out)
        try:
            from inferno.v1 import inference_pb2, inference_pb2_grpc  # noqa: E402
        finally:
            sys.path.remove(out)

    return inference_pb2, inference_pb2_grpc


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prompt", nargs="?", default="Once upon a time")
    p.add_argument("--addr", default="127.0.0.1:50051")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int)
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message")
    p.add_argument("--token-file", help="file holding the server's bearer token")
    p.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds")
    args = p.parse_args()

    pb, rpc = load_stubs()
    sampling = pb.SamplingParams(temperature=args.temperature)
    if args.seed is not None:
        sampling.seed = args.seed
    req = pb.GenerateRequest(max_tokens=args.max_tokens, sampling=sampling)
    if args.chat:
        req.messages.append(pb.ChatMessage(role="user", content=args.prompt))
    else:
        req.prompt = args.prompt
    metadata = []
    if args.token_file:
        with open(args.token_file) as f:
            metadata.append(("authorization", "Bearer " + f.read().strip()))

    with grpc.insecure_channel(args.addr) as channel:
        stub = rpc.InferenceStub(channel)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=metadata, timeout=args.timeout)
        print(f"[{info.name}: {info.architecture}, {info.quantization}, "
              f"context {info.context_length}]", file=sys.stderr)
        if info.note:
            print(f"[{info.note}]", file=sys.stderr)
        done = None
        n = 0
        try:
            for msg in stub.Generate(req, metadata=metadata, timeout=args.timeout):
                kind = msg.WhichOneof("event")
                if kind == "token":
                    n += 1
                    sys.stdout.write(msg.token.text)
                    sys.stdout.flush()
                elif kind == "done":
                    done = msg.done
                    sys.stdout.write(done.text)
        except grpc.RpcError as e:
            print(f"\nerror: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
        print()
        if done is None:
            print("error: the stream ended without a final message", file=sys.stderr)
            return 1
        reason = pb.FinishReason.Name(done.finish_reason)
        print(f"[finish_reason={reason} tokens={n} "
              f"prompt_tokens={done.usage.prompt_tokens} "
              f"completion_tokens={done.usage.completion_tokens} "
              f"ttft_ms={done.timings.time_to_first_token_ms:.1f} "
              f"decode_tok_s={done.timings.decode_tokens_per_second:.1f}]", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())
