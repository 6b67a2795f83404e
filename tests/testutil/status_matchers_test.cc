#include "tests/testutil/status_matchers.h"

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace kvtier::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(StatusMatchersTest, IsOkMatchesOkStatusAndValue) {
  EXPECT_THAT(absl::OkStatus(), IsOk());
  EXPECT_THAT(absl::StatusOr<int>(7), IsOk());
  EXPECT_OK(absl::OkStatus());
  ASSERT_OK(absl::StatusOr<std::string>("x"));
}

TEST(StatusMatchersTest, IsOkRejectsErrors) {
  EXPECT_THAT(absl::NotFoundError("gone"), Not(IsOk()));
  EXPECT_THAT(absl::StatusOr<int>(absl::InternalError("boom")), Not(IsOk()));
}

TEST(StatusMatchersTest, StatusIsComparesTheCode) {
  EXPECT_THAT(absl::NotFoundError("gone"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(absl::NotFoundError("gone"), Not(StatusIs(absl::StatusCode::kInternal)));
  EXPECT_THAT(absl::StatusOr<int>(absl::UnavailableError("down")),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(absl::StatusOr<int>(3), StatusIs(absl::StatusCode::kOk));
  EXPECT_THAT(absl::StatusOr<int>(3), Not(StatusIs(absl::StatusCode::kNotFound)));
}

TEST(StatusMatchersTest, StatusIsComparesTheMessage) {
  const absl::Status st = absl::InvalidArgumentError("block_id: 33 bytes, at most 32");
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_id")));
  EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument, "block_id: 33 bytes, at most 32"));
  EXPECT_THAT(st, Not(StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("profile_id"))));
  // Right message, wrong code.
  EXPECT_THAT(st, Not(StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("block_id"))));
}

TEST(StatusMatchersTest, MismatchNamesTheActualCodeAndMessage) {
  ::testing::Matcher<const absl::Status&> m =
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("block"));
  ::testing::StringMatchResultListener listener;
  EXPECT_FALSE(m.MatchAndExplain(absl::InternalError("disk on fire"), &listener));
  EXPECT_THAT(listener.str(), HasSubstr("INTERNAL"));
  EXPECT_THAT(listener.str(), HasSubstr("disk on fire"));
  EXPECT_THAT(::testing::DescribeMatcher<const absl::Status&>(m), HasSubstr("NOT_FOUND"));

  ::testing::Matcher<const absl::StatusOr<int>&> ok = IsOk();
  ::testing::StringMatchResultListener or_listener;
  EXPECT_FALSE(ok.MatchAndExplain(absl::StatusOr<int>(absl::AbortedError("retry")), &or_listener));
  EXPECT_THAT(or_listener.str(), HasSubstr("ABORTED: retry"));
}

TEST(StatusMatchersTest, FailingExpectationReportsTheStatus) {
  // A failing EXPECT_THAT, caught: the report names code and message.
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    EXPECT_OK(absl::ResourceExhaustedError("quota host_bytes"));
  }
  ASSERT_EQ(failures.size(), 1);
  EXPECT_THAT(failures.GetTestPartResult(0).message(),
              HasSubstr("RESOURCE_EXHAUSTED: quota host_bytes"));
}

TEST(StatusMatchersTest, IsOkAndHoldsMatchesTheValue) {
  EXPECT_THAT(absl::StatusOr<int>(7), IsOkAndHolds(7));
  EXPECT_THAT(absl::StatusOr<std::string>("abc"), IsOkAndHolds(HasSubstr("b")));
  EXPECT_THAT(absl::StatusOr<int>(7), Not(IsOkAndHolds(8)));
  ::testing::Matcher<const absl::StatusOr<int>&> m = IsOkAndHolds(7);
  ::testing::StringMatchResultListener listener;
  EXPECT_FALSE(m.MatchAndExplain(absl::StatusOr<int>(absl::NotFoundError("gone")), &listener));
  EXPECT_THAT(listener.str(), HasSubstr("NOT_FOUND: gone"));
}

// Stand-ins with the shapes of the other status types the matchers take.
struct GrpcLike {  // grpc::Status
  int error_code() const { return code_; }
  std::string error_message() const { return message_; }
  int code_ = 0;
  std::string message_;
};
struct GpuLike {  // gpu::GpuStatus
  enum Code { kOk = 0, kInternal = 5 };
  Code code = kOk;
  std::string message;
};
struct FdLike {  // client::FetchedFd
  int code() const { return code_; }
  const std::string& message() const { return message_; }
  int code_ = 0;
  std::string message_;
};
struct RocksLike {  // rocksdb::Status
  bool ok() const { return text.empty(); }
  bool IsNotFound() const { return false; }
  std::string ToString() const { return text; }
  std::string text;
};

TEST(StatusMatchersTest, OtherStatusTypesAreMatchedByCodeAndMessage) {
  EXPECT_OK(GrpcLike{});
  EXPECT_THAT((GrpcLike{5, "no such context"}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("context")));
  EXPECT_OK(GpuLike{});
  EXPECT_THAT((GpuLike{GpuLike::kInternal, "driver"}),
              StatusIs(absl::StatusCode::kUnknown, HasSubstr("code 5: driver")));
  EXPECT_OK(FdLike{});
  EXPECT_THAT((FdLike{16, "bad token"}), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_OK(RocksLike{});
  EXPECT_THAT(RocksLike{"IO error: disk"}, StatusIs(absl::StatusCode::kUnknown, "IO error: disk"));
}

}  // namespace
}  // namespace kvtier::testing
