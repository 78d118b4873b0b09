// Helpers shared by the tokenizer tests: paths of the committed test data,
// and the Qwen3 tokenizer that the CTest fixture fetched (see
// fetch_tokenizer.sh and CMakeLists.txt).
#ifndef DEDIT_TESTS_TOKENIZER_TEST_UTIL_H_
#define DEDIT_TESTS_TOKENIZER_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/tokenizer/json_util.h"
#include "common/tokenizer/tokenizer.h"

namespace dedit {
namespace testing_util {

// tests/tokenizer in the source tree (compile definition).
inline std::string TestDir() { return DEDIT_TOKENIZER_TEST_DIR; }

inline std::string TestDataPath(const std::string& name) {
  return TestDir() + "/testdata/" + name;
}

// Parses a committed JSON file; fails the test on error.
inline nlohmann::json LoadJsonOrDie(const std::string& path) {
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return nlohmann::json();
  auto doc = ParseJson(*text, path);
  EXPECT_TRUE(doc.ok()) << doc.status();
  return doc.ok() ? *doc : nlohmann::json();
}

// Folder holding Qwen3's tokenizer.json and tokenizer_config.json, from
// the environment that CTest sets; empty when run outside CTest.
inline std::string Qwen3Dir() {
  const char* dir = std::getenv("DEDIT_QWEN3_TOKENIZER_DIR");
  return dir == nullptr ? std::string() : std::string(dir);
}

// Loaded once per process; null (with a test failure) if loading fails.
inline const Tokenizer* Qwen3Tokenizer() {
  static const Tokenizer* const tokenizer = []() -> const Tokenizer* {
    auto loaded = Tokenizer::FromFile(Qwen3Dir() + "/tokenizer.json");
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status();
      return nullptr;
    }
    return loaded->release();
  }();
  return tokenizer;
}

// Skips the test when the Qwen3 tokenizer was not provided (a plain run of
// the binary); under CTest the fixture always provides it.
#define DEDIT_REQUIRE_QWEN3()                                             \
  do {                                                                    \
    if (::dedit::testing_util::Qwen3Dir().empty()) {                      \
      GTEST_SKIP() << "DEDIT_QWEN3_TOKENIZER_DIR not set; run via ctest"; \
    }                                                                     \
  } while (0)

}  // namespace testing_util
}  // namespace dedit

#endif  // DEDIT_TESTS_TOKENIZER_TEST_UTIL_H_
