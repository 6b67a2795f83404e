// A client that takes every kind of daemon resource (a context, its Select
// pins, a handle lease, staging slots), writes "ready\n" to stdout and then
// waits to be killed. Used by churn_test to check that SIGKILLed clients
// leave nothing behind once their leases expire.
//
//   kvtier_churn_client <socket> <token> <profile_id> <block-id-prefix> <n>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "client/client.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s socket token profile_id prefix n\n", argv[0]);
    return 2;
  }
  using namespace kvtier;
  ClientOptions options;
  options.token = argv[2];
  auto client = Client::Connect(argv[1], options);
  if (!client.ok()) return 3;
  const uint64_t profile = std::strtoull(argv[3], nullptr, 10);
  const int n = std::atoi(argv[5]);
  auto id = [&](int i) {
    std::string s = std::string(argv[4]) + "-" + std::to_string(i);
    s.resize(32, '.');
    return s;
  };
  v1::OpenContextRequest open;
  open.set_profile_id(profile);
  open.set_lease_ttl_ms(500);
  auto* seg = open.add_segments();
  for (int i = 0; i < n; ++i) seg->add_block_ids(id(i));
  grpc::ClientContext octx;
  v1::OpenContextResponse opened;
  if (!(*client)->kvtier_stub()->OpenContext(&octx, open, &opened).ok()) return 4;
  grpc::ClientContext sctx;
  auto stream = (*client)->kvtier_stub()->Select(&sctx);
  v1::SelectRequest sel;
  auto* e = sel.add_contexts();
  e->set_context_id(opened.context_id());
  e->set_max_blocks(2);
  e->set_step(1);
  for (int d = 0; d < 32; ++d) e->add_anchor(0.5f);
  v1::SelectResponse selected;
  if (!stream->Write(sel) || !stream->Read(&selected)) return 5;
  v1::GetBlocksRequest get;
  get.set_profile_id(profile);
  get.set_mode(v1::RETURN_MODE_HANDLES);
  get.set_lease_ttl_ms(500);
  get.add_block_ids(id(0));
  uint64_t lease = 0;
  if (!(*client)->GetBlocks(get, &lease).ok()) return 6;
  if (!(*client)->ReserveSlots(profile, 2, 500).ok()) return 7;
  std::fputs("ready\n", stdout);
  std::fflush(stdout);
  for (;;) ::pause();
}
