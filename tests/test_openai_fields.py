"""Every request field through the real openai client: each one either has
its effect or is refused with a 400 naming it in an OpenAI error body; text
parts, the model, version, tokenize and detokenize endpoints."""

from __future__ import annotations

import math
from importlib.metadata import version

import httpx
import openai
import pytest
from serving import running_server

from mlxcel.engine.builtin_models import TINY_MODEL_NAME
from mlxcel.engine.session_prompts import DEFAULT_QUESTIONS

FORCED = 123  # a token id of the tiny model's vocabulary


@pytest.fixture(scope="module")
def served(tiny_loaded):
    from mlxcel.engine.config import CascadeConfig, EngineConfig
    from mlxcel.engine.engine import Engine

    engine = Engine(tiny_loaded, EngineConfig(num_blocks=256), cascade=CascadeConfig())
    with running_server(engine) as (base, server):
        yield base, openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def ask(client, question=DEFAULT_QUESTIONS[0], **fields):
    fields = {"max_tokens": 10, "temperature": 0, **fields}
    return client.chat.completions.create(model=TINY_MODEL_NAME, messages=[{"role": "user", "content": question}],
                                          **fields)


def generated(reply) -> list[int]:
    return reply.choices[0].model_extra["token_ids"]


IDS = {"extra_body": {"return_token_ids": True, "ignore_eos": True}}


def with_ids(**extra):
    return {"extra_body": {**IDS["extra_body"], **extra}}


def test_logit_bias_forces_a_token(served):
    base, client = served
    free = generated(ask(client, **IDS))
    forced = generated(ask(client, logit_bias={str(FORCED): 100}, temperature=1.0, **IDS))
    assert forced == [FORCED] * 10 and FORCED not in free
    banned = generated(ask(client, logit_bias={str(free[0]): -100}, **IDS))
    assert banned[0] != free[0]


def test_chat_top_logprobs_are_ordered_and_as_many_as_asked(served):
    base, client = served
    reply = ask(client, logprobs=True, top_logprobs=4, **IDS)
    content = reply.choices[0].logprobs.content
    ids = generated(reply)
    assert len(content) == len(ids) == 10
    for entry in content:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 4 and values == sorted(values, reverse=True) and values[0] <= 0
        assert sum(math.exp(v) for v in values) <= 1 + 1e-4
        assert entry.token == entry.top_logprobs[0].token and entry.logprob == pytest.approx(values[0])  # greedy
        assert entry.bytes == list(entry.token.encode())
    only = ask(client, logprobs=True, **IDS).choices[0].logprobs.content
    assert [e.top_logprobs for e in only] == [[]] * 10
    assert [e.logprob for e in only] == pytest.approx([e.logprob for e in content], abs=1e-5)
    assert ask(client).choices[0].logprobs is None


def test_chat_stream_carries_each_tokens_logprobs(served):
    base, client = served
    whole = ask(client, logprobs=True, top_logprobs=2, **IDS).choices[0].logprobs.content
    chunks = list(ask(client, logprobs=True, top_logprobs=2, stream=True, **IDS))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in whole]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in whole], abs=1e-5)


def test_completion_logprobs(served):
    base, client = served
    reply = client.completions.create(model=TINY_MODEL_NAME, prompt="The pool", max_tokens=6, temperature=0,
                                      logprobs=3, extra_body={"ignore_eos": True})
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        values = list(top.values())
        assert 1 <= len(values) <= 3 and values == sorted(values, reverse=True)  # distinct ids may share a text
        assert chosen == pytest.approx(values[0])
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_penalties_change_the_tokens(served):
    base, client = served
    # A bias that wins every step (logits spread over about [-7, 7]) makes a repeat a penalty must break;
    # tests/test_sampling.py checks each penalty's tokens against a reference.
    bias = {"logit_bias": {str(FORCED): 14}}
    repeating = generated(ask(client, **bias, **IDS))
    assert repeating == [FORCED] * 10
    for fields in ({"frequency_penalty": 2.0, "frequency_context_size": 8}, {"repetition_penalty": 10.0}):
        penalised = generated(ask(client, **bias, **with_ids(**fields)))
        assert penalised != repeating and FORCED in penalised, fields


def test_every_sampling_field_reaches_the_engine():
    from mlxcel.engine.limits import ServerLimits
    from mlxcel.engine.openai_api import CompletionRequest

    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.5, "top_p": 0.9, "top_k": 7,
            "min_p": 0.1, "seed": 3, "logit_bias": {"5": -2}, "presence_penalty": 1.0, "presence_context_size": 9,
            "frequency_penalty": -1.0, "frequency_context_size": 11, "repetition_penalty": 1.3,
            "repetition_context_size": 13, "logprobs": True, "top_logprobs": 2, "max_tokens": 4}
    p = CompletionRequest.parse(body, chat=True, model=TINY_MODEL_NAME, limits=ServerLimits(),
                                vocab_size=1024).params
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed, p.logit_bias) == (0.5, 0.9, 7, 0.1, 3, ((5, -2.0),))
    assert (p.presence_penalty, p.presence_context_size, p.frequency_penalty, p.frequency_context_size,
            p.repetition_penalty, p.repetition_context_size, p.logprobs) == (1.0, 9, -1.0, 11, 1.3, 13, 2)


def test_top_k_one_is_greedy_at_any_temperature(served):
    base, client = served
    greedy = generated(ask(client, **IDS))
    assert generated(ask(client, temperature=2.0, seed=5, **with_ids(top_k=1))) == greedy
    assert generated(ask(client, temperature=2.0, seed=5, **with_ids(min_p=0.999))) == greedy
    assert generated(ask(client, temperature=2.0, seed=5, **IDS)) != greedy


REFUSED = {
    "response_format": {"response_format": {"type": "json_object"}},
    "tools": {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    "tool_choice": {"tool_choice": "auto"},
    "top_logprobs": {"top_logprobs": 3},
    "logit_bias": {"logit_bias": {"99999999": 5}},
    "presence_penalty": {"presence_penalty": 3},
    "min_p": {"extra_body": {"min_p": 1}},
    "top_k": {"extra_body": {"top_k": -1}},
    "xtc_probability": {"extra_body": {"xtc_probability": 0.5}},
    "bogus": {"extra_body": {"bogus": 1}},
    "n": {"n": 2},
}


@pytest.mark.parametrize("param", sorted(REFUSED))
def test_unsupported_or_bad_fields_are_a_400_naming_them(served, param):
    base, client = served
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, **REFUSED[param])
    assert err.value.status_code == 400 and err.value.param == param
    assert err.value.body["message"] and err.value.type == "invalid_request_error"


@pytest.mark.parametrize("field, value", [("echo", True), ("suffix", "end"), ("best_of", 2), ("logprobs", 21)])
def test_completion_refusals(served, field, value):
    base, client = served
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=TINY_MODEL_NAME, prompt="hi", max_tokens=2, **{field: value})
    assert err.value.param == field


def test_no_op_forms_are_accepted(served):
    base, client = served
    reply = ask(client, response_format={"type": "text"}, tool_choice="none", user="someone",
                extra_body={"metadata": None, "tools": None})
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_text_parts_are_the_same_prompt_as_a_string(served):
    base, client = served
    text = DEFAULT_QUESTIONS[1]
    parts = [{"type": "text", "text": text[:7]}, {"type": "text", "text": text[7:]}]
    as_string = httpx.post(f"{base}/tokenize", json={"messages": [{"role": "user", "content": text}]}).json()
    as_parts = httpx.post(f"{base}/tokenize", json={"messages": [{"role": "user", "content": parts}]}).json()
    assert as_parts == as_string and as_string["count"] == len(as_string["tokens"]) > 5
    reply = client.chat.completions.create(model=TINY_MODEL_NAME, messages=[{"role": "user", "content": parts}],
                                           max_tokens=6, temperature=0)
    assert reply.choices[0].message.content == ask(client, question=text, max_tokens=6).choices[0].message.content
    image = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=TINY_MODEL_NAME, messages=[{"role": "user", "content": image}])
    assert err.value.param == "messages"


def test_models_version_tokenize_detokenize(served):
    base, client = served
    assert client.models.retrieve(TINY_MODEL_NAME).id == TINY_MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    assert httpx.get(f"{base}/version").json() == {"version": version("mlxcel-tui")}
    ids = httpx.post(f"{base}/tokenize", json={"prompt": "paged attention"}).json()["tokens"]
    assert httpx.post(f"{base}/detokenize", json={"tokens": ids}).json() == {"prompt": "paged attention"}
    for path, body, param in (("/detokenize", {"tokens": [10**9]}, "tokens"), ("/tokenize", {"prompt": ""}, "prompt"),
                              ("/tokenize", {"prompt": "x", "add_special_tokens": True}, "add_special_tokens")):
        response = httpx.post(f"{base}{path}", json=body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_health_answers_without_the_key(make_engine):
    with running_server(make_engine(), api_key="k" * 32) as (base, server):
        assert httpx.get(f"{base}/health").status_code == 200
        assert httpx.get(f"{base}/v1/models").status_code == 401
        assert httpx.get(f"{base}/version").status_code == 401
