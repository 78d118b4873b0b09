// Zero-filled arrays for large weights that a forward streams from memory
// (the CPU weight panels, common/model/cpu/cpu_panels.h), on 2 MB pages where
// the kernel gives them.
//
// Debian's kernel runs transparent huge pages in `madvise` mode, so a plain
// allocation maps 4 KB pages: a decode step of a 300 MB model then walks
// ~75,000 page translations, and the CPU's stream prefetchers stop at
// every 4 KB boundary. A mapping aligned to 2 MB and marked
// MADV_HUGEPAGE gets 2 MB pages (docs/log/2026-12-06-bench-notebook.md, "The
// production regime"). Small arrays stay on the heap: a huge page would waste
// most of itself on them.
#ifndef DEDIT_MODEL_HUGE_PAGES_H_
#define DEDIT_MODEL_HUGE_PAGES_H_

#include <cstddef>
#include <cstdint>

namespace dedit {

// `bytes` of zeroed memory, 64-byte aligned; from `bytes` >= kHugePageMin
// a 2 MB-aligned mapping advised to use huge pages. Null when out of
// memory. Free with FreeLargeBytes(p, bytes).
void* AllocateLargeBytes(size_t bytes);
void FreeLargeBytes(void* p, size_t bytes);
inline constexpr size_t kHugePageMin = size_t{2} << 20;

template <typename T>
class LargeArray {
 public:
  LargeArray() = default;
  explicit LargeArray(size_t n)
      : data_(static_cast<T*>(AllocateLargeBytes(n * sizeof(T)))),
        size_(data_ == nullptr ? 0 : n) {}
  ~LargeArray() { FreeLargeBytes(data_, size_ * sizeof(T)); }
  LargeArray(const LargeArray&) = delete;
  LargeArray& operator=(const LargeArray&) = delete;
  LargeArray(LargeArray&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  LargeArray& operator=(LargeArray&& o) noexcept {
    if (this != &o) {
      FreeLargeBytes(data_, size_ * sizeof(T));
      data_ = o.data_;
      size_ = o.size_;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dedit

#endif  // DEDIT_MODEL_HUGE_PAGES_H_
