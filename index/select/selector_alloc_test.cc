// Selector::Select allocates nothing per step once its buffers have grown:
// the hot path of every decode step reuses the selector's scratch and the
// caller's SelectResult. Counted with replaced global operator new in this
// test binary only.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "index/context_index.h"
#include "index/select/selector.h"
#include "tests/testutil/status_matchers.h"

namespace {
// Global, not per thread: SelectBatch's worker threads count too.
std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};
// Called for every counted allocation: a place for a debugger's breakpoint.
[[gnu::noinline]] void CountedAllocation() {
  allocations.fetch_add(1, std::memory_order_relaxed);
  asm volatile("");
}
}  // namespace

void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) CountedAllocation();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace kvtier::index {
namespace {

struct Case {
  const char* name;
  ScorerKind scorer;
  bool window_budget;  // mass on an uncalibrated context: the window path
};

// Contexts stepping as an engine drives them: one Select (or one
// SelectBatch over all of them) per step, the same kind of request every
// step, new anchors every step. Steps 1..kWarm grow the buffers; the next
// steps must not allocate. The window path of an uncalibrated mass context
// starts once select.window_steps (64 shipped, the library default) steps
// have run, so the warm-up spans two windows.
int64_t AllocationsOverSteps(const Case& c, int contexts, int32_t threads) {
  constexpr int32_t kDim = 64;
  constexpr int64_t kBlocks = 4096;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<std::unique_ptr<ContextIndex>> ctxs;
  for (int i = 0; i < contexts; ++i) {
    std::vector<float> vectors(kBlocks * kDim);
    for (float& x : vectors) x = normal(rng);
    TreeOptions t;
    t.dim = kDim;
    auto ctx = ContextIndex::Create(t);
    EXPECT_OK(ctx);
    EXPECT_OK((*ctx)->tree().AddSegment(vectors));
    ctxs.push_back(std::move(*ctx));
  }
  SelectorOptions o;
  o.num_threads = threads;
  auto selector = Selector::Create(o);
  EXPECT_OK(selector);
  std::vector<SelectResult> results(contexts);
  std::vector<SelectRequest> requests(contexts);
  std::vector<std::vector<float>> anchors(contexts, std::vector<float>(kDim));
  int64_t counted = 0;
  constexpr int kWarm = 2 * kMaxStabilityWindow, kSteps = 200;
  for (int step = 1; step <= kWarm + kSteps; ++step) {
    for (int i = 0; i < contexts; ++i) {
      for (float& x : anchors[i]) x = normal(rng);
      SelectRequest& r = requests[i];
      r.context = ctxs[i].get();
      r.scorer = c.scorer;
      r.anchor = anchors[i];
      r.budget_blocks = c.window_budget ? kBlocks / 8 : kBlocks / 16;
      r.step = step;
    }
    allocations = 0;
    counting = step > kWarm;
    const absl::Status st = contexts == 1
                                ? (*selector)->Select(requests[0], &results[0])
                                : (*selector)->SelectBatch(requests, absl::MakeSpan(results));
    counting = false;
    EXPECT_OK(st) << c.name << ": " << st;
    counted += allocations.load();
  }
  return counted;
}

constexpr Case kCases[] = {{"key-key descent", ScorerKind::kKeyKey, false},
                           {"mass (window path)", ScorerKind::kMass, true},
                           {"recency", ScorerKind::kRecency, false},
                           {"keydiff", ScorerKind::kKeyDiff, false}};

TEST(SelectorAllocTest, StepsAllocateNothingOnceWarm) {
  for (const Case& c : kCases) EXPECT_EQ(AllocationsOverSteps(c, 1, 1), 0) << c.name;
}

TEST(SelectorAllocTest, BatchesOnWorkerThreadsAllocateNothingOnceWarm) {
  for (const Case& c : kCases) EXPECT_EQ(AllocationsOverSteps(c, 8, 2), 0) << c.name;
}

}  // namespace
}  // namespace kvtier::index
