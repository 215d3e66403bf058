"""Drives a running `inferno serve`'s Responses API (`/v1/responses`) with the official
`openai` Python package: its typed models read every reply, and its own stream helper
(`client.responses.stream`) rebuilds each streamed response from the events, refusing
events out of order or items whose identity changes. Each greedy response is checked
against the chat completion of the same conversation (the Responses API's input items,
instructions, tools and kept turns must become the same prompt), streamed against whole,
and the kept responses (previous_response_id, retrieve, input items paged by the client's
own cursor pages, delete, store false), input token counts (equal to the responses' usage),
truncation "auto" (the oldest turns dropped), function calls and their outputs sent back,
text.format (a JSON schema, and the client's pydantic parse), reasoning items, logprobs,
and each refusal as the client's exception, naming the field.

Run by tests/openai_client.rs, which starts the server:

    python check_responses_api.py --base-url http://127.0.0.1:PORT/v1 [--real]

--real: the model is a real instruction-tuned one, and the answers are checked for sense
too. Prints a JSON summary.
"""

import argparse
import json
import re
import sys

import jsonschema
import openai
from openai import OpenAI
from openai.types.responses import Response, ResponseFunctionToolCall
from pydantic import BaseModel, Field

# The chat checks' tools (run beside this script), and the same in the Responses API's shape.
from check_openai_api import TOOLS as CHAT_TOOLS, check

TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)


def chat_text(client, model, messages, max_tokens, **kw):
    r = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, **kw
    )
    return r


def check_usage(r):
    u = r.usage
    check(u.total_tokens == u.input_tokens + u.output_tokens, f"usage {u}")
    check(isinstance(u.input_tokens_details.cached_tokens, int), f"cached {u}")
    check(0 <= u.output_tokens_details.reasoning_tokens <= u.output_tokens, f"reasoning {u}")


def check_finished(r, max_tokens):
    """completed, or incomplete for the output limit with exactly that many tokens."""
    check(isinstance(r, Response) and r.object == "response", type(r).__name__)
    check(r.id.startswith("resp_"), r.id)
    check_usage(r)
    if r.status == "incomplete":
        check(r.incomplete_details.reason == "max_output_tokens", f"{r.incomplete_details}")
        check(r.usage.output_tokens == max_tokens, f"{r.usage} at {max_tokens}")
        check(r.completed_at is None, "no completed_at while incomplete")
    else:
        check(r.status == "completed" and r.completed_at, f"status {r.status}")


def stream_events(client, **ask):
    """The raw events of a streamed response, checked for order and numbering; returns them
    and the final response they carry."""
    events = list(client.responses.create(**ask, stream=True))
    seqs = [e.sequence_number for e in events]
    check(seqs == list(range(len(events))), f"sequence numbers {seqs}")
    kinds = [e.type for e in events]
    check(kinds[:2] == ["response.created", "response.in_progress"], f"opening {kinds[:3]}")
    check(kinds[-1] in ("response.completed", "response.incomplete"), f"closing {kinds[-1]}")
    check(events[0].response.status == "in_progress" and not events[0].response.output, "created")
    ids = {e.response.id for e in events if hasattr(e, "response")}
    check(len(ids) == 1, f"one response id: {ids}")
    return events, events[-1].response


def same_output(a, b):
    """Two responses' output items, ids aside (and the stream helper's `parsed` fields)."""

    def strip(r):
        items = []
        for item in r.output:
            d = {k: v for k, v in item.model_dump().items() if k not in ("id", "parsed_arguments")}
            for part in d.get("content") or []:
                part.pop("parsed", None)
            items.append(d)
        return items

    return strip(a) == strip(b)


def text_reply(client, model, real):
    """A text input and instructions give the chat completion's reply, whole and streamed."""
    question = "Write one short sentence about the sea."
    ask = dict(model=model, input=question, max_output_tokens=16, temperature=0)
    whole = client.responses.create(**ask)
    check_finished(whole, 16)
    chat = chat_text(client, model, [{"role": "user", "content": question}], 16)
    check(whole.output_text == chat.choices[0].message.content, f"{whole.output_text!r} vs chat")
    check(whole.usage.input_tokens == chat.usage.prompt_tokens, "the same prompt")
    check(whole.usage.output_tokens == chat.usage.completion_tokens, "the same tokens")
    check(len(whole.output) == 1 and whole.output[0].type == "message", f"{whole.output}")
    msg = whole.output[0]
    # The message being written when the limit came is incomplete too.
    check(msg.role == "assistant" and msg.status == whole.status, f"{msg}")
    check(msg.content[0].type == "output_text" and msg.content[0].annotations == [], f"{msg}")
    check(whole.temperature == 0 and whole.max_output_tokens == 16, "the request echoed")
    check(whole.tool_choice == "auto" and whole.tools == [], "no tools")
    if real:
        check(whole.output_text.strip(), "a real model answers")

    events, final = stream_events(client, **ask)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(deltas == whole.output_text, f"streamed {deltas!r} vs {whole.output_text!r}")
    check(same_output(final, whole), f"streamed {final.output} vs {whole.output}")
    check(final.usage.output_tokens == whole.usage.output_tokens, "streamed usage")
    done = [e for e in events if e.type == "response.output_text.done"]
    check(len(done) == 1 and done[0].text == whole.output_text, "output_text.done")

    # instructions are a system message first; a developer message is one too.
    sys_ask = dict(model=model, instructions="Answer in French.", max_output_tokens=8,
                   temperature=0)
    r = client.responses.create(
        **sys_ask,
        input=[{"role": "developer", "content": "Be brief."},
               {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": question}]}],
    )
    c = chat_text(client, model, [{"role": "system", "content": "Answer in French."},
                                  {"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": question}], 8)
    check(r.output_text == c.choices[0].message.content, "instructions and items")
    check(r.instructions == "Answer in French.", "instructions echoed")
    return {"text": whole.output_text, "status": whole.status, "events": len(events)}


def kept_turns(client, model, real):
    """previous_response_id continues the kept conversation (without its instructions) as
    a chat with every turn would; retrieve finds a kept response, delete forgets it, and
    store false keeps none."""
    first = client.responses.create(
        model=model, instructions="Be terse.", input="My name is Ada. Say hello.",
        max_output_tokens=12, temperature=0,
    )
    check(first.store is True, "kept by default")
    second = client.responses.create(
        model=model, previous_response_id=first.id, input="What is my name?",
        max_output_tokens=12, temperature=0,
    )
    check(second.previous_response_id == first.id, "previous_response_id echoed")
    chat = chat_text(client, model, [
        {"role": "user", "content": "My name is Ada. Say hello."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ], 12)
    check(second.output_text == chat.choices[0].message.content,
          f"turn 2 {second.output_text!r} vs chat {chat.choices[0].message.content!r}")
    check(second.usage.input_tokens == chat.usage.prompt_tokens, "turn 2's prompt")
    # Counted without generating: the same prompts, to the token.
    counted = client.responses.input_tokens.count(
        model=model, instructions="Be terse.", input="My name is Ada. Say hello.")
    check(counted.object == "response.input_tokens", f"{counted}")
    check(counted.input_tokens == first.usage.input_tokens,
          f"turn 1 counted {counted.input_tokens} vs {first.usage.input_tokens}")
    counted = client.responses.input_tokens.count(
        model=model, previous_response_id=first.id, input="What is my name?")
    check(counted.input_tokens == second.usage.input_tokens,
          f"turn 2 counted {counted.input_tokens} vs {second.usage.input_tokens}")
    if real:
        check("Ada" in second.output_text, f"a real model remembers: {second.output_text!r}")

    listed = list(client.responses.input_items.list(second.id))
    check([(i.type, i.role, i.content[0].text) for i in listed]
          == [("message", "user", "What is my name?")], f"input items {listed}")

    got = client.responses.retrieve(first.id)
    check(got.id == first.id and got.output_text == first.output_text, "retrieved")
    check(got.model_dump() == first.model_dump(), "retrieved as it was returned")
    client.responses.delete(first.id)
    try:
        client.responses.retrieve(first.id)
        check(False, "a deleted response is gone")
    except openai.NotFoundError as e:
        check("store" in str(e), f"{e}")
    try:
        client.responses.create(model=model, previous_response_id=first.id, input="x",
                                max_output_tokens=2)
        check(False, "a deleted response continues nothing")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "previous_response_id", f"{e.body}")
    try:
        client.responses.input_tokens.count(model=model, previous_response_id=first.id,
                                            input="x")
        check(False, "a deleted response is counted as nothing")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "previous_response_id", f"{e.body}")
    # The second turn was kept with its whole conversation: a third continues it.
    third = client.responses.create(model=model, previous_response_id=second.id,
                                    input="Thanks.", max_output_tokens=4, temperature=0)
    check(third.usage.input_tokens > second.usage.input_tokens, "turn 3 holds turn 2")

    unkept = client.responses.create(model=model, input="x", max_output_tokens=2, store=False)
    check(unkept.store is False, "store false echoed")
    try:
        client.responses.retrieve(unkept.id)
        check(False, "store false keeps nothing")
    except openai.NotFoundError:
        pass
    return {"turn2": second.output_text, "turn3_input_tokens": third.usage.input_tokens}


def function_calls(client, model, real):
    """A required call comes as a function_call item; sent back with its output it gives
    the chat completion's answer to the same turns; a named call streams through the
    client's stream helper."""
    question = "What time is it in Tokyo? Use the tool."
    r = client.responses.create(
        model=model, input=question, tools=TOOLS, tool_choice="required",
        max_output_tokens=200, temperature=0,
    )
    check_finished(r, 200)
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1 and len(r.output) == 1, f"one call and nothing else: {r.output}")
    call = calls[0]
    check(isinstance(call, ResponseFunctionToolCall), type(call).__name__)
    check(call.call_id.startswith("call_") and call.id.startswith("fc_"), f"{call}")
    check(call.status == "completed", f"{call}")
    check(call.name in ("get_time", "get_weather"), call.name)
    args = json.loads(call.arguments)
    if call.name == "get_time":
        check(args["tz"] in ("UTC", "CET", "JST"), f"{args}")
    if real:
        check(call.name == "get_time", f"a real model asks for the time: {call}")
    check(r.output_text == "", "no text beside the call")

    chat_call = chat_text(client, model, [{"role": "user", "content": question}], 200,
                          tools=CHAT_TOOLS, tool_choice="required")
    cc = chat_call.choices[0].message.tool_calls[0]
    check((cc.function.name, cc.function.arguments) == (call.name, call.arguments),
          "the chat completion's call")

    result = json.dumps({"tz": args.get("tz", "UTC"), "time": "09:30"})
    back = client.responses.create(
        model=model, tools=TOOLS, max_output_tokens=24, temperature=0,
        input=[{"role": "user", "content": question}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": result}],
    )
    chat = chat_text(client, model, [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.call_id, "type": "function",
                         "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result},
    ], 24, tools=CHAT_TOOLS)
    answer = chat.choices[0].message
    if answer.tool_calls:
        got = [(o.name, o.arguments) for o in back.output if o.type == "function_call"]
        want = [(t.function.name, t.function.arguments) for t in answer.tool_calls]
        check(got == want, f"turn 2 calls {got} vs chat {want}")
    else:
        check(back.output_text == (answer.content or ""),
              f"turn 2 {back.output_text!r} vs chat {answer.content!r}")
    if real:
        check(back.output_text.strip(), "a real model answers with the result")

    # The call's turn counted: the tools and both items are in the prompt.
    turn = [{"role": "user", "content": question}, call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": result}]
    counted = client.responses.input_tokens.count(model=model, tools=TOOLS, input=turn)
    check(counted.input_tokens == back.usage.input_tokens,
          f"the call's turn counted {counted.input_tokens} vs {back.usage.input_tokens}")
    bare = client.responses.input_tokens.count(model=model, input=turn)
    # The demo model's ChatML template leaves tool definitions out; a real one's has them.
    check(bare.input_tokens < counted.input_tokens if real
          else bare.input_tokens == counted.input_tokens,
          f"the tools are counted: {bare.input_tokens} without, {counted.input_tokens} with")

    # Its input items, as sent (the call keeps its id), a page of one at a time.
    listed = list(client.responses.input_items.list(back.id, order="asc"))
    check([i.type for i in listed] == ["message", "function_call", "function_call_output"],
          f"input items {listed}")
    check(listed[1].id == call.id and listed[1].call_id == call.call_id, f"{listed[1]}")
    check(listed[2].call_id == call.call_id and listed[2].output == result, f"{listed[2]}")
    paged = [i.id for i in client.responses.input_items.list(back.id, order="asc", limit=1)]
    check(paged == [i.id for i in listed], f"paged {paged}")
    newest_first = [i.id for i in client.responses.input_items.list(back.id)]
    check(newest_first == paged[::-1], f"default order {newest_first}")

    with client.responses.stream(
        model=model, input=question, tools=TOOLS,
        tool_choice={"type": "function", "name": call.name},
        max_output_tokens=200, temperature=0,
    ) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_response()
    check("response.function_call_arguments.delta" in kinds, f"{kinds}")
    scalls = [o for o in streamed.output if o.type == "function_call"]
    check(len(scalls) == 1 and json.loads(scalls[0].arguments) == args,
          f"streamed call {streamed.output}")
    return {"call": {"name": call.name, "arguments": args}, "answer": back.output_text}


def text_format(client, model, real):
    """A JSON schema in text.format holds the reply to it; the client's parse helper turns
    it into its pydantic model."""
    r = client.responses.create(
        model=model, input="Describe a person as JSON with name and age.",
        text={"format": {"type": "json_schema", "name": "person", "schema": SCHEMA,
                         "strict": True}},
        max_output_tokens=200, temperature=0,
    )
    check(r.status == "completed", f"the schema ends the reply: {r.status}")
    value = json.loads(r.output_text)
    jsonschema.validate(value, SCHEMA)
    check(r.text.format.type == "json_schema", f"format echoed: {r.text}")
    parsed = client.responses.parse(
        model=model, input="Describe a person.", text_format=Person,
        max_output_tokens=200, temperature=0,
    )
    check(isinstance(parsed.output_parsed, Person), f"parsed {parsed.output_parsed!r}")
    if real:
        obj = client.responses.create(
            model=model, input="Give a JSON object with one key.",
            text={"format": {"type": "json_object"}}, max_output_tokens=100, temperature=0,
        )
        check(isinstance(json.loads(obj.output_text), dict), "json_object")
    return {"schema": value, "parsed": parsed.output_parsed.model_dump()}


def reasoning_item(client, model):
    """A `<think>` section comes as a reasoning item before the message, its tokens counted
    (the regex makes even a random-weight model write one); streamed, the same items."""
    ask = dict(
        model=model, input="Think, then answer.", max_output_tokens=40, temperature=0,
        reasoning={"effort": "low"},
        extra_body={"separate_reasoning": True,
                    "regex": "<think>\n[a-z]{1,8}\n</think>\n\n[a-z]{1,8}"},
    )
    r = client.responses.create(**ask)
    check([o.type for o in r.output] == ["reasoning", "message"], f"{r.output}")
    thought = r.output[0].content[0].text
    check(re.fullmatch(r"[a-z]{1,8}", thought), f"reasoning {thought!r}")
    check(re.fullmatch(r"[a-z]{1,8}", r.output_text), f"answer {r.output_text!r}")
    n = r.usage.output_tokens_details.reasoning_tokens
    check(0 < n < r.usage.output_tokens, f"reasoning tokens {r.usage}")
    check(r.reasoning.effort == "low", f"effort echoed {r.reasoning}")
    with client.responses.stream(**ask) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_response()
    check("response.reasoning_text.delta" in kinds, f"{kinds}")
    check(same_output(streamed, r), f"streamed {streamed.output} vs {r.output}")
    check(streamed.usage.output_tokens_details.reasoning_tokens == n, "streamed count")
    return {"reasoning": thought, "answer": r.output_text, "reasoning_tokens": n}


def logprobs(client, model):
    """include message.output_text.logprobs gives the chat completion's logprobs."""
    question = "Count: one, two,"
    r = client.responses.create(
        model=model, input=question, max_output_tokens=6, temperature=0,
        include=["message.output_text.logprobs"], top_logprobs=2,
    )
    lps = r.output[0].content[0].logprobs
    c = chat_text(client, model, [{"role": "user", "content": question}], 6,
                  logprobs=True, top_logprobs=2)
    want = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
            for t in c.choices[0].logprobs.content]
    got = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in lps]
    check(got == want, f"logprobs {got} vs chat {want}")
    check(all(len(a) == 2 for _, _, a in got), "two alternatives each")
    events, final = stream_events(
        client, model=model, input=question, max_output_tokens=6, temperature=0,
        include=["message.output_text.logprobs"], top_logprobs=2,
    )
    streamed = [lp.token for e in events if e.type == "response.output_text.delta"
                for lp in e.logprobs]
    check(streamed == [t for t, _, _ in want][: len(streamed)] and streamed, f"{streamed}")
    check([t.token for t in final.output[0].content[0].logprobs] == [t for t, _, _ in want],
          "the final item's logprobs")
    plain = client.responses.create(model=model, input=question, max_output_tokens=2)
    check(plain.output[0].content[0].logprobs is None, "none unless included")
    return len(got)


def truncation(client, model):
    """truncation "auto" drops the fewest oldest turns (a user message and what follows it)
    that let the prompt and max_output_tokens fit the context, keeping the instructions: the
    response is the one asked for with only the turns kept, and the count agrees; without it
    the same conversation is refused."""
    ctx = client.models.retrieve(model).to_dict()["max_model_len"]
    max_out = 8
    instructions = "Answer in one word."

    def count(items, **kw):
        return client.responses.input_tokens.count(
            model=model, instructions=instructions, input=items, **kw).input_tokens

    question = [{"role": "user", "content": "Which turn came last?"}]
    turns = []
    # Half as much again as the context holds, so that several turns have to go.
    while count([m for t in turns for m in t] + question) + max_out <= ctx * 3 // 2:
        i = len(turns)
        filler = " ".join(f"item{i}x{j}" for j in range(60))
        turns.append([{"role": "user", "content": f"Turn {i}: {filler}"},
                      {"role": "assistant", "content": f"Noted {i}."}])
        check(len(json.dumps(turns)) < 48_000, f"the context ({ctx}) holds {len(turns)} turns")
    everything = [m for t in turns for m in t] + question
    # The fewest turns dropped that fit, found by asking without truncation.
    for dropped in range(1, len(turns) + 1):
        kept = [m for t in turns[dropped:] for m in t] + question
        kept_tokens = count(kept)
        if kept_tokens + max_out <= ctx:
            break
    check(1 < dropped < len(turns), f"dropped {dropped} of {len(turns)} turns")

    r = client.responses.create(model=model, instructions=instructions, input=everything,
                                truncation="auto", max_output_tokens=max_out, temperature=0)
    check(r.truncation == "auto", "truncation echoed")
    check(r.usage.input_tokens == kept_tokens,
          f"prompt {r.usage.input_tokens} vs the {kept_tokens} of the turns kept")
    alone = client.responses.create(model=model, instructions=instructions, input=kept,
                                    max_output_tokens=max_out, temperature=0)
    check(r.output_text == alone.output_text,
          f"truncated {r.output_text!r} vs the kept turns alone {alone.output_text!r}")
    counted = count(everything, truncation="auto", extra_body={"max_output_tokens": max_out})
    check(counted == kept_tokens, f"counted {counted} vs {kept_tokens}")
    try:
        client.responses.create(model=model, instructions=instructions, input=everything,
                                max_output_tokens=max_out)
        check(False, "without truncation the conversation is refused")
    except openai.BadRequestError as e:
        check("context" in str(e), f"{e}")
    return {"ctx": ctx, "turns": len(turns), "dropped": dropped, "input_tokens": kept_tokens}


def refusals(client, model):
    """What is not served is refused as the client's BadRequestError naming the field."""
    cases = [
        (dict(input="x", tools=[{"type": "web_search"}]), "tools[0].type"),
        (dict(input="x", background=True), "background"),
        (dict(input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]),
         "input[0].content[0].type"),
        (dict(input="x", previous_response_id="resp_nope"), "previous_response_id"),
        (dict(input="x", truncation="middle"), "truncation"),
        (dict(input="x", text={"format": {"type": "json_schema", "name": "x"}}),
         "text.format.schema"),
        (dict(input="x", tool_choice={"type": "file_search"}, tools=TOOLS), "tool_choice"),
        (dict(input=[{"type": "item_reference", "id": "msg_1"}]), "input[0].type"),
        (dict(input="x", temperature=-1), "temperature"),
        (dict(input=[]), "input"),
        (dict(input=[{"type": "reasoning", "summary": []}]), "input"),
    ]
    seen = {}
    for kw, param in cases:
        try:
            client.responses.create(model=model, max_output_tokens=2, **kw)
            check(False, f"{kw} is refused")
        except openai.BadRequestError as e:
            check(e.body.get("param") == param, f"{kw}: {e.body}")
            seen[param] = e.body.get("message")
        if "background" in kw or "temperature" in kw:
            continue  # fields of generating, which counting does not take
        # Counting refuses the same conversation the same way.
        try:
            client.responses.input_tokens.count(model=model, **kw)
            check(False, f"{kw} is refused when counted")
        except openai.BadRequestError as e:
            check(e.body.get("param") == param, f"counted {kw}: {e.body}")
    try:
        client.responses.retrieve("resp_nope")
        check(False, "an unknown response is not found")
    except openai.NotFoundError:
        pass
    try:
        client.responses.create(model="not-this-one", input="x")
        check(False, "another model is not found")
    except openai.NotFoundError:
        pass
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--real", action="store_true")
    a = ap.parse_args()
    client = OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    out = {"openai": openai.__version__, "model": model}
    out["text"] = text_reply(client, model, a.real)
    out["kept"] = kept_turns(client, model, a.real)
    out["function_calls"] = function_calls(client, model, a.real)
    out["text_format"] = text_format(client, model, a.real)
    out["reasoning"] = reasoning_item(client, model)
    out["logprobs"] = logprobs(client, model)
    out["truncation"] = truncation(client, model)
    out["refusals"] = refusals(client, model)
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints the whole story
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        raise
