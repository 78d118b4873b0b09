// Fuzzes SafetensorsFile::Parse on whole files. Invariants for an accepted
// file: every tensor view lies inside the input, has the byte size its dtype
// and shape need, and its bytes can be read (ASan flags any over-read).
#include <cstddef>
#include <cstdint>

#include "common/base/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = dedit::SafetensorsFile::Parse(data, size, "fuzz.safetensors");
  if (!file.ok()) {
    FUZZ_CHECK(!file.status().message().empty());
    return 0;
  }
  uint8_t sum = 0;
  for (const std::string& name : (*file)->TensorNames()) {
    const dedit::TensorView* view = (*file)->Find(name);
    FUZZ_CHECK(view != nullptr);
    FUZZ_CHECK(view->nbytes == 0 || (view->data >= data &&
                                     view->data + view->nbytes <= data + size));
    FUZZ_CHECK(view->numel() >= 0);
    FUZZ_CHECK(static_cast<uint64_t>(view->numel()) *
                   dedit::DTypeSize(view->dtype) ==
               view->nbytes);
    for (size_t i = 0; i < view->nbytes; ++i) sum ^= view->data[i];
  }
  volatile uint8_t sink = sum;
  (void)sink;
  return 0;
}
