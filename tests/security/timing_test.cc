// The latency of Lookup / GetBlocks for another tenant's block id must not
// tell it from an id nobody stored. Measured as an attacker would: calls
// interleaved at random, a threshold classifier fitted on half the samples
// and scored on the other half. Chance is 0.5; the test fails above 0.6
// (a cache hit served from DRAM would be told apart almost always).
#include <algorithm>
#include <chrono>
#include <random>

#include "tests/security/security_fixture.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::security {
namespace {

struct Sample {
  double us;
  bool hit;  // the id is stored (for tenant a)
};

// Best single-threshold accuracy of "slower than t means hit" or the
// reverse, fitted on `fit` and measured on `score`.
double HeldOutAccuracy(std::vector<Sample> fit, const std::vector<Sample>& score) {
  std::sort(fit.begin(), fit.end(), [](const Sample& x, const Sample& y) { return x.us < y.us; });
  const double n = static_cast<double>(fit.size());
  double hits_total = 0;
  for (const auto& s : fit) hits_total += s.hit;
  double hits_below = 0, best = 0, best_t = 0;
  bool best_slow_is_hit = true;
  for (size_t i = 0; i < fit.size(); ++i) {
    hits_below += fit[i].hit;
    const double below = static_cast<double>(i + 1);
    // "above t is a hit": correct = misses below + hits above.
    const double slow_hit = ((below - hits_below) + (hits_total - hits_below)) / n;
    if (slow_hit > best) best = slow_hit, best_t = fit[i].us, best_slow_is_hit = true;
    if (1 - slow_hit > best) best = 1 - slow_hit, best_t = fit[i].us, best_slow_is_hit = false;
  }
  double correct = 0;
  for (const auto& s : score) correct += ((s.us > best_t) == best_slow_is_hit) == s.hit;
  return correct / static_cast<double>(score.size());
}

class TimingTest : public SecurityTest {};

TEST_F(TimingTest, AnotherTenantsHitLooksLikeAMiss) {
  StartDaemon();
  auto a = As("a");
  auto b = As("b");
  const uint64_t p = Register(a.get());
  // B asks under its own profile of the same definition (profiles are per
  // tenant; A's id would answer NOT_FOUND at once).
  const uint64_t pb = Register(b.get());
  auto stored = Ids("secret", 32);
  Put(a.get(), p, stored, 1);
  std::vector<std::string> never;
  for (int i = 0; i < 32; ++i) never.push_back(BlockIdOf("never", i));

  constexpr int kSamples = 1200;
  std::mt19937_64 rng(42);
  for (int rpc = 0; rpc < 2; ++rpc) {
    std::vector<Sample> samples;
    for (int i = 0; i < kSamples; ++i) {
      const bool hit = (rng() & 1) != 0;
      const std::string& id = (hit ? stored : never)[rng() % 32];
      const auto t0 = std::chrono::steady_clock::now();
      if (rpc == 0) {
        v1::LookupRequest req;
        req.set_profile_id(pb);
        req.add_block_ids(id);
        auto r = b->Lookup(req);
        ASSERT_OK(r);
        ASSERT_FALSE(r->entries(0).present());
      } else {
        v1::GetBlocksRequest req;
        req.set_profile_id(pb);
        req.add_block_ids(id);
        auto r = b->GetBlocks(req);
        ASSERT_OK(r);
        ASSERT_EQ((*r)[0].status().code(), grpc::StatusCode::NOT_FOUND);
      }
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 100) samples.push_back({us, hit});  // the first calls warm the channel
    }
    const size_t half = samples.size() / 2;
    const double acc = HeldOutAccuracy({samples.begin(), samples.begin() + half},
                                       {samples.begin() + half, samples.end()});
    EXPECT_LT(acc, 0.6) << (rpc == 0 ? "Lookup" : "GetBlocks")
                        << " timing tells another tenant's block from a missing one";
    std::printf("%s: held-out accuracy of a timing classifier %.3f (chance 0.5)\n",
                rpc == 0 ? "Lookup" : "GetBlocks", acc);
  }
}

}  // namespace
}  // namespace kvtier::security
