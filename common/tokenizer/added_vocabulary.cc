#include "common/tokenizer/added_vocabulary.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <bitset>
#include <utility>

#include "common/tokenizer/utf8.h"

namespace dedit {
namespace {

// HF decides single_word / lstrip / rstrip with Rust's regex classes \w and
// \s, which are the Unicode word characters and White_Space.
bool IsWordChar(char32_t c) {
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC)) return true;
  if (u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  const int8_t type = u_charType(c);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION;
}

bool IsWhitespace(char32_t c) { return u_isUWhiteSpace(c); }

// Start of the last character of text[0, end). REQUIRES: end > 0.
size_t LastCharStart(absl::string_view text, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) --i;
  return i;
}

char32_t CharAt(absl::string_view text, size_t pos, size_t* length) {
  const Utf8Sequence seq = DecodeUtf8Sequence(text.substr(pos));
  *length = seq.length;
  return seq.kind == Utf8SequenceKind::kValid ? seq.code_point : 0xFFFD;
}

}  // namespace

// A byte trie over the patterns of one pass. Children are kept as sorted
// (byte, node) lists: tokenizers may carry thousands of added tokens, and a
// 256-way table per node would waste memory.
struct AddedVocabulary::Trie {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int token = -1;  // Index into tokens_ of the pattern ending here.
  };
  std::vector<Node> nodes{Node{}};
  std::bitset<256> first_bytes;

  void Insert(absl::string_view pattern, int token) {
    int32_t node = 0;
    for (char ch : pattern) {
      const uint8_t b = static_cast<uint8_t>(ch);
      auto& children = nodes[node].children;
      auto it = std::lower_bound(children.begin(), children.end(), b,
                                 [](const std::pair<uint8_t, int32_t>& c,
                                    uint8_t v) { return c.first < v; });
      if (it != children.end() && it->first == b) {
        node = it->second;
        continue;
      }
      const int32_t child = static_cast<int32_t>(nodes.size());
      children.insert(it, {b, child});
      nodes.push_back(Node{});
      node = child;
    }
    // Two tokens with the same content: the first one listed wins.
    if (nodes[node].token < 0) nodes[node].token = token;
    first_bytes.set(static_cast<uint8_t>(pattern[0]));
  }

  int32_t Child(int32_t node, uint8_t b) const {
    const auto& children = nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), b,
                               [](const std::pair<uint8_t, int32_t>& c,
                                  uint8_t v) { return c.first < v; });
    return (it != children.end() && it->first == b) ? it->second : -1;
  }
};

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens,
                                 std::vector<std::string> normalized_contents)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const Pass pass = tokens_[i].normalized ? kNormalizedText : kRawText;
    const std::string& pattern =
        tokens_[i].normalized && i < normalized_contents.size()
            ? normalized_contents[i]
            : tokens_[i].content;
    if (pattern.empty()) continue;
    if (tries_[pass] == nullptr) tries_[pass] = std::make_unique<Trie>();
    tries_[pass]->Insert(pattern, static_cast<int>(i));
  }
}

AddedVocabulary::~AddedVocabulary() = default;

bool AddedVocabulary::HasTokensFor(Pass pass) const {
  return tries_[pass] != nullptr;
}

int AddedVocabulary::LongestMatchAt(absl::string_view text, size_t pos,
                                    Pass pass, size_t* length) const {
  const Trie& trie = *tries_[pass];
  int best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = trie.Child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (trie.nodes[node].token >= 0) {
      best = trie.nodes[node].token;
      *length = i + 1 - pos;
    }
  }
  return best;
}

void AddedVocabulary::Split(absl::string_view text, Pass pass,
                            bool split_special_tokens,
                            std::vector<Segment>* segments) const {
  segments->clear();
  const size_t n = text.size();
  if (n == 0) return;
  if (tries_[pass] == nullptr) {
    segments->push_back({0, n, -1});
    return;
  }
  const Trie& trie = *tries_[pass];
  size_t text_start = 0;  // End of the last accepted token.
  size_t pos = 0;
  while (pos < n) {
    if (!trie.first_bytes.test(static_cast<uint8_t>(text[pos]))) {
      ++pos;
      continue;
    }
    size_t match_length = 0;
    const int index = LongestMatchAt(text, pos, pass, &match_length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos;
    size_t stop = pos + match_length;
    // A skipped match still consumes its text, as in HF's matcher.
    if (split_special_tokens && token.special) {
      pos = stop;
      continue;
    }
    if (token.single_word) {
      size_t length = 0;
      const bool word_before =
          start > 0 &&
          IsWordChar(CharAt(text, LastCharStart(text, start), &length));
      const bool word_after =
          stop < n && IsWordChar(CharAt(text, stop, &length));
      if (word_before || word_after) {
        pos = stop;
        continue;
      }
    }
    if (token.lstrip) {
      while (start > text_start) {
        const size_t prev = LastCharStart(text, start);
        size_t length = 0;
        if (!IsWhitespace(CharAt(text, prev, &length))) break;
        start = prev;
      }
    }
    if (token.rstrip) {
      while (stop < n) {
        size_t length = 0;
        if (!IsWhitespace(CharAt(text, stop, &length))) break;
        stop += length;
      }
    }
    if (start > text_start) segments->push_back({text_start, start, -1});
    segments->push_back({start, stop, token.id});
    text_start = stop;
    pos = stop;
  }
  if (text_start < n) segments->push_back({text_start, n, -1});
}

}  // namespace dedit
