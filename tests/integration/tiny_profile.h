// The small model profile of the in-process daemon tests: 2 layers x K,V x
// 2 KV heads x 16 tokens x 32 dims x fp16 = 8 KiB blocks.
//
// Thread safety: a pure function.
#ifndef KVTIER_TESTS_INTEGRATION_TINY_PROFILE_H_
#define KVTIER_TESTS_INTEGRATION_TINY_PROFILE_H_

#include <cstdint>

#include "kvtier/v1/kvtier.pb.h"

namespace kvtier::testing {

inline constexpr uint64_t kTinyBlockBytes = 8192;

inline v1::ModelProfile TinyProfile() {
  v1::ModelProfile profile;
  profile.set_name("tiny");
  profile.set_revision("1");
  profile.set_num_layers(2);
  profile.set_num_kv_heads(2);
  profile.set_head_dim(32);
  profile.set_block_size_tokens(16);
  profile.set_dtype(v1::DTYPE_FP16);
  return profile;
}

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_INTEGRATION_TINY_PROFILE_H_
