// What the fuzz targets share: an invariant check that stops the run with a
// message (libFuzzer then saves the input as a crash reproducer).
#ifndef DEDIT_TESTS_FUZZ_FUZZ_CHECK_H_
#define DEDIT_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

// Aborts when `cond` is false. Unlike assert(), never compiled out.
#define FUZZ_CHECK(cond)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, \
                   __LINE__, #cond);                                  \
      std::abort();                                                   \
    }                                                                 \
  } while (0)

#endif  // DEDIT_TESTS_FUZZ_FUZZ_CHECK_H_
