// BlockStoreOptions::begin_summary: a put of a new block that computes its
// summary itself takes it from a SummaryStream fed chunk by chunk as the
// payload is copied into its host slot; the deferred path and puts of
// stored blocks use the plain summarize hook. Real parts as in
// block_store_test.cc.
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include <xxhash.h>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "storage/common/checksum.h"
#include "storage/store/block_store.h"
#include "storage/store/store_test_util.h"
#include "tests/testutil/status_matchers.h"

using ::kvtier::testing::StatusIs;

namespace kvtier {
namespace {

// A summary any payload has exactly one of.
std::string SummaryOf(absl::Span<const uint8_t> data) {
  return std::to_string(data.size()) + ":" + std::to_string(XXH3_64bits(data.data(), data.size()));
}

// What the streams and the plain hook were asked for.
struct HookLog {
  absl::Mutex mu;
  std::vector<std::vector<size_t>> prefixes ABSL_GUARDED_BY(mu);  // one list per stream
  int finished ABSL_GUARDED_BY(mu) = 0;
  int plain_calls ABSL_GUARDED_BY(mu) = 0;
  bool prefix_mismatch ABSL_GUARDED_BY(mu) = false;
};

// Records the prefixes it is shown; checks each holds what the final
// payload holds there (the chunk is in place when Advance sees it).
class RecordingStream : public SummaryStream {
 public:
  explicit RecordingStream(std::shared_ptr<HookLog> log) : log_(std::move(log)) {}
  void Advance(absl::Span<const uint8_t> written) override {
    seen_.assign(written.begin(), written.end());
    absl::MutexLock lock(&log_->mu);
    log_->prefixes.back().push_back(written.size());
  }
  absl::StatusOr<std::string> Finish(absl::Span<const uint8_t> payload) override {
    absl::MutexLock lock(&log_->mu);
    ++log_->finished;
    if (seen_.size() > payload.size() || !std::equal(seen_.begin(), seen_.end(), payload.begin())) {
      log_->prefix_mismatch = true;
    }
    return SummaryOf(payload);
  }

 private:
  std::shared_ptr<HookLog> log_;
  std::vector<uint8_t> seen_;
};

class SummaryStreamTest : public BlockStoreTest {
 protected:
  void UseHooks(bool defer) {
    log_ = std::make_shared<HookLog>();
    options_.summarize = [log = log_](const ModelProfile&, absl::Span<const uint8_t> data) {
      absl::MutexLock lock(&log->mu);
      ++log->plain_calls;
      return absl::StatusOr<std::string>(SummaryOf(data));
    };
    options_.begin_summary = [log = log_](const ModelProfile&) {
      {
        absl::MutexLock lock(&log->mu);
        log->prefixes.emplace_back();
      }
      return std::make_unique<RecordingStream>(log);
    };
    options_.defer_summaries = defer;
    Reopen();
  }

  std::string StoredSummary(uint64_t n) {
    std::vector<BlockKey> missing;
    std::vector<std::string> got = store_->GetSummaries({Key(n)}, &missing);
    EXPECT_TRUE(missing.empty()) << n;
    return got.empty() ? std::string() : got[0];
  }

  std::shared_ptr<HookLog> log_;
};

TEST_F(SummaryStreamTest, NewBlocksAreSummarisedChunkByChunkAsTheyAreCopied) {
  UseHooks(/*defer=*/false);
  ASSERT_OK(store_->Put(Key(1), Payload(1)));
  // In pieces (a gRPC message's slices): a chunk ends at every piece's end.
  const std::vector<uint8_t> two = Payload(2);
  const std::vector<absl::Span<const uint8_t>> pieces = {
      {two.data(), 5000}, {two.data() + 5000, 3000}, {two.data() + 8000, kBlockBytes - 8000}};
  ASSERT_OK(store_->PutPieces(Key(2), pieces));
  // Staged in shared memory.
  auto slots = store_->ReserveStaging("default", profile_id_, 1, 0);
  ASSERT_OK(slots) << slots.status();
  const std::vector<uint8_t> three = Payload(3);
  {
    absl::StatusOr<StagingFile> file = store_->OpenStagingFile("default");
    ASSERT_OK(file) << file.status();
    ASSERT_EQ(::pwrite(file->fd.get(), three.data(), three.size(),
                       static_cast<off_t>((*slots)[0].offset_bytes)),
              static_cast<ssize_t>(three.size()));
  }
  ASSERT_OK(store_->PutFromStaging(Key(3), (*slots)[0], {.durable = true}));
  {
    absl::MutexLock lock(&log_->mu);
    ASSERT_EQ(log_->prefixes.size(), 3u);
    EXPECT_EQ(log_->prefixes[0], std::vector<size_t>({kBlockBytes}));
    EXPECT_EQ(log_->prefixes[1], std::vector<size_t>({5000, 8000, kBlockBytes}));
    EXPECT_EQ(log_->prefixes[2], std::vector<size_t>({kBlockBytes}));
    EXPECT_EQ(log_->finished, 3);
    EXPECT_EQ(log_->plain_calls, 0);
    EXPECT_FALSE(log_->prefix_mismatch);
  }
  EXPECT_EQ(StoredSummary(1), SummaryOf(Payload(1)));
  EXPECT_EQ(StoredSummary(2), SummaryOf(two));
  EXPECT_EQ(StoredSummary(3), SummaryOf(three));
  Reopen();  // the durable block's streamed summary is in its record
  EXPECT_EQ(StoredSummary(3), SummaryOf(three));
}

// A payload that fails the client's checksum is not stored; the deferred
// path uses the plain hook; a put of a stored block computes no summary.
TEST_F(SummaryStreamTest, OtherPathsUseThePlainHook) {
  UseHooks(/*defer=*/true);
  const std::vector<uint8_t> one = Payload(1);
  EXPECT_THAT(
      store_->Put(Key(1), one, {.expected_xxh3 = XXH3_64bits(one.data(), one.size()) ^ 1}).status(),
      StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_FALSE(store_->Lookup(Key(1)).present);
  // Non-durable: deferred to the summary thread, which uses the plain hook.
  ASSERT_OK(store_->Put(Key(2), Payload(2)));
  EXPECT_EQ(StoredSummary(2), SummaryOf(Payload(2)));
  // Durable: summarised by the put, through a stream.
  ASSERT_OK(store_->Put(Key(3), Payload(3), {.durable = true}));
  EXPECT_EQ(StoredSummary(3), SummaryOf(Payload(3)));
  {
    absl::MutexLock lock(&log_->mu);
    EXPECT_EQ(log_->plain_calls, 1);  // block 2
    EXPECT_EQ(log_->finished, 1);     // block 3
  }
  // Stored already (block 3 comes back from the catalog): identical bytes
  // again are compared by checksum and summarised by nobody.
  UseHooks(/*defer=*/false);
  for (bool durable : {false, true}) {
    auto again = store_->Put(Key(3), Payload(3), {.durable = durable});
    ASSERT_OK(again) << again.status();
    EXPECT_TRUE(again->existed);
  }
  absl::MutexLock lock(&log_->mu);
  EXPECT_EQ(log_->finished, 0);
  EXPECT_EQ(log_->plain_calls, 0);
}

}  // namespace
}  // namespace kvtier
