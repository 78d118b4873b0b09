// Fuzzes encode/decode on a loaded tokenizer (the tiny_pairs fixture: NFC,
// a Split regex, ByteLevel, added tokens with every flag). The first input
// byte selects options, the rest is text, and is also read as token ids.
// Invariants: invalid UTF-8 is an error; otherwise every id is in the
// vocabulary, Decode succeeds and returns valid UTF-8, and the streaming
// detokenizer's output equals Decode, for encoded ids and arbitrary ones.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/tokenizer/streaming_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

const dedit::Tokenizer& LoadedTokenizer() {
  static const dedit::Tokenizer* const tokenizer = [] {
    auto loaded = dedit::Tokenizer::FromFile(DEDIT_FUZZ_TOKENIZER_JSON);
    FUZZ_CHECK(loaded.ok());
    return loaded->release();
  }();
  return *tokenizer;
}

void CheckStreamingEqualsDecode(const dedit::Tokenizer& tok,
                                const std::vector<int32_t>& ids,
                                dedit::DecodeOptions options) {
  auto decoded = tok.Decode(ids, options);
  dedit::StreamingDetokenizer stream(&tok, options);
  std::string streamed;
  bool all_known = true;
  for (int32_t id : ids) {
    auto piece = stream.Push(id);
    if (!piece.ok()) {
      all_known = false;
      break;
    }
    streamed += *piece;
  }
  FUZZ_CHECK(decoded.ok() == all_known);
  if (!decoded.ok()) return;
  streamed += stream.Flush();
  FUZZ_CHECK(streamed == *decoded);
  FUZZ_CHECK(dedit::ValidateUtf8(*decoded).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const dedit::Tokenizer& tok = LoadedTokenizer();
  dedit::EncodeOptions encode;
  encode.split_special_tokens = data[0] & 1;
  dedit::DecodeOptions decode;
  decode.skip_special_tokens = data[0] & 2;
  const absl::string_view text(reinterpret_cast<const char*>(data + 1),
                               size - 1);

  auto ids = tok.Encode(text, encode);
  if (!dedit::ValidateUtf8(text).ok()) {
    FUZZ_CHECK(!ids.ok());
  } else {
    FUZZ_CHECK(ids.ok());
    for (int32_t id : *ids) {
      FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
      FUZZ_CHECK(tok.TokenBytes(id).ok());
    }
    CheckStreamingEqualsDecode(tok, *ids, decode);
  }

  // The same bytes as 16-bit ids, a few past the vocabulary.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 1 < text.size(); i += 2) {
    const int32_t v = static_cast<uint8_t>(text[i]) |
                      (static_cast<uint8_t>(text[i + 1]) << 8);
    raw.push_back(v % (tok.vocab_size() + 4));
  }
  CheckStreamingEqualsDecode(tok, raw, decode);
  return 0;
}
