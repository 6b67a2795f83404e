// Fuzz target: every gRPC method the daemon serves (kvtier.v1.KvTier,
// kvtier.v1.Admin, grpc.health.v1.Health, server reflection), through the
// real server and its own request parsing and validation. The input format
// and the checked contract are in rpc_harness.h: a violation, a crash or a
// sanitizer report fails the run.
//
// The daemon starts once per process; every KVTIER_FUZZ_RESET_EVERY inputs
// (default 2000) it is restarted on a fresh directory, so that state left by
// earlier inputs (stored blocks, profiles) stays bounded.
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "tests/fuzz/rpc_harness.h"

namespace {

std::unique_ptr<kvtier::fuzz::RpcHarness> harness;
uint64_t inputs = 0;
uint64_t reset_every = 2000;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* v = std::getenv("KVTIER_FUZZ_RESET_EVERY"))
    reset_every = std::strtoull(v, nullptr, 10);
  harness = kvtier::fuzz::RpcHarness::Start();
  std::atexit([] { harness.reset(); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (reset_every != 0 && inputs > 0 && inputs % reset_every == 0) harness->Restart();
  ++inputs;
  harness->RunInput(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
