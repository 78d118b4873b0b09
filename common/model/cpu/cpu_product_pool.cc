#include "common/model/cpu/cpu_product_pool.h"

#include <c10/core/InferenceMode.h>

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"

namespace dedit {
namespace {

std::atomic<int> product_threads{1};

// How long a helper polls for its next part before it sleeps: longer than
// the gaps between a forward's products (norms, attention: tens of
// microseconds), short enough that an idle model thread's helpers sleep.
constexpr std::chrono::microseconds kPoll(200);

}  // namespace

void SetCpuProductThreads(int threads) {
  product_threads.store(threads < 1 ? 1 : threads);
}

int CpuProductThreads() { return product_threads.load(); }

absl::Status SetCpuProductThreadsFlag(int threads) {
  if (threads < 1 || threads > kMaxCpuProductThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--product_threads must be 1..", kMaxCpuProductThreads,
                     ", got ", threads));
  }
  SetCpuProductThreads(threads);
  return absl::OkStatus();
}

CpuProductPool* CpuProductPool::ForThisThread() {
  thread_local std::unique_ptr<CpuProductPool> pool;
  const int threads = CpuProductThreads();
  if (threads <= 1) return nullptr;
  if (pool == nullptr || pool->threads() != threads) {
    pool.reset();  // joins the old helpers first
    pool = std::make_unique<CpuProductPool>(threads - 1);
  }
  return pool.get();
}

CpuProductPool::CpuProductPool(int helpers) {
  for (int i = 0; i < helpers; ++i) {
    helpers_.emplace_back([this] { HelperLoop(); });
  }
}

CpuProductPool::~CpuProductPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_.store(true);
    wake_.SignalAll();
  }
  for (std::thread& t : helpers_) t.join();
}

void CpuProductPool::Work(Job* job) {
  for (;;) {
    const int i = job->next.fetch_add(1);
    if (i >= job->parts) return;
    try {
      (*job->part)(i);
    } catch (...) {
      absl::MutexLock lock(&job->error_mu);
      if (!job->error) job->error = std::current_exception();
    }
    job->done.fetch_add(1, std::memory_order_release);
  }
}

void CpuProductPool::HelperLoop() {
  // The parts write into inference tensors (the model thread's outputs).
  c10::InferenceMode inference_mode;
  uint64_t seen = generation_.load();
  for (;;) {
    uint64_t generation = generation_.load();
    const auto until = std::chrono::steady_clock::now() + kPoll;
    while (generation == seen && !stop_.load() &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
      generation = generation_.load();
    }
    if (generation == seen && !stop_.load()) {
      absl::MutexLock lock(&mu_);
      // Counted before the generation is read again: Run reads sleepers_
      // after moving the generation on, so one of the two sees the other.
      sleepers_.fetch_add(1);
      while (generation_.load() == seen && !stop_.load()) wake_.Wait(&mu_);
      sleepers_.fetch_sub(1);
      generation = generation_.load();
    }
    if (stop_.load()) return;
    seen = generation;
    // Taken before the job is read: Run clears job_ and then waits until
    // no helper holds it, so a job is never read after Run returned.
    active_.fetch_add(1);
    Job* job = job_.load();
    if (job != nullptr) Work(job);
    active_.fetch_sub(1);
  }
}

void CpuProductPool::Run(int parts, const std::function<void(int)>& part) {
  runs_.fetch_add(1);
  Job job;
  job.part = &part;
  job.parts = parts;
  job_.store(&job);
  generation_.fetch_add(1);
  if (sleepers_.load() > 0) {
    absl::MutexLock lock(&mu_);
    wake_.SignalAll();
  }
  Work(&job);
  while (job.done.load(std::memory_order_acquire) < parts) {
    std::this_thread::yield();
  }
  job_.store(nullptr);
  while (active_.load() > 0) std::this_thread::yield();
  absl::MutexLock lock(&job.error_mu);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace dedit
