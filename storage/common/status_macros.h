// Local replacements for the status macros Debian's abseil (20220623) lacks.
//
//   KVTIER_RETURN_IF_ERROR(expr);           // returns expr's status if !ok()
//   KVTIER_ASSIGN_OR_RETURN(auto x, expr);  // unwraps a StatusOr or returns
//
// Both evaluate expr exactly once. Thread-safe (no state).
#ifndef KVTIER_STORAGE_COMMON_STATUS_MACROS_H_
#define KVTIER_STORAGE_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define KVTIER_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status kvtier_status_ = (expr);          \
    if (!kvtier_status_.ok()) return kvtier_status_; \
  } while (0)

#define KVTIER_STATUS_CONCAT_INNER_(a, b) a##b
#define KVTIER_STATUS_CONCAT_(a, b) KVTIER_STATUS_CONCAT_INNER_(a, b)

#define KVTIER_ASSIGN_OR_RETURN(lhs, expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL_(KVTIER_STATUS_CONCAT_(kvtier_statusor_, __LINE__), lhs, expr)

#define KVTIER_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // KVTIER_STORAGE_COMMON_STATUS_MACROS_H_
