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

}  // namespace
}  // namespace kvtier::testing
