// Ids a client sees and must not guess (leases, contexts, staging slots):
// 64 bits from the kernel's CSPRNG (getrandom(2)), never 0.
//
// Thread safety: thread-safe.
#ifndef KVTIER_STORAGE_COMMON_RANDOM_ID_H_
#define KVTIER_STORAGE_COMMON_RANDOM_ID_H_

#include <cstdint>

namespace kvtier {

// A uniformly random non-zero 64-bit id. Aborts if the kernel has no
// randomness to give (getrandom failing other than EINTR): ids an attacker
// could predict are worse than no daemon.
uint64_t RandomId();

}  // namespace kvtier

#endif  // KVTIER_STORAGE_COMMON_RANDOM_ID_H_
