// gMock matchers for absl::Status and absl::StatusOr<T> (Debian's abseil
// 20220623 ships no absl/status/status_matchers.h). Header-only.
//
//   EXPECT_THAT(store->Get(id), IsOk());
//   EXPECT_THAT(status, StatusIs(absl::StatusCode::kNotFound));
//   EXPECT_THAT(result, StatusIs(absl::StatusCode::kInvalidArgument,
//                                ::testing::HasSubstr("block_id")));
//   ASSERT_OK(status);  EXPECT_OK(client->Health());
//
// Each matcher takes a Status or any StatusOr<T>; a mismatch is explained
// with the actual code and message ("whose status is NOT_FOUND: no block").
// The matchers hold no state and are safe to use from any thread.
#ifndef KVTIER_TESTS_TESTUTIL_STATUS_MATCHERS_H_
#define KVTIER_TESTS_TESTUTIL_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::testing {
namespace internal_status {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}
// grpc::Status (error_code(), error_message()): its code and message.
template <typename S>
auto GetStatus(const S& s) -> decltype(s.error_code(), s.error_message(), absl::Status()) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}
// A struct with public `code` and `message` members (gpu::GpuStatus): OK
// when the code is 0, else UNKNOWN naming the code and the message.
template <typename S>
auto GetStatus(const S& s)
    -> decltype(static_cast<int>(s.code), std::string(s.message), absl::Status()) {
  const int code = static_cast<int>(s.code);
  return code == 0 ? absl::OkStatus()
                   : absl::UnknownError(absl::StrCat("code ", code, ": ", s.message));
}
// A class with code() (a gRPC status code number) and message()
// (client::FetchedFd).
template <typename S>
auto GetStatus(const S& s)
    -> decltype(static_cast<int>(s.code()), std::string(s.message()), absl::Status()) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()), std::string(s.message()));
}
// rocksdb::Status (IsNotFound(), ToString()): OK, or UNKNOWN with its text.
template <typename S>
auto GetStatus(const S& s) -> decltype(s.IsNotFound(), s.ToString(), absl::Status()) {
  return s.ok() ? absl::OkStatus() : absl::UnknownError(s.ToString());
}

// "OK" or "NOT_FOUND: no such block".
inline std::string Describe(const absl::Status& status) { return status.ToString(); }

// Matches a Status (or StatusOr's status) whose code is `code_` and whose
// message matches `message_`.
template <typename StatusType>
class StatusIsMatcherImpl : public ::testing::MatcherInterface<const StatusType&> {
 public:
  StatusIsMatcherImpl(absl::StatusCode code, ::testing::Matcher<const std::string&> message)
      : code_(code), message_(std::move(message)) {}

  bool MatchAndExplain(const StatusType& actual,
                       ::testing::MatchResultListener* listener) const override {
    const absl::Status& status = GetStatus(actual);  // may be a converted temporary
    *listener << "whose status is " << Describe(status);
    if (status.code() != code_) return false;
    ::testing::StringMatchResultListener message_listener;
    if (!message_.MatchAndExplain(std::string(status.message()), &message_listener)) {
      const std::string why = message_listener.str();
      if (!why.empty()) *listener << ", and the message " << why;
      return false;
    }
    return true;
  }
  void DescribeTo(std::ostream* os) const override {
    *os << "has status code " << absl::StatusCodeToString(code_) << " and a message that ";
    message_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const override {
    *os << "has a status code other than " << absl::StatusCodeToString(code_)
        << " or a message that ";
    message_.DescribeNegationTo(os);
  }

 private:
  const absl::StatusCode code_;
  const ::testing::Matcher<const std::string&> message_;
};

// Polymorphic: becomes a Matcher<const absl::Status&> or
// Matcher<const absl::StatusOr<T>&> where it is used.
class StatusIsMatcher {
 public:
  StatusIsMatcher(absl::StatusCode code, ::testing::Matcher<const std::string&> message)
      : code_(code), message_(std::move(message)) {}

  template <typename StatusType>
  operator ::testing::Matcher<StatusType>() const {  // NOLINT(runtime/explicit)
    using Plain = std::remove_cv_t<std::remove_reference_t<StatusType>>;
    return ::testing::Matcher<StatusType>(new StatusIsMatcherImpl<Plain>(code_, message_));
  }

 private:
  absl::StatusCode code_;
  ::testing::Matcher<const std::string&> message_;
};

}  // namespace internal_status

// The status (of a Status or StatusOr<T>) has `code` and a message matching
// `message` (a string matcher such as HasSubstr, or a string for equality).
template <typename MessageMatcher>
internal_status::StatusIsMatcher StatusIs(absl::StatusCode code, MessageMatcher&& message) {
  return internal_status::StatusIsMatcher(
      code, ::testing::MatcherCast<const std::string&>(std::forward<MessageMatcher>(message)));
}

// The status has `code`, whatever its message.
inline internal_status::StatusIsMatcher StatusIs(absl::StatusCode code) {
  return StatusIs(code, ::testing::_);
}

// The status is OK.
inline internal_status::StatusIsMatcher IsOk() { return StatusIs(absl::StatusCode::kOk); }

// A StatusOr<T> that is OK and whose value matches `value` (a matcher, or
// a value for equality):
//   EXPECT_THAT(table.Get(key), IsOkAndHolds(Eq("v1")));
MATCHER_P(IsOkAndHolds, value,
          std::string(negation ? "is not OK or holds a value that does not match"
                               : "is OK and holds a value that matches")) {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(value, *arg, result_listener);
}

}  // namespace kvtier::testing

// Assert or expect that a status expression is OK (absl::Status or
// StatusOr<T>, grpc::Status, rocksdb::Status); on failure the message shows
// the code and message of the status. deploy/lint.sh refuses a bare
// ASSERT_TRUE or EXPECT_TRUE on .ok(), which prints neither.
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::kvtier::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::kvtier::testing::IsOk())

#endif  // KVTIER_TESTS_TESTUTIL_STATUS_MATCHERS_H_
