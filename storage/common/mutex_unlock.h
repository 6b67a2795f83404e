// MutexUnlock: the scoped opposite of absl::MutexLock. Its constructor
// releases a mutex the caller holds and its destructor takes it back, so an
// unlock window is one explicit scope (LevelDB's db_impl.cc habit):
//
//   void Store::FillLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
//     mu_.AssertHeld();
//     ...                              // metadata, under mu_
//     {
//       MutexUnlock unlocked(&mu_);    // payload I/O without mu_
//       CopyPayload(e);
//     }
//     ...                              // mu_ held again
//   }
//
// A method that opens such a window releases its caller's lock meanwhile:
// its contract comment says so, and what it may find changed afterwards.
// Clang's -Wthread-safety checks the window (the constructor releases the
// mutex, the destructor reacquires it). abseil 20220623 has
// ReleasableMutexLock but no unlock guard.
//
// Thread safety: one object is used by the thread that holds the mutex;
// not copyable or movable.
#ifndef KVTIER_STORAGE_COMMON_MUTEX_UNLOCK_H_
#define KVTIER_STORAGE_COMMON_MUTEX_UNLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

// abseil's ABSL_UNLOCK_FUNCTION is the older unlock_function attribute,
// which clang 14 does not apply to a scoped object's underlying mutex;
// release_capability is the one it reacquires at the end of the scope.
#if defined(__clang__)
#define KVTIER_RELEASE_CAPABILITY(...) __attribute__((release_capability(__VA_ARGS__)))
#else
#define KVTIER_RELEASE_CAPABILITY(...)
#endif

namespace kvtier {

class ABSL_SCOPED_LOCKABLE MutexUnlock {
 public:
  // Requires: *mu is held by this thread (checked in debug builds).
  explicit MutexUnlock(absl::Mutex* mu) KVTIER_RELEASE_CAPABILITY(mu) : mu_(mu) {
    mu_->AssertHeld();
    mu_->Unlock();
  }
  ~MutexUnlock() KVTIER_RELEASE_CAPABILITY() { mu_->Lock(); }

  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  absl::Mutex* const mu_;
};

}  // namespace kvtier

#undef KVTIER_RELEASE_CAPABILITY

#endif  // KVTIER_STORAGE_COMMON_MUTEX_UNLOCK_H_
