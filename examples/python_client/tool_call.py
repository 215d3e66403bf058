#!/usr/bin/env python3
"""Runs a two-turn tool conversation with an Inferno server.

Turn 1 asks a question and offers one tool, which the model must call (tool_choice
required, so the call is grammar-constrained and always parses). The script runs the tool
itself and sends the result back in turn 2: the assistant turn with its tool_calls, then a
"tool" message carrying the call's id and the result. The model's answer is printed.
Requires: pip install grpcio grpcio-tools

    python3 examples/python_client/tool_call.py --addr 127.0.0.1:50051

With --json, a summary of both turns is printed as one JSON line on stdout instead.
"""

import argparse
import json
import os
import sys

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from client import load_stubs  # noqa: E402

TOOL = {
    "name": "get_time",
    "description": "The current local time in a time zone.",
    "parameters": {
        "type": "object",
        "properties": {"tz": {"enum": ["UTC", "CET", "JST"]}},
        "required": ["tz"],
        "additionalProperties": False,
    },
}


def get_time(tz):
    """The tool, run here: a fixed answer, so the example needs no clock."""
    return json.dumps({"tz": tz, "time": {"UTC": "12:00", "CET": "13:00", "JST": "21:00"}[tz]})


def generate(stub, pb, req, timeout):
    """Streams one Generate call; returns (text, streamed tool calls, done message)."""
    text, calls, done = [], [], None
    for msg in stub.Generate(req, timeout=timeout):
        kind = msg.WhichOneof("event")
        if kind == "token":
            text.append(msg.token.text)
        elif kind == "tool_call":
            calls.append(msg.tool_call)
        elif kind == "done":
            done = msg.done
            text.append(done.text)
    if done is None:
        sys.exit("error: the stream ended without a final message")
    return "".join(text), calls, done


def summary(pb, text, calls, done):
    return {
        "finish_reason": pb.FinishReason.Name(done.finish_reason),
        "text": text,
        "streamed_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
        "tool_calls": [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in done.tool_calls
        ],
        "prompt_tokens": done.usage.prompt_tokens,
        "completion_tokens": done.usage.completion_tokens,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("question", nargs="?", default="What time is it in Tokyo?")
    p.add_argument("--addr", default="127.0.0.1:50051")
    p.add_argument("--max-tokens", type=int, default=64, help="for the answer (turn 2)")
    p.add_argument("--timeout", type=float, default=300.0, help="deadline per call, seconds")
    p.add_argument("--json", action="store_true", help="print a JSON summary of both turns")
    args = p.parse_args()

    pb, rpc = load_stubs()
    tools = [
        pb.Tool(
            name=TOOL["name"],
            description=TOOL["description"],
            parameters=json.dumps(TOOL["parameters"]),
        )
    ]
    greedy = pb.SamplingParams(temperature=0.0)
    user = pb.ChatMessage(role="user", content=args.question)
    with grpc.insecure_channel(args.addr) as channel:
        stub = rpc.InferenceStub(channel)
        first = pb.GenerateRequest(
            messages=[user],
            tools=tools,
            tool_choice=pb.ToolChoice(mode=pb.ToolChoice.MODE_REQUIRED),
            max_tokens=128,
            sampling=greedy,
        )
        try:
            text1, calls1, done1 = generate(stub, pb, first, args.timeout)
        except grpc.RpcError as e:
            sys.exit(f"error: turn 1: {e.code().name}: {e.details()}")
        if not done1.tool_calls:
            sys.exit(f"error: turn 1 made no tool call (text {text1!r})")

        # The assistant turn as the server reported it, then one result per call.
        messages = [user, pb.ChatMessage(role="assistant", tool_calls=done1.tool_calls)]
        for call in done1.tool_calls:
            result = get_time(**json.loads(call.arguments))
            messages.append(pb.ChatMessage(role="tool", tool_call_id=call.id, content=result))
        second = pb.GenerateRequest(
            messages=messages, tools=tools, max_tokens=args.max_tokens, sampling=greedy
        )
        try:
            text2, calls2, done2 = generate(stub, pb, second, args.timeout)
        except grpc.RpcError as e:
            sys.exit(f"error: turn 2: {e.code().name}: {e.details()}")

    if args.json:
        out = {
            "turn1": summary(pb, text1, calls1, done1),
            "results": [m.content for m in messages if m.role == "tool"],
            "turn2": summary(pb, text2, calls2, done2),
        }
        out["turn2"]["cached_prompt_tokens"] = done2.usage.cached_prompt_tokens
        print(json.dumps(out))
        return 0
    for call in done1.tool_calls:
        print(f"[call {call.id}: {call.name}({call.arguments})]", file=sys.stderr)
    print(text2)
    print(f"[finish_reason={pb.FinishReason.Name(done2.finish_reason)}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
