#!/usr/bin/env node
// Encode throughput of HuggingFace tokenizers (Rust, via the
// @anush008/tokenizers Node binding) on the same corpus and workloads as
// tokenizer_bench.cc; run by run_bench.sh.
//
//   node hf_bench.js TOKENIZER_JSON CORPUS_JSON [MIN_SECONDS]
//
// "cases" awaits encode() one string at a time (one thread, like ours, but
// each call crosses the N-API boundary); "cases (encodeBatch)" lets HF use
// all cores (rayon); "document" encodes the joined corpus as one text.
'use strict';

const fs = require('fs');
const { Tokenizer } = require('@anush008/tokenizers');

async function measure(minSeconds, bytes, pass) {
  const ids = await pass();  // Warm-up, untimed.
  let passes = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  do {
    await pass();
    passes++;
    elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  } while (elapsed < minSeconds);
  return {mbps: bytes * passes / elapsed / 1e6, ids};
}

(async () => {
  const [tokenizerPath, corpusPath, minArg] = process.argv.slice(2);
  const minSeconds = Number(minArg || 3);
  const loadStart = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(tokenizerPath);
  const loadSeconds = Number(process.hrtime.bigint() - loadStart) / 1e9;
  const cases = JSON.parse(fs.readFileSync(corpusPath, 'utf8')).cases.map((c) => c.text);
  const document = cases.join('\n');
  const caseBytes = cases.reduce((n, s) => n + Buffer.byteLength(s), 0);
  const docBytes = Buffer.byteLength(document);

  const sequential = await measure(minSeconds, caseBytes, async () => {
    let ids = 0;
    for (const s of cases) ids += (await tok.encode(s)).getIds().length;
    return ids;
  });
  const batch = await measure(minSeconds, caseBytes, async () => {
    const encodings = await tok.encodeBatch(cases);
    return encodings.reduce((n, e) => n + e.getIds().length, 0);
  });
  const doc = await measure(minSeconds, docBytes, async () =>
    (await tok.encode(document)).getIds().length);
  console.log(
      `HF tokenizers (Node)    load ${loadSeconds.toFixed(2)} s | cases: ${cases.length} strings, ` +
      `${caseBytes} bytes, ${sequential.ids} ids, ${sequential.mbps.toFixed(2)} MB/s ` +
      `(encodeBatch, all cores: ${batch.mbps.toFixed(2)} MB/s) | document: ${docBytes} bytes, ` +
      `${doc.ids} ids, ${doc.mbps.toFixed(2)} MB/s`);
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
