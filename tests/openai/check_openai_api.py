"""Drives a running `inferno serve` with the official `openai` Python package and checks
what it gets back, typed by the package's own models: chat whole and streamed with usage,
a two-turn tool conversation (a required call, its result sent back), a json_schema reply
validated by `jsonschema`, logprobs, n = 2, stop strings, reproducible seeds, completions
from token ids, the models list, reasoning apart from the answer, and each error class as
the client's own exception (400, 401, 404, 413, 429), after which the server's queue,
running and KV-cache gauges return to 0, logit_bias forcing a token, banning one, and
refused out of range (with vLLM's min_tokens and stop_token_ids), parallel_tool_calls
false keeping the first of two calls, and vLLM's continue_final_message (a prefilled reply,
continued as the raw prompt transformers renders for it is), add_generation_prompt and
chat_template_kwargs, and vLLM's structured_outputs and guided_* constraints.

Run by tests/openai_client.rs, which starts the server:

    python check_openai_api.py --base-url http://127.0.0.1:PORT/v1 --api-key TOKEN \
        [--limits] [--real]

--limits: the server runs with --queue-capacity 2 --max-batch 2 --max-message-bytes 65536
and a token, and the 401, 413 and 429 checks run. --real: the model is a real
instruction-tuned one, and the answers are checked for sense too. Prints a JSON summary.
"""

import argparse
import json
import re
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema
import openai
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
)
from openai.types import Completion

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string", "enum": ["UTC", "CET", "JST"]}},
                "required": ["tz"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def user(text):
    return [{"role": "user", "content": text}]


def models(client):
    page = client.models.list()
    ids = [m.id for m in page.data]
    check(len(ids) == 1, f"one model served: {ids}")
    m = client.models.retrieve(ids[0])
    check(m.id == ids[0] and m.object == "model", f"retrieve: {m}")
    return ids[0]


def chat(client, model, max_tokens):
    """Whole and streamed replies to the same greedy request carry the same text."""
    ask = dict(
        model=model,
        messages=user("Write one short sentence about the sea."),
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"frobnicate": {"unknown": "fields are ignored"}},
    )
    whole = client.chat.completions.create(**ask)
    check(isinstance(whole, ChatCompletion), "a ChatCompletion")
    c = whole.choices[0]
    check(c.message.role == "assistant", "assistant role")
    check(c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason}")
    u = whole.usage
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
    check(isinstance(u.prompt_tokens_details.cached_tokens, int), "cached_tokens")
    check(whole.id.startswith("chatcmpl-"), whole.id)

    text, usage, finish, chunks = "", None, None, 0
    for chunk in client.chat.completions.create(
        **ask, stream=True, stream_options={"include_usage": True}
    ):
        check(isinstance(chunk, ChatCompletionChunk), "a ChatCompletionChunk")
        chunks += 1
        if chunk.usage is not None:
            check(chunk.choices == [], "the usage chunk has no choices")
            usage = chunk.usage
            continue
        d = chunk.choices[0]
        text += d.delta.content or ""
        if d.finish_reason is not None:
            finish = d.finish_reason
    check(text == c.message.content, f"streamed {text!r} vs whole {c.message.content!r}")
    check(finish == c.finish_reason, f"streamed finish {finish}")
    check(usage is not None and usage.completion_tokens == u.completion_tokens, f"usage {usage}")
    # The same prompt again: its tokens come from the server's prefix cache.
    check(usage.prompt_tokens_details.cached_tokens > 0, f"cached {usage}")
    return {"text": text, "chunks": chunks, "completion_tokens": usage.completion_tokens}


def tools(client, model, max_tokens, real):
    """A required call, then its result sent back and answered; the call streamed too."""
    messages = user("What time is it in Tokyo? Use the tool.")
    first = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=200,
        temperature=0,
    )
    c = first.choices[0]
    check(c.finish_reason == "tool_calls", f"finish_reason {c.finish_reason}")
    calls = c.message.tool_calls
    check(calls and len(calls) == 1, f"one call: {calls}")
    call = calls[0]
    check(isinstance(call, ChatCompletionMessageFunctionToolCall), type(call).__name__)
    check(call.type == "function" and call.id.startswith("call_"), f"{call}")
    check(call.function.name in ("get_time", "get_weather"), call.function.name)
    args = json.loads(call.function.arguments)
    if call.function.name == "get_time":
        check(args["tz"] in ("UTC", "CET", "JST"), f"{args}")
    if real:
        check(call.function.name == "get_time", f"a real model asks for the time: {call}")
    check(c.message.content is None, f"no content beside the call: {c.message.content!r}")

    # The same call streamed: the deltas carry index, id, name and arguments.
    deltas = []
    for chunk in client.chat.completions.create(
        model=model,
        messages=messages,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": call.function.name}},
        max_tokens=200,
        temperature=0,
        stream=True,
    ):
        if chunk.choices and chunk.choices[0].delta.tool_calls:
            deltas.extend(chunk.choices[0].delta.tool_calls)
    check(len(deltas) == 1, f"one streamed call: {deltas}")
    d = deltas[0]
    check(d.index == 0 and d.id.startswith("call_") and d.type == "function", f"{d}")
    check(d.function.name == call.function.name, f"{d}")
    check(json.loads(d.function.arguments) == args, f"{d.function.arguments} vs {args}")

    result = {"tz": args.get("tz", "UTC"), "time": "09:30"}
    second = client.chat.completions.create(
        model=model,
        messages=messages
        + [
            c.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
        ],
        tools=TOOLS,
        max_tokens=max_tokens * 3,
        temperature=0,
    )
    a = second.choices[0]
    check(a.finish_reason in ("stop", "length"), f"turn 2 finish {a.finish_reason}")
    check(second.usage.prompt_tokens > first.usage.prompt_tokens, "turn 2's prompt grew")
    if real:
        check(a.message.content and a.message.content.strip(), "a real model answers")
    return {
        "call": {"name": call.function.name, "arguments": args},
        "answer": a.message.content,
        "turn2_prompt_tokens": second.usage.prompt_tokens,
        "turn2_cached_tokens": second.usage.prompt_tokens_details.cached_tokens,
    }


def json_schema(client, model, real):
    r = client.chat.completions.create(
        model=model,
        messages=user("Describe a person as JSON with name, age and tags."),
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": SCHEMA, "strict": True},
        },
        max_tokens=300,
        temperature=0,
    )
    check(r.choices[0].finish_reason == "stop", f"the schema ends the reply: {r}")
    value = json.loads(r.choices[0].message.content)
    jsonschema.validate(value, SCHEMA)
    if real:
        # Any object: bounded only by the model's sense, so only a real model is asked.
        obj = client.chat.completions.create(
            model=model,
            messages=user("Give a JSON object with one key."),
            response_format={"type": "json_object"},
            max_tokens=100,
            temperature=0,
        )
        check(isinstance(json.loads(obj.choices[0].message.content), dict), "json_object")
    return value


def vllm_structured(client, model, real):
    """vLLM's constraints, sent as its clients send them (extra_body): structured_outputs and
    the guided_* fields. A choice list gives exactly one of its strings (chat and
    completions), a schema valid JSON, a regex a full match; two constraints at once are a
    400 naming the second."""
    labels = ["positive", "negative", "neutral (mixed)"]
    ask = dict(model=model, max_tokens=20, temperature=0)
    got = {}
    for extra in ({"guided_choice": labels}, {"structured_outputs": {"choice": labels}}):
        r = client.chat.completions.create(
            **ask, messages=user("Classify: 'I loved this film.'"), extra_body=extra
        )
        c = r.choices[0]
        check(c.message.content in labels, f"{extra}: {c.message.content!r}")
        check(c.finish_reason == "stop", f"{extra}: {c.finish_reason}")
        got[next(iter(extra))] = c.message.content
    if real:
        check(got["guided_choice"] == "positive", f"a loved film: {got}")
    text = client.completions.create(
        **ask, prompt="The film was", extra_body={"guided_choice": labels}
    ).choices[0].text
    check(text in labels, f"completions: {text!r}")
    for extra in ({"guided_json": SCHEMA}, {"structured_outputs": {"json": json.dumps(SCHEMA)}}):
        r = client.chat.completions.create(
            **{**ask, "max_tokens": 300},
            messages=user("Describe a person as JSON."),
            extra_body=extra,
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    for extra in ({"guided_regex": "[0-9]{3}-[a-z]{2}"},
                  {"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}):
        r = client.chat.completions.create(**ask, messages=user("A code?"), extra_body=extra)
        check(re.fullmatch("[0-9]{3}-[a-z]{2}", r.choices[0].message.content), f"{r}")
    try:
        client.chat.completions.create(
            **ask,
            messages=user("x"),
            response_format={"type": "json_object"},
            extra_body={"guided_choice": labels},
        )
        raise AssertionError("two constraints were accepted")
    except openai.BadRequestError as e:
        check(e.body["param"] == "guided_choice", f"{e.body}")
    return got


def unserved(client, model):
    """What vLLM offers and this server does not compute, and OpenAI's deprecated functions,
    are refused naming the field, rather than answered as if they had been done; OpenAI's
    reasoning_effort is taken (a template variable, as vLLM passes it)."""
    function = {"name": "f", "parameters": {"type": "object"}}
    for extra, param in (
        ({"prompt_logprobs": 0}, "prompt_logprobs"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"functions": [function]}, "functions"),
        ({"functions": [function], "function_call": "auto"}, "function_call"),
    ):
        try:
            client.chat.completions.create(
                model=model, messages=user("x"), max_tokens=2, extra_body=extra
            )
            raise AssertionError(f"{extra} was accepted")
        except openai.BadRequestError as e:
            check(e.body["param"] == param, f"{extra}: {e.body}")
    ok = client.completions.create(
        model=model, prompt="x", max_tokens=2, extra_body={"use_beam_search": False}
    )
    check(len(ok.choices) == 1, f"{ok}")
    ok = client.chat.completions.create(
        model=model, messages=user("x"), max_tokens=2, reasoning_effort="low"
    )
    check(ok.choices[0].finish_reason in ("stop", "length"), f"{ok}")


def logprobs(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=user("Count: one, two,"),
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    c = r.choices[0]
    content = c.logprobs.content
    check(len(content) == r.usage.completion_tokens, f"{len(content)} logprobs")
    for t in content:
        check(t.logprob <= 0 and len(t.top_logprobs) == 3, f"{t}")
        check(bytes(t.bytes).decode("utf-8", "replace") == t.token, f"bytes of {t}")
        # Greedy: the chosen token is the most likely.
        check(t.top_logprobs[0].token == t.token, f"greedy choice {t}")
        check(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob, f"order {t}")
    check("".join(t.token for t in content) == c.message.content, "tokens spell the text")
    return [t.token for t in content]


def choices_and_seeds(client, model):
    ask = dict(
        model=model,
        messages=user("Say something."),
        max_tokens=12,
        temperature=1.2,
        extra_body={"top_k": 0, "min_p": 0.0, "ignore_eos": True},
    )
    two = client.chat.completions.create(**ask, n=2, seed=11)
    check([c.index for c in two.choices] == [0, 1], "two choices")
    check(two.usage.completion_tokens == 24, f"{two.usage}")
    again = client.chat.completions.create(**ask, n=2, seed=11)
    texts = [c.message.content for c in two.choices]
    check(texts == [c.message.content for c in again.choices], "a seed repeats the reply")
    # Choice 1 of seed 11 is the single reply of seed 12.
    one = client.chat.completions.create(**ask, seed=12)
    check(one.choices[0].message.content == texts[1], "choice i uses seed + i")
    other = client.chat.completions.create(**ask, seed=99)
    check(other.choices[0].message.content != texts[0], "another seed, another reply")
    return texts


def stop_strings(client, model):
    ask = dict(model=model, messages=user("Tell a story."), max_tokens=24, temperature=0)
    full = client.chat.completions.create(**ask).choices[0].message.content
    # A stop string from the middle of the greedy reply: the reply ends before it.
    m = re.search(r"\S\S", full[len(full) // 3 :])
    check(m is not None, f"a stop string in {full!r}")
    stop = m.group(0)
    at = full.index(stop)
    r = client.chat.completions.create(**ask, stop=[stop, "never appears 12345"])
    c = r.choices[0]
    check(c.message.content == full[:at], f"{c.message.content!r} vs {full[:at]!r}")
    check(c.finish_reason == "stop", c.finish_reason)
    one = client.chat.completions.create(**ask, stop=stop)
    check(one.choices[0].message.content == full[:at], "stop as a string")
    return stop


def post(base_url, api_key, path, body):
    """POSTs JSON to one of the server's own endpoints (/tokenize, /detokenize)."""
    req = urllib.request.Request(
        base_url.removesuffix("/v1") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"},
    )
    return json.load(urllib.request.urlopen(req))


def completions(client, model, base_url, api_key):
    text = "The quick brown fox"
    ids = post(base_url, api_key, "/tokenize", {"content": text})["tokens"]
    by_text = client.completions.create(model=model, prompt=text, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0)
    check(isinstance(by_ids, Completion) and by_ids.object == "text_completion", "Completion")
    check(by_ids.choices[0].text == by_text.choices[0].text, "ids and text agree")
    check(by_ids.usage.prompt_tokens == len(ids), f"{by_ids.usage}")
    echo = client.completions.create(
        model=model, prompt=text, max_tokens=4, temperature=0, echo=True
    )
    check(echo.choices[0].text.startswith(text), "echo")
    lp = client.completions.create(
        model=model, prompt=ids, max_tokens=4, temperature=0, logprobs=2
    )
    l = lp.choices[0].logprobs
    check(len(l.tokens) == 4 and len(l.top_logprobs) == 4, f"{l}")
    check(all(len(t) <= 2 for t in l.top_logprobs), f"{l.top_logprobs}")
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model, prompt=ids, max_tokens=8, temperature=0, stream=True
        )
        if c.choices
    )
    check(streamed == by_text.choices[0].text, f"streamed {streamed!r}")
    return by_ids.choices[0].text


def logit_bias(client, model, base_url, api_key, real):
    """A bias of 100 forces a token (greedy and sampled); with a real model, -100 on the
    greedy reply's first token makes the runner-up first while the logprobs, the model's
    own, stay as they were; a bias past 100, a key that is no token id and an id past the
    vocabulary are each a 400 naming logit_bias."""
    x = post(base_url, api_key, "/tokenize", {"content": " banana"})["tokens"][-1]
    want = post(base_url, api_key, "/detokenize", {"tokens": [x] * 4})["content"]
    for temperature, seed in ((0, None), (1.5, 3)):
        r = client.chat.completions.create(
            model=model,
            messages=user("Say something."),
            max_tokens=4,
            temperature=temperature,
            seed=seed,
            logit_bias={str(x): 100},
            extra_body={"ignore_eos": True},
        )
        got = r.choices[0].message.content
        check(got == want, f"forced {x} at temperature {temperature}: {got!r} vs {want!r}")
    banned = None
    if real:
        ask = dict(
            model=model,
            messages=user("Count: one, two,"),
            max_tokens=1,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
        )
        first = client.chat.completions.create(**ask).choices[0].logprobs.content[0]
        ids = post(base_url, api_key, "/tokenize", {"content": first.token})["tokens"]
        check(len(ids) == 1, f"{first.token!r} is one token: {ids}")
        banned = ids[0]
        r = client.chat.completions.create(**ask, logit_bias={str(banned): -100})
        after = r.choices[0].logprobs.content[0]
        runner_up = first.top_logprobs[1]
        check(after.token == runner_up.token, f"banned {first.token!r}: got {after.token!r}")
        # The same distribution (a bias in it would move these by about 100).
        check(abs(after.logprob - runner_up.logprob) < 1e-3, f"{after} vs {runner_up}")
        check(after.top_logprobs[0].token == first.token, f"raw logprobs: {after}")
        check(abs(after.top_logprobs[0].logprob - first.logprob) < 1e-3, f"raw: {after}")
    # vLLM's min_tokens and stop_token_ids: end-of-generation forced by a bias comes after
    # exactly min_tokens tokens; a forced stop token ends the reply at once, as "stop".
    eos = post(base_url, api_key, "/tokenize", {"content": "<|im_end|>"})["tokens"]
    check(len(eos) == 1, f"<|im_end|> is one token: {eos}")
    for extra, n in (
        ({"min_tokens": 3}, 3),
        ({"min_tokens": 0}, 0),
        ({"stop_token_ids": [x], "ignore_eos": True}, 0),
    ):
        bias = {str(eos[0]): 100} if "min_tokens" in extra else {str(x): 100}
        r = client.chat.completions.create(
            model=model,
            messages=user("Say something."),
            max_tokens=8,
            temperature=0,
            logit_bias=bias,
            extra_body=extra,
        )
        c = r.choices[0]
        check(r.usage.completion_tokens == n, f"{extra}: {r.usage}")
        check(c.finish_reason == "stop", f"{extra}: {c.finish_reason}")
    for bias in ({str(x): 101}, {"abc": 1}, {"999999999": 1}):
        try:
            client.chat.completions.create(
                model=model, messages=user("x"), max_tokens=2, logit_bias=bias
            )
            raise AssertionError(f"logit_bias {bias} was accepted")
        except openai.BadRequestError as e:
            check(e.body["param"] == "logit_bias", f"{bias}: {e.body}")
    return {"forced": want, "banned": banned}


def parallel_tool_calls(client, model):
    """A reply of two calls (written by a regex, so any model makes it): both reported by
    default, the first alone with parallel_tool_calls false, whole and streamed."""
    two = re.escape(
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    seen = {}
    for parallel, want in ((None, ["get_time", "get_weather"]), (False, ["get_time"])):
        ask = dict(
            model=model,
            messages=user("What time is it, and the weather in Oslo?"),
            tools=TOOLS,
            max_tokens=300,
            temperature=0,
            extra_body={"regex": two},
        )
        if parallel is not None:
            ask["parallel_tool_calls"] = parallel
        c = client.chat.completions.create(**ask).choices[0]
        names = [t.function.name for t in c.message.tool_calls or []]
        check(names == want, f"parallel_tool_calls {parallel}: {names}")
        # The newline between the blocks is no content, as OpenAI's replies have none.
        check(c.message.content is None, f"content beside the calls: {c.message.content!r}")
        check(c.finish_reason == "tool_calls", c.finish_reason)
        streamed, text = [], ""
        for chunk in client.chat.completions.create(**ask, stream=True):
            for ch in chunk.choices:
                streamed += [(t.index, t.function.name) for t in ch.delta.tool_calls or []]
                text += ch.delta.content or ""
        check(streamed == list(enumerate(want)), f"streamed {streamed}")
        check(text == "", f"streamed content beside the calls: {text!r}")
        seen[str(parallel)] = names
    return seen


ENDINGS = Path(__file__).resolve().parents[1] / "fixtures/chat_tools/chat-endings.json"


def prefill(client, model, base_url, api_key, real):
    """vLLM's continue_final_message, add_generation_prompt and chat_template_kwargs: the
    conflicting pair and a variable the server sets are 400s naming the field. With the
    real checkpoint, whose template the fixture holds: a prefilled reply is continued
    exactly as /v1/completions continues the prompt transformers renders for it, and the
    prompt is the open turn's plus the prefill's tokens (or less the turn's opening)."""
    ask = dict(model=model, max_tokens=2, temperature=0)
    for extra, param in (
        ({"continue_final_message": True, "add_generation_prompt": True},
         "continue_final_message"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}},
         "chat_template_kwargs.add_generation_prompt"),
        ({"chat_template_kwargs": {"enable_thinking": "yes"}},
         "chat_template_kwargs.enable_thinking"),
    ):
        try:
            client.chat.completions.create(**ask, messages=user("x"), extra_body=extra)
            raise AssertionError(f"{extra} was accepted")
        except openai.BadRequestError as e:
            check(e.body["param"] == param, f"{extra}: {e.body}")
    ok = client.chat.completions.create(
        **ask,
        messages=[*user("Hi"), {"role": "assistant", "content": "Hello"}],
        extra_body={"continue_final_message": True, "chat_template_kwargs": {"x": [1]}},
    )
    check(ok.choices[0].finish_reason in ("stop", "length"), f"{ok}")
    # vLLM's /tokenize of a conversation counts what the chat request was prompted with.
    counted = post(
        base_url,
        api_key,
        "/tokenize",
        {
            "messages": [*user("Hi"), {"role": "assistant", "content": "Hello"}],
            "continue_final_message": True,
            "chat_template_kwargs": {"x": [1]},
        },
    )
    check(counted["count"] == ok.usage.prompt_tokens == len(counted["tokens"]), f"{counted}")
    if not real:
        return None
    case = next(
        c for c in json.load(open(ENDINGS))["conversations"] if c["name"] == "prefilled_code"
    )
    ask["max_tokens"] = 24
    continued = client.chat.completions.create(
        **ask, messages=case["messages"], extra_body={"continue_final_message": True}
    )
    raw = client.completions.create(**ask, prompt=case["rendered"])
    got = continued.choices[0].message.content
    check(got == raw.choices[0].text, f"continued {got!r} vs raw {raw.choices[0].text!r}")
    check(continued.usage.prompt_tokens == raw.usage.prompt_tokens, f"{continued.usage}")
    question = case["messages"][:1]
    opened = client.chat.completions.create(**ask, messages=question).usage.prompt_tokens
    prefix = case["messages"][1]["content"]
    n = len(post(base_url, api_key, "/tokenize", {"content": prefix})["tokens"])
    check(continued.usage.prompt_tokens == opened + n, f"{opened} + {n}: {continued.usage}")
    closed = client.chat.completions.create(
        **ask, messages=question, extra_body={"add_generation_prompt": False}
    ).usage.prompt_tokens
    turn = len(post(base_url, api_key, "/tokenize", {"content": "<|im_start|>assistant\n"})["tokens"])
    check(closed == opened - turn, f"closed {closed}, opened {opened}, turn {turn}")
    return {"prefill": prefix, "continued": got}


def reasoning(client, model):
    """A `<think>` section comes apart as reasoning_content when asked for (the regex makes
    even a random-weight model write one)."""
    r = client.chat.completions.create(
        model=model,
        messages=user("Think, then answer."),
        max_tokens=40,
        temperature=0,
        extra_body={
            "separate_reasoning": True,
            "regex": "<think>\n[a-z]{1,8}\n</think>\n\n[a-z]{1,8}",
        },
    )
    m = r.choices[0].message
    thought = (m.model_extra or {}).get("reasoning_content")
    check(re.fullmatch(r"[a-z]{1,8}", thought or ""), f"reasoning {thought!r}")
    check(re.fullmatch(r"[a-z]{1,8}", m.content or ""), f"answer {m.content!r}")
    return {"reasoning": thought, "answer": m.content}


def gauges(base_url):
    text = urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics").read().decode()
    out = {}
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                 "vllm:kv_cache_usage_perc", "inferno_queue_depth", "inferno_running_streams",
                 "inferno_kv_cache_reserved_tokens"):
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        check(m is not None, f"{name} in /metrics")
        out[name] = float(m.group(1))
    return out


def errors(client, model, base_url, api_key):
    """Each error class as the client's own exception, then the gauges back at 0."""
    seen = {}
    try:
        client.chat.completions.create(model=model, messages=user("x"), temperature=-1)
        raise AssertionError("a negative temperature was accepted")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == "temperature", f"{e.body}")
        seen["400"] = e.body["message"]
    try:
        OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        raise AssertionError("a wrong token was accepted")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"{e}")
        seen["401"] = e.body["message"]
    try:
        client.chat.completions.create(model="no-such-model", messages=user("x"))
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        check(e.body["code"] == "model_not_found", f"{e.body}")
        seen["404"] = e.body["message"]
    try:
        client.chat.completions.create(model=model, messages=user("x" * 100_000))
        raise AssertionError("a body past the limit was accepted")
    except openai.APIStatusError as e:
        check(e.status_code == 413, f"{e.status_code} {e}")
        seen["413"] = e.body["message"]

    # Fill the batch (2) and the queue (2), then one more is refused with 429.
    long = dict(
        model=model,
        messages=user("Go on and on."),
        max_tokens=1500,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    streams = []
    for _ in range(2):
        s = client.chat.completions.create(**long)
        for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        streams.append(s)
    streams += [client.chat.completions.create(**long) for _ in range(2)]
    busy = gauges(base_url)
    check(busy["vllm:num_requests_running"] == 2, f"{busy}")
    check(busy["vllm:num_requests_waiting"] == 2, f"{busy}")
    check(busy["vllm:kv_cache_usage_perc"] > 0, f"{busy}")
    try:
        client.chat.completions.create(model=model, messages=user("x"), max_tokens=2)
        raise AssertionError("a request past a full queue was accepted")
    except openai.RateLimitError as e:
        check(e.status_code == 429, f"{e}")
        check(int(e.response.headers["retry-after"]) >= 1, f"{e.response.headers}")
        seen["429"] = e.body["message"]
    # The clients leave: their jobs end, the queue empties, the KV cache is released.
    for s in streams:
        s.close()
    deadline = time.time() + 120
    while True:
        g = gauges(base_url)
        if all(v == 0 for v in g.values()):
            break
        check(time.time() < deadline, f"gauges stayed at {g}")
        time.sleep(0.1)
    ok = client.chat.completions.create(model=model, messages=user("x"), max_tokens=2)
    check(ok.choices[0].finish_reason in ("stop", "length"), "served after")
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="unused")
    ap.add_argument("--limits", action="store_true")
    ap.add_argument("--real", action="store_true")
    a = ap.parse_args()
    # The client's own retries would hide a 429.
    client = OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0, timeout=600)
    out = {"openai": openai.__version__}
    model = models(client)
    out["model"] = model
    out["chat"] = chat(client, model, 16)
    out["tools"] = tools(client, model, 16, a.real)
    out["json_schema"] = json_schema(client, model, a.real)
    out["vllm_structured"] = vllm_structured(client, model, a.real)
    unserved(client, model)
    out["logprobs"] = logprobs(client, model)
    out["choices"] = choices_and_seeds(client, model)
    out["stop"] = stop_strings(client, model)
    out["completions"] = completions(client, model, a.base_url, a.api_key)
    out["logit_bias"] = logit_bias(client, model, a.base_url, a.api_key, a.real)
    out["parallel_tool_calls"] = parallel_tool_calls(client, model)
    out["reasoning"] = reasoning(client, model)
    out["prefill"] = prefill(client, model, a.base_url, a.api_key, a.real)
    if a.limits:
        out["errors"] = errors(client, model, a.base_url, a.api_key)
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test prints the whole story
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        raise
