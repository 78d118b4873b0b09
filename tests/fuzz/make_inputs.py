#!/usr/bin/env python3
"""Regenerates the committed seed corpora (corpus/<target>/), stored
reproducers (regressions/<target>/) and dictionaries (<target>.dict) of the
fuzz targets. Run from anywhere;
writes next to this file. Reproducers are the hostile inputs of the
hostile-folder and hostile-tokenizer regression tests, scaled down to just
past each limit (the GoogleTest suites build the full-size ones in
memory)."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(kind, target, name, data):
    d = os.path.join(HERE, kind, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors(header, data=b""):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def nested(depth, inner="0"):
    return "[" * depth + inner + "]" * depth


for kind in ("corpus", "regressions"):
    shutil.rmtree(os.path.join(HERE, kind), ignore_errors=True)

# --- safetensors
write("corpus", "safetensors", "two_tensors", safetensors(
    {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
     "b": {"dtype": "U8", "shape": [1, 3], "data_offsets": [8, 11]},
     "__metadata__": {"format": "pt"}}, bytes(range(11))))
write("corpus", "safetensors", "all_dtypes", safetensors(
    {f"t{i}": {"dtype": d, "shape": [1], "data_offsets": [i * 8, i * 8 + s]}
     for i, (d, s) in enumerate([("F64", 8), ("F16", 2), ("BF16", 2),
                                  ("I64", 8), ("I32", 4), ("I16", 2),
                                  ("I8", 1), ("BOOL", 1)])}, bytes(64)))
write("corpus", "safetensors", "empty_tensor", safetensors(
    {"e": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}}))
write("regressions", "safetensors", "nested_header", safetensors(
    ("{\"t\":" + nested(2000) + "}").encode()))
write("regressions", "safetensors", "nested_metadata", safetensors(
    ("{\"__metadata__\":{\"k\":" + nested(2000) + "}}").encode()))
write("regressions", "safetensors", "nested_shape", safetensors(
    b'{"t":{"dtype":"U8","shape":[[1]],"data_offsets":[0,1]}}', b"x"))
write("regressions", "safetensors", "header_length_max",
      struct.pack("<Q", 2**64 - 1) + b"{}")
write("regressions", "safetensors", "overlap", safetensors(
    {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
     "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"xyz"))

# --- shard index (the fuzzer writes a.safetensors {x, y}, b.safetensors {z})
write("corpus", "shard_index", "valid", json.dumps(
    {"metadata": {"total_size": 7},
     "weight_map": {"x": "a.safetensors", "y": "a.safetensors",
                    "z": "b.safetensors"}}))
write("corpus", "shard_index", "missing_tensor", json.dumps(
    {"weight_map": {"w": "a.safetensors"}}))
write("regressions", "shard_index", "nested_metadata",
      '{"metadata": ' + nested(2000) + ', "weight_map": {}}')
write("regressions", "shard_index", "path_traversal", json.dumps(
    {"weight_map": {"x": "../a.safetensors"}}))
write("regressions", "shard_index", "shard_is_directory", json.dumps(
    {"weight_map": {"x": "."}}))

# --- both config kinds
for kind in ("target", "drafter"):
    with open(os.path.join(ROOT, "checkpoints/tiny", kind, "config.json")) as f:
        write("corpus", "model_config", "tiny_" + kind, f.read())
drafter = json.load(open(os.path.join(ROOT, "checkpoints/tiny/drafter/config.json")))
target = json.load(open(os.path.join(ROOT, "checkpoints/tiny/target/config.json")))


def with_fields(base, **fields):
    c = dict(base)
    c.update(fields)
    return json.dumps(c)


huge = dict(drafter)
huge["num_hidden_layers"] = huge["num_target_layers"] = 2**31 - 1
del huge["dflash_config"]["target_layer_ids"]
write("regressions", "model_config", "huge_layer_counts", json.dumps(huge))
write("regressions", "model_config", "eos_negative", with_fields(target, eos_token_id=-5))
write("regressions", "model_config", "eos_wraps", with_fields(target, eos_token_id=2**32 + 1))
write("regressions", "model_config", "numeric_dtype", with_fields(target, torch_dtype=16))
write("regressions", "model_config", "eos_list_too_long",
      with_fields(target, eos_token_id=[0] * 1025))
scalar_ids = json.loads(json.dumps(drafter))
scalar_ids["dflash_config"]["target_layer_ids"] = -5
write("regressions", "model_config", "target_layer_ids_negative", json.dumps(scalar_ids))
scalar_ids["dflash_config"]["target_layer_ids"] = 2**32 + 1
write("regressions", "model_config", "target_layer_ids_wraps", json.dumps(scalar_ids))
write("regressions", "model_config", "nested_value",
      with_fields(target, rope_scaling="@")[:-1].replace('"@"', nested(2000)) + "}")

# --- tokenizer.json
testdata = os.path.join(ROOT, "tests/tokenizer/testdata")
for name in sorted(os.listdir(testdata)):
    with open(os.path.join(testdata, name)) as f:
        write("corpus", "tokenizer_load", name, f.read())
tiny = json.load(open(os.path.join(testdata, "tiny_pairs.json")))


def tokenizer_with(field, raw):
    doc = dict(tiny)
    doc[field] = "@HOLE@"
    return json.dumps(doc).replace('"@HOLE@"', raw)


write("regressions", "tokenizer_load", "split_backslash_c", tokenizer_with(
    "pre_tokenizer", json.dumps({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "a+\\C"}, "behavior": "Isolated"},
        {"type": "Split", "pattern": {"Regex": "\\p{L}"}, "behavior": "Isolated"},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]})))


def sequence(depth, key, leaf):
    return ('{"type":"Sequence","%s":[' % key) * depth + leaf + "]}" * depth


write("regressions", "tokenizer_load", "deep_normalizers", tokenizer_with(
    "normalizer", sequence(200, "normalizers", '{"type":"NFC"}')))
write("regressions", "tokenizer_load", "deep_pretokenizers", tokenizer_with(
    "pre_tokenizer", sequence(200, "pretokenizers", '{"type":"ByteLevel"}')))
model = dict(tiny["model"])
model["dropout"] = "@HOLE@"
write("regressions", "tokenizer_load", "deep_dropout", tokenizer_with(
    "model", json.dumps(model).replace('"@HOLE@"', nested(2000))))
long_token = json.loads(json.dumps(tiny))
long_token["added_tokens"][0]["content"] = "a" * 10000
write("regressions", "tokenizer_load", "long_added_token", json.dumps(long_token))

# --- encode/decode on the tiny_pairs tokenizer (first byte: option bits)
for i, text in enumerate([b"\x00Hello <eos> world, it's 2024!",
                          "\x01café<cls> naïve [mask] x".encode(),
                          "\x02 a <sep>  b\n\n\t\u4f60\u597d \U0001F600".encode(),
                          b"\x03[mask][mask] <eos><eos>"]):
    write("corpus", "tokenizer_encode", "text%d" % i, text)
write("regressions", "tokenizer_encode", "cut_character", b"\x00ab\xe2\x82")
write("regressions", "tokenizer_encode", "lone_continuation", b"\x02\x80\x80")

# --- regex: pattern NUL subject
gpt2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
for i, (pattern, subject) in enumerate([
        (r"\p{L}+", "Hello wörld"),
        (gpt2, "It's 12 \u4f60\u597d  x!"),
        (r"(?i:'s|'t)|\s*[\r\n]+", "IT'S\r\n\nok"),
        (r"", "abc"),
        (r"(a|b)*?c", "ababc")]):
    write("corpus", "regex", "seed%d" % i, pattern.encode() + b"\0" + subject.encode())
write("regressions", "regex", "backslash_c", b"a+\\C\0aaa\xe2\x82\xac")
write("regressions", "regex", "subject_cut_in_character", b"\\p{L}\0ab\xe2\x82")
write("regressions", "regex", "catastrophic", b"(a+)+b\0" + b"a" * 40)

# --- dictionaries (<target>.dict)

def lit(b):
    """libFuzzer dictionary literal for the bytes b."""
    out = []
    for c in b:
        if c == 0x5c: out.append("\\\\")
        elif c == 0x22: out.append('\\"')
        elif 0x20 <= c < 0x7f: out.append(chr(c))
        else: out.append("\\x%02x" % c)
    return '"' + "".join(out) + '"'

def dict_file(name, comment, entries):
    with open(os.path.join(HERE, name + ".dict"), "w") as f:
        f.write("# " + comment + " (libFuzzer -dict; regenerate with make_inputs.py)\n")
        for e in entries:
            f.write(lit(e.encode() if isinstance(e, str) else e) + "\n")

json_syntax = ["{", "}", "[", "]", ":", ",", '"', "null", "true", "false", "-1", "0",
               "4294967297", "18446744073709551616", "1e309", "-0.0", "\\u0000",
               "\\ud800", "\\\\", "\u00e9", b"\xe2\x82", "[[[[[[[[", "]]]]]]]]"]
def keys(*ks): return ['"%s"' % k for k in ks]

dict_file("safetensors", "safetensors header keys and values", json_syntax + keys(
    "dtype", "shape", "data_offsets", "__metadata__", "F64", "F32", "F16", "BF16",
    "I64", "I32", "I16", "I8", "U8", "BOOL", "format", "pt") +
    [b"\x08\x00\x00\x00\x00\x00\x00\x00", b"\xff\xff\xff\xff\xff\xff\xff\xff"])
dict_file("shard_index", "model.safetensors.index.json keys", json_syntax + keys(
    "weight_map", "metadata", "total_size", "a.safetensors", "b.safetensors",
    "x", "y", "z", "../a.safetensors", "/", "."))
dict_file("model_config", "config.json keys", json_syntax + keys(
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
    "rope_theta", "rope_parameters", "max_position_embeddings",
    "tie_word_embeddings", "torch_dtype", "dtype", "bos_token_id", "eos_token_id",
    "block_size", "num_target_layers", "dflash_config", "mask_token_id",
    "target_layer_ids", "dedit_config", "num_passes", "causal_editor",
    "bfloat16", "float16", "float32") + ["1024", "1025", "2147483647"])
dict_file("tokenizer_load", "tokenizer.json keys and values", json_syntax + keys(
    "model", "type", "BPE", "vocab", "merges", "unk_token", "fuse_unk",
    "ignore_merges", "dropout", "byte_fallback", "normalizer", "normalizers",
    "pre_tokenizer", "pretokenizers", "Sequence", "Split", "ByteLevel", "NFC",
    "NFD", "NFKC", "NFKD", "pattern", "Regex", "String", "behavior", "Isolated",
    "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous", "invert",
    "add_prefix_space", "use_regex", "decoder", "post_processor", "added_tokens",
    "id", "content", "special", "single_word", "lstrip", "rstrip", "normalized") +
    ["\\\\p{L}", "\\\\p{N}", "\\\\s+", "(?!\\\\S)", "(?i:", "\\\\C", "[^", "+?"])
dict_file("tokenizer_encode", "text pieces for the tiny_pairs tokenizer",
    ["<eos>", "<sep>", "[mask]", "caf\u00e9<cls>", "<cls>", " ", "\n", "\t", "'s",
     "e\u0301", "\u4f60", "\U0001F600", "\u2028", "\u00a0", "\u3000", b"\xe2\x82"])
dict_file("regex", "PCRE2 pattern pieces; NUL separates pattern and subject",
    [b"\x00", "\\p{L}", "\\p{N}", "\\s", "\\S", "\\w", "\\C", "\\X", "\\R", "(?i:",
     "(?!", "(?<=", "(?=", "(*UTF)", "(*LIMIT_MATCH=1)", "[^", "]", "+", "*?",
     "{2,}", "|", ".", "\u20ac", "\u0301", b"\xe2\x82"])

print("wrote", HERE)
