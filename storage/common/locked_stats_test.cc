#include "storage/common/locked_stats.h"

#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvtier {
namespace {

struct PairStats {
  uint64_t sent = 0;
  uint64_t acked = 0;
  uint64_t open = 0;
};

TEST(LockedStatsTest, AddReturnsTheNewValueAndSetOverwrites) {
  LockedStats<PairStats> stats;
  EXPECT_EQ(stats.Add(&PairStats::sent), 1u);
  EXPECT_EQ(stats.Add(&PairStats::sent, 5), 6u);
  stats.Set(&PairStats::open, 3);
  stats.Set(&PairStats::open, 2);
  const PairStats got = stats.Get();
  EXPECT_EQ(got.sent, 6u);
  EXPECT_EQ(got.acked, 0u);
  EXPECT_EQ(got.open, 2u);
}

// Writers move two fields together; every snapshot a reader takes while
// they run sees them equal, and no add is lost.
TEST(LockedStatsTest, ConcurrentChangesLoseNothingAndSnapshotsAreConsistent) {
  LockedStats<PairStats> stats;
  constexpr int kWriters = 4;
  constexpr int kPerWriter = 20000;
  std::vector<std::thread> writers;
  writers.reserve(kWriters);
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&stats] {
      for (int i = 0; i < kPerWriter; ++i) {
        stats.Change([](PairStats& s) {
          ++s.sent;
          ++s.acked;
        });
      }
    });
  }
  uint64_t torn = 0;
  uint64_t last = 0;
  while (last < uint64_t{kWriters} * kPerWriter) {
    const PairStats s = stats.Get();
    if (s.sent != s.acked) ++torn;
    last = s.sent;
  }
  for (std::thread& t : writers) t.join();
  EXPECT_EQ(torn, 0u);
  EXPECT_EQ(stats.Get().sent, uint64_t{kWriters} * kPerWriter);
  EXPECT_EQ(stats.Get().acked, uint64_t{kWriters} * kPerWriter);
}

}  // namespace
}  // namespace kvtier
