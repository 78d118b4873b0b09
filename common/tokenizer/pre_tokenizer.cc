#include "common/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/regex.h"

namespace dedit {
namespace {

// What Split does with the text its pattern matched (HF's
// SplitDelimiterBehavior).
enum class SplitBehavior {
  kRemoved,             // Drop matches.
  kIsolated,            // Matches and gaps are separate pieces.
  kMergedWithPrevious,  // A match joins the piece before it.
  kMergedWithNext,      // A match joins the piece after it.
  kContiguous,          // Adjacent matches fuse into one piece.
};

struct Range {
  size_t begin;
  size_t end;
  bool is_match;
};

// Covers [0, n) with the matches and the gaps between them, in order; an
// empty subject is one empty gap, as in HF.
void CoverWithMatches(size_t n, const std::vector<Regex::Match>& matches,
                      std::vector<Range>* ranges) {
  ranges->clear();
  if (n == 0) {
    ranges->push_back({0, 0, false});
    return;
  }
  size_t previous_end = 0;
  for (const Regex::Match& m : matches) {
    if (m.begin != previous_end)
      ranges->push_back({previous_end, m.begin, false});
    ranges->push_back({m.begin, m.end, true});
    previous_end = m.end;
  }
  if (previous_end != n) ranges->push_back({previous_end, n, false});
}

// Groups `ranges` into output pieces according to `behavior`.
void ApplyBehavior(SplitBehavior behavior, const std::vector<Range>& ranges,
                   std::vector<Range>* out) {
  out->clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      *out = ranges;
      return;
    case SplitBehavior::kRemoved:
      for (const Range& r : ranges) {
        if (!r.is_match) out->push_back(r);
      }
      return;
    case SplitBehavior::kMergedWithPrevious:
      for (const Range& r : ranges) {
        if (r.is_match && !previous_match && !out->empty()) {
          out->back().end = r.end;
        } else {
          out->push_back(r);
        }
        previous_match = r.is_match;
      }
      return;
    case SplitBehavior::kMergedWithNext:
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        if (it->is_match && !previous_match && !out->empty()) {
          out->back().begin = it->begin;
        } else {
          out->push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(out->begin(), out->end());
      return;
    case SplitBehavior::kContiguous:
      for (const Range& r : ranges) {
        if (r.is_match == previous_match && !out->empty()) {
          out->back().end = r.end;
        } else {
          out->push_back(r);
        }
        previous_match = r.is_match;
      }
      return;
  }
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, SplitBehavior behavior,
                    bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}

  absl::Status PreTokenize(std::vector<std::string>* pieces) const override {
    std::vector<std::string> out;
    out.reserve(pieces->size() * 2);
    std::vector<Regex::Match> matches;
    std::vector<Range> ranges;
    std::vector<Range> grouped;
    for (const std::string& piece : *pieces) {
      RETURN_IF_ERROR(regex_->FindAll(piece, &matches));
      CoverWithMatches(piece.size(), matches, &ranges);
      if (invert_) {
        for (Range& r : ranges) r.is_match = !r.is_match;
      }
      ApplyBehavior(behavior_, ranges, &grouped);
      for (const Range& r : grouped) {
        if (r.end > r.begin) out.emplace_back(piece, r.begin, r.end - r.begin);
      }
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

  absl::Status PreTokenize(std::vector<std::string>* pieces) const override {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
    std::vector<std::string> out;
    out.reserve(pieces->size());
    std::vector<Regex::Match> matches;
    std::string prefixed;
    for (const std::string& piece : *pieces) {
      absl::string_view text = piece;
      if (add_prefix_space_ && (text.empty() || text[0] != ' ')) {
        prefixed.assign(" ");
        prefixed.append(piece);
        text = prefixed;
      }
      if (regex_ == nullptr) {
        if (text.empty()) continue;
        out.emplace_back();
        alphabet.AppendEncoded(text, &out.back());
        continue;
      }
      RETURN_IF_ERROR(regex_->FindAll(text, &matches));
      // Isolated: gaps between matches are pieces too.
      size_t previous_end = 0;
      auto emit = [&](size_t begin, size_t end) {
        if (end <= begin) return;
        out.emplace_back();
        alphabet.AppendEncoded(text.substr(begin, end - begin), &out.back());
      };
      for (const Regex::Match& m : matches) {
        emit(previous_end, m.begin);
        emit(m.begin, m.end);
        previous_end = m.end;
      }
      emit(previous_end, text.size());
    }
    *pieces = std::move(out);
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // Null when use_regex is false.
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(
      std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}

  absl::Status PreTokenize(std::vector<std::string>* pieces) const override {
    for (const auto& step : steps_) RETURN_IF_ERROR(step->PreTokenize(pieces));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// A PCRE2 pattern that matches `literal` verbatim: every ASCII punctuation
// character is escaped (PCRE2 treats "\<punct>" as the literal character);
// letters, digits and non-ASCII characters stand for themselves.
std::string EscapeLiteral(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !absl::ascii_isalnum(u)) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<SplitBehavior> ParseBehavior(const nlohmann::json& spec,
                                            const std::string& where) {
  ASSIGN_OR_RETURN(std::string name,
                   JsonRequiredString(spec, "behavior", where));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat(where, ".behavior: unknown split behavior '", name, "'"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParseSplit(
    const nlohmann::json& spec, const std::string& where) {
  auto pattern = spec.find("pattern");
  if (pattern == spec.end() || !pattern->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".pattern: missing or not an object"));
  }
  std::string regex_text;
  auto regex_it = pattern->find("Regex");
  auto string_it = pattern->find("String");
  if (regex_it != pattern->end() && regex_it->is_string()) {
    regex_text = regex_it->get<std::string>();
  } else if (string_it != pattern->end() && string_it->is_string()) {
    // HF treats an empty literal as "never matches".
    const std::string literal = string_it->get<std::string>();
    regex_text = literal.empty() ? "(?!)" : EscapeLiteral(literal);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ".pattern: expected {\"Regex\": string} or {\"String\": string}"));
  }
  auto compiled = Regex::Compile(regex_text);
  if (!compiled.ok()) return Annotate(compiled.status(), where + ".pattern");
  ASSIGN_OR_RETURN(SplitBehavior behavior, ParseBehavior(spec, where));
  ASSIGN_OR_RETURN(bool invert, JsonOptionalBool(spec, "invert", false, where));
  return std::unique_ptr<PreTokenizer>(
      new SplitPreTokenizer(*std::move(compiled), behavior, invert));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParseByteLevel(
    const nlohmann::json& spec, const std::string& where) {
  // Defaults are those of HF's ByteLevel::default().
  ASSIGN_OR_RETURN(bool add_prefix_space,
                   JsonOptionalBool(spec, "add_prefix_space", true, where));
  ASSIGN_OR_RETURN(bool use_regex,
                   JsonOptionalBool(spec, "use_regex", true, where));
  std::unique_ptr<Regex> regex;
  if (use_regex) {
    ASSIGN_OR_RETURN(regex, Regex::Compile(kGpt2PreTokenizerPattern));
  }
  return std::unique_ptr<PreTokenizer>(
      new ByteLevelPreTokenizer(add_prefix_space, std::move(regex)));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParseAt(
    const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!spec.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": expected an object or null, got ", spec.type_name()));
  }
  ASSIGN_OR_RETURN(std::string type, JsonRequiredString(spec, "type", where));
  if (type == "Split") return ParseSplit(spec, where);
  if (type == "ByteLevel") return ParseByteLevel(spec, where);
  if (type == "Sequence") {
    auto list = spec.find("pretokenizers");
    if (list == spec.end() || !list->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".pretokenizers: missing or not an array"));
    }
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<PreTokenizer> step,
          ParseAt((*list)[i], absl::StrCat(where, ".pretokenizers[", i, "]")));
      if (step != nullptr) steps.push_back(std::move(step));
    }
    return std::unique_ptr<PreTokenizer>(
        new SequencePreTokenizer(std::move(steps)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ".type: unsupported pre-tokenizer '", type,
                   "' (supported: Split, ByteLevel, Sequence)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(
    const nlohmann::json& spec) {
  return ParseAt(spec, "pre_tokenizer");
}

}  // namespace dedit
