// The official OpenAI Node SDK against dedit-openai (run by
// openai_gateway_test.cc, which starts the services and writes EXPECTED).
//
//   OPENAI_SDK_DIR=<dir with node_modules/openai> \
//   OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 EXPECTED=expected.json \
//   node openai_sdk_test.cjs main|abort|abort-blocking
//
// main: completions and chat, streamed and not, equal the expected text
// (the router's gRPC result, itself equal to target-only greedy decoding);
// usage counts; stop strings; extensions; errors as OpenAI error objects.
// abort: a stream aborted by the client after a few chunks.
// abort-blocking: a non-streamed request aborted while it is generated.
'use strict';
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const sdk = require(path.join(process.env.OPENAI_SDK_DIR, 'node_modules', 'openai'));
const OpenAI = sdk.OpenAI || sdk.default || sdk;
const baseURL = process.env.OPENAI_BASE_URL;
const expected = JSON.parse(fs.readFileSync(process.env.EXPECTED, 'utf8'));
const client = new OpenAI({baseURL, apiKey: 'unused', maxRetries: 0, timeout: 120000});
const model = expected.model;

function checkUsage(usage, want, what) {
  assert.ok(usage, `${what}: usage missing`);
  assert.equal(usage.prompt_tokens, want.prompt_tokens, `${what}: prompt_tokens`);
  assert.equal(usage.completion_tokens, want.completion_tokens, `${what}: completion_tokens`);
  assert.equal(usage.total_tokens, want.prompt_tokens + want.completion_tokens, `${what}: total_tokens`);
  assert.ok(usage.acceptance.rounds > 0, `${what}: acceptance.rounds`);
  assert.equal(typeof usage.acceptance.mean_acceptance_length, 'number');
}

// Neutral values of unsupported features, as real clients send them.
const neutral = {presence_penalty: 0, frequency_penalty: 0, logit_bias: {}, user: 'sdk-test', n: 1};

async function completions() {
  const c = expected.completion;
  const body = {model, prompt: c.prompt, max_tokens: c.max_tokens, temperature: 0, ...neutral};
  const r = await client.completions.create(body);
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].text, c.text, 'completion text = gRPC = greedy');
  assert.equal(r.choices[0].finish_reason, c.finish_reason);
  checkUsage(r.usage, c, 'completion');

  const stream = await client.completions.create({...body, stream: true, stream_options: {include_usage: true}});
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.text;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.equal(text, c.text, 'streamed completion text = gRPC = greedy');
  assert.equal(finish, c.finish_reason);
  checkUsage(usage, c, 'streamed completion');
  assert.ok(chunks >= 3, `only ${chunks} chunks`);

  // Target-only decoding and other W/K: the same text (lossless).
  const plain = await client.completions.create({...body, disable_speculation: true});
  assert.equal(plain.choices[0].text, c.text, 'disable_speculation');
  assert.equal(plain.usage.acceptance.drafted_rounds, 0);
  const wk = await client.completions.create({...body, window: 4, passes: 2});
  assert.equal(wk.choices[0].text, c.text, 'window 4, passes 2');
}

async function chat() {
  const c = expected.chat;
  const body = {model, messages: c.messages, max_completion_tokens: c.max_tokens, temperature: 0,
                chat_template_kwargs: {enable_thinking: false}, logprobs: false, ...neutral};
  const r = await client.chat.completions.create(body);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, c.text, 'chat text = gRPC = greedy');
  assert.equal(r.choices[0].finish_reason, c.finish_reason);
  checkUsage(r.usage, c, 'chat');

  const stream = await client.chat.completions.create({...body, stream: true, stream_options: {include_usage: true}});
  let text = '', role = null, finish = null, usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      if (choice.delta.role) role = choice.delta.role;
      if (choice.delta.content) text += choice.delta.content;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(text, c.text, 'streamed chat text = gRPC = greedy');
  assert.equal(finish, c.finish_reason);
  checkUsage(usage, c, 'streamed chat');

  // Without stream_options the stream carries no usage.
  const bare = await client.chat.completions.create({...body, stream: true});
  let bareText = '';
  for await (const chunk of bare) {
    assert.equal(chunk.usage, undefined);
    for (const choice of chunk.choices) bareText += choice.delta.content || '';
  }
  assert.equal(bareText, c.text);
}

async function stopStrings() {
  const s = expected.stop;
  const body = {model, prompt: s.prompt, max_tokens: s.max_tokens, temperature: 0, stop: [s.stop, '\u0000never']};
  const r = await client.completions.create(body);
  assert.equal(r.choices[0].text, s.text, 'output cut before the stop string');
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].stop_reason, s.stop);
  const stream = await client.completions.create({...body, stop: s.stop, stream: true});
  let text = '', finish = null;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      text += choice.text;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.equal(text, s.text, 'streamed: cut before the stop string');
  assert.equal(finish, 'stop');
}

async function expectError(promise, status, param, what) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `${what}: ${e}`);
    assert.equal(e.status, status, `${what}: status (${e.message})`);
    if (param !== undefined) assert.equal(e.param, param, `${what}: param (${e.message})`);
    assert.equal(typeof e.error.message, 'string');
    assert.ok('type' in e.error && 'code' in e.error, `${what}: error object`);
    return e;
  }
  assert.fail(`${what}: no error`);
}

async function errors() {
  const prompt = expected.completion.prompt;
  const cmpl = (extra) => client.completions.create({model, prompt, max_tokens: 4, ...extra});
  const chat = (extra) => client.chat.completions.create(
      {model, messages: [{role: 'user', content: 'hi'}], max_tokens: 4, ...extra});
  await expectError(cmpl({n: 2}), 400, 'n', 'n > 1');
  await expectError(cmpl({presence_penalty: 0.5}), 400, 'presence_penalty', 'penalty');
  await expectError(cmpl({logprobs: 2}), 400, 'logprobs', 'completion logprobs');
  await expectError(cmpl({logit_bias: {'5': 10}}), 400, 'logit_bias', 'logit_bias');
  await expectError(cmpl({echo: true}), 400, 'echo', 'echo');
  await expectError(cmpl({foo: 1}), 400, 'foo', 'unknown field');
  await expectError(cmpl({max_tokens: 'ten'}), 400, 'max_tokens', 'wrong type');
  await expectError(cmpl({max_tokens: 0}), 400, 'max_tokens', 'max_tokens 0');
  await expectError(chat({logprobs: true}), 400, 'logprobs', 'chat logprobs');
  await expectError(chat({tools: [{type: 'function', function: {name: 'f', parameters: {}}}]}), 400, 'tools', 'tools');
  await expectError(chat({n: 3, stream: true}), 400, 'n', 'streamed n > 1');
  await expectError(chat({chat_template_kwargs: {foo: true}}), 400, 'chat_template_kwargs.foo', 'template kwarg');
  await expectError(chat({messages: [{role: 'wizard', content: 'x'}]}), 400, 'messages', 'role (router)');
  // Range checks are the router's (INVALID_ARGUMENT → 400, field named).
  await expectError(cmpl({max_tokens: 1000000}), 400, 'max_tokens', 'max_tokens above the limit');
  await expectError(cmpl({temperature: -1}), 400, 'temperature', 'temperature < 0');
  await expectError(cmpl({window: 999}), 400, 'window', 'window above the block size');
  await expectError(cmpl({stream: true, passes: 99}), 400, 'passes', 'streamed passes above the limit');
  const missing = await expectError(cmpl({model: 'no-such-model'}), 404, 'model', 'unknown model');
  assert.equal(missing.code, 'model_not_found');
  assert.ok(missing instanceof OpenAI.NotFoundError);

  // Raw HTTP: malformed JSON, oversized body (413), unknown route, health, metrics.
  const root = baseURL.replace(/\/v1$/, '');
  const post = (body) => fetch(`${baseURL}/completions`, {method: 'POST', headers: {'Content-Type': 'application/json'}, body});
  let res = await post('{"prompt": "x", ');
  assert.equal(res.status, 400);
  assert.match((await res.json()).error.message, /not valid JSON/);
  res = await post(JSON.stringify({prompt: 'x'.repeat(expected.max_body_bytes + 10), max_tokens: 1}));
  assert.equal(res.status, 413);
  assert.match((await res.json()).error.message, /exceeds/);
  res = await post('[1, 2]');
  assert.equal(res.status, 400);
  res = await fetch(`${root}/v1/nothing`);
  assert.equal(res.status, 404);
  assert.ok((await res.json()).error);
  res = await fetch(`${root}/health`);
  assert.equal(res.status, 200);
  res = await fetch(`${root}/metrics`);
  const metrics = await res.text();
  assert.match(metrics, /dedit_http_requests_total\{.*code="400".*\} [1-9]/);
  assert.match(metrics, /dedit_http_requests_total\{.*code="200".*route="\/v1\/chat\/completions".*\}|dedit_http_requests_total\{.*route="\/v1\/chat\/completions".*code="200".*\}/);
}

async function models() {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, model);
  assert.equal(list.data[0].object, 'model');
}

async function abort() {
  const stream = await client.completions.create({
    model, prompt: expected.completion.prompt, max_tokens: expected.abort_max_tokens,
    temperature: 0, ignore_eos: true, stream: true});
  let chunks = 0;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      assert.equal(choice.finish_reason, null, 'finished before the abort');
    }
    if (++chunks === 3) {
      stream.controller.abort();
      break;
    }
  }
  assert.equal(chunks, 3);
  console.log('aborted after 3 chunks');
}

// A non-streamed request aborted while the router generates (its body would
// come only at the end).
async function abortBlocking() {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), expected.abort_after_ms);
  const started = Date.now();
  await assert.rejects(
      client.completions.create(
          {model, prompt: expected.completion.prompt, max_tokens: expected.abort_max_tokens,
           temperature: 0, ignore_eos: true},
          {signal: controller.signal}),
      (e) => e instanceof sdk.APIUserAbortError || /abort/i.test(String(e)),
      'the request was not aborted');
  clearTimeout(timer);
  console.log(`aborted a non-streamed request after ${Date.now() - started} ms`);
}

async function main() {
  const mode = process.argv[2];
  if (mode === 'abort') return abort();
  if (mode === 'abort-blocking') return abortBlocking();
  for (const [name, step] of [['models', models], ['completions', completions], ['chat', chat],
                              ['stop strings', stopStrings], ['errors', errors]]) {
    console.log(`openai sdk: ${name}`);
    await step();
  }
  console.log('openai sdk: all checks passed');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
