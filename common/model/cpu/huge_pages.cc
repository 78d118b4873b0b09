#include "common/model/cpu/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

namespace dedit {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t MappedBytes(size_t bytes) {
  return (bytes + kHugePage - 1) / kHugePage * kHugePage;
}

}  // namespace

void* AllocateLargeBytes(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes < kHugePageMin) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p != nullptr) std::memset(p, 0, bytes);
    return p;
  }
  // Map one huge page more than needed, keep the 2 MB-aligned part and
  // give back the rest, so the kept range can be backed by huge pages.
  const size_t mapped = MappedBytes(bytes);
  void* raw = mmap(nullptr, mapped + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = aligned + mapped;
  const uintptr_t raw_end = start + mapped + kHugePage;
  if (raw_end > end) munmap(reinterpret_cast<void*>(end), raw_end - end);
#ifdef MADV_HUGEPAGE
  // Advice only: without huge pages the memory works the same, slower.
  madvise(reinterpret_cast<void*>(aligned), mapped, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<void*>(aligned);  // anonymous memory is zeroed
}

void FreeLargeBytes(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kHugePageMin) {
    std::free(p);
    return;
  }
  munmap(p, MappedBytes(bytes));
}

}  // namespace dedit
