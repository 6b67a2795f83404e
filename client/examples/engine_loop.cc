// An engine's decode loop against kvtierd, with the C++ client:
//
//   1. register a (tiny) model profile, map the device arena (client/shm);
//   2. prefill: put the prompt's blocks, open a context on them;
//   3. decode: each step reads the blocks Select chose for it through their
//      arena handles ("attention"), asks for the next step's blocks at once
//      (Select one step ahead: the daemon works while the engine computes),
//      and puts + appends each block as it completes;
//   4. release the pins, close the context.
//
// Every block read through a handle is compared with the bytes put; the
// exit status is 0 when all of them match and at least one was read.
//
//   kvtier_engine_loop ./var/kvtier/kvtierd.sock
//
// Needs a daemon whose device tier is a shared-memory arena
// (tiers.device.backend = "shm", or "auto" on a host without a GPU).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "client/anchor.h"
#include "client/client.h"
#include "client/shm/shm_mapping.h"

namespace {

constexpr uint32_t kLayers = 2, kKvHeads = 2, kHeadDim = 16, kTokens = 16;
constexpr int kPromptBlocks = 6, kDecodeSteps = 24, kTokensPerStep = 4, kBudgetBlocks = 4;

kvtier::v1::ModelProfile TinyProfile() {
  kvtier::v1::ModelProfile p;
  p.set_name("engine-loop-example");
  p.set_num_layers(kLayers);
  p.set_num_kv_heads(kKvHeads);
  p.set_head_dim(kHeadDim);
  p.set_block_size_tokens(kTokens);
  p.set_dtype(kvtier::v1::DTYPE_FP16);
  return p;
}

// A block of fp16 values in (-1, 1), [layer][k|v][kv_head][token][dim]:
// what the model would have written for these tokens.
std::string ComputeBlock(uint64_t seed) {
  std::string out(size_t{kLayers} * 2 * kKvHeads * kTokens * kHeadDim * 2, '\0');
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < out.size(); i += 2) {
    const uint16_t half = static_cast<uint16_t>((rng() & 0x83FF) | (14u << 10));
    std::memcpy(&out[i], &half, 2);
  }
  return out;
}

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "engine_loop: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

// Puts one block and returns its id (a real engine uses
// kvtier::ChainHashSequence over the tokens; client/chain_hash.h).
absl::StatusOr<std::string> PutBlock(kvtier::Client& client, uint64_t profile_id, int index,
                                     std::map<std::string, std::string>* blocks) {
  std::string id = "block-" + std::to_string(index);
  std::string& bytes = (*blocks)[id] = ComputeBlock(1000 + index);
  const kvtier::BlockData data{
      id, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, 0};
  auto put = client.PutBlockData(profile_id, {&data, 1});
  if (!put.ok()) return put.status();
  absl::Status item = kvtier::FromItemStatus(put->results(0).status(), "blocks[0]");
  if (!item.ok()) return item;
  return id;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <kvtierd socket>\n", argv[0]);
    return 2;
  }
  auto client = kvtier::Client::Connect(argv[1]);
  if (!client.ok()) return Fail("connect", client.status());
  kvtier::Client& kv = **client;

  // 1. The profile and the arena.
  auto profile = kv.RegisterProfile(TinyProfile());
  if (!profile.ok()) return Fail("RegisterProfile", profile.status());
  const uint64_t profile_id = profile->profile_id();
  auto arena_info = kv.OpenArena();
  if (!arena_info.ok()) return Fail("OpenArena", arena_info.status());
  std::string error;
  auto arena = kvtier::client::ShmArenaView::Open(kv.ArenaSource(*arena_info),
                                                  arena_info->size_bytes(), &error);
  if (arena == nullptr) return Fail("map arena", absl::FailedPreconditionError(error));

  // 2. Prefill: the prompt's blocks through the staging file (one copy
  // each, no payload through gRPC), then a context on them.
  std::map<std::string, std::string> blocks;  // id -> the bytes the engine put
  kvtier::v1::OpenContextRequest open;
  open.set_profile_id(profile_id);
  kvtier::v1::Segment* prompt = open.add_segments();
  std::vector<kvtier::BlockData> staged;
  for (int b = 0; b < kPromptBlocks; ++b) {
    prompt->add_block_ids("block-" + std::to_string(b));
    const std::string& bytes = blocks[prompt->block_ids(b)] = ComputeBlock(1000 + b);
    staged.push_back(
        {prompt->block_ids(b), {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, 0});
  }
  auto put = kv.PutBlocksStaged(profile_id, staged);
  if (!put.ok()) return Fail("PutBlocksStaged", put.status());
  for (int b = 0; b < kPromptBlocks; ++b) {
    absl::Status item = kvtier::FromItemStatus(put->results(b).status(), prompt->block_ids(b));
    if (!item.ok()) return Fail("put prompt block", item);
  }
  auto context = kv.OpenContext(open);
  if (!context.ok()) return Fail("OpenContext", context.status());
  const uint64_t context_id = context->context_id();

  // 3. Decode. The anchor: the mean key of the latest block's last tokens.
  auto ask = [&](const std::string& latest) {
    kvtier::AnchorBuilder anchor(TinyProfile());
    kvtier::v1::ContextSelect entry;
    entry.set_context_id(context_id);
    entry.set_scorer(kvtier::v1::SCORER_KEY_KEY);
    entry.set_max_blocks(kBudgetBlocks);
    entry.set_wait_ms(1000);  // rather wait than get PENDING blocks
    if (anchor.AddTokens(blocks[latest], kTokens - 4, 4).ok()) {
      auto pooled = anchor.Finish(kvtier::AnchorLayout::kPooled);  // head_dim floats
      if (pooled.ok()) entry.mutable_anchor()->Add(pooled->begin(), pooled->end());
    }
    return entry;
  };
  auto stream = kv.OpenSelectStream();
  std::string latest = "block-" + std::to_string(kPromptBlocks - 1);
  if (auto sent = stream->Send({ask(latest)}); !sent.ok()) return Fail("Select", sent.status());
  int next_block = kPromptBlocks, tokens_in_block = 0, verified = 0;
  for (int step = 0; step < kDecodeSteps; ++step) {
    auto selections = stream->Receive();  // asked for during the previous step
    if (!selections.ok()) return Fail("Select", selections.status());
    const kvtier::Selection& sel = (*selections)[0];
    if (!sel.status.ok()) return Fail("Select", sel.status);
    for (const kvtier::v1::SelectedBlock& b : sel.blocks) {  // "attention"
      if (b.residency() != kvtier::v1::RESIDENCY_RESIDENT) continue;
      auto bytes = arena->Slot(b.handle().offset_bytes(), b.handle().size_bytes());
      const std::string& want = blocks[b.block_id()];
      if (bytes.size() != want.size() || std::memcmp(bytes.data(), want.data(), want.size()) != 0) {
        std::fprintf(stderr, "engine_loop: step %d: %s differs from what was put\n", step,
                     b.block_id().c_str());
        return 1;
      }
      ++verified;
    }
    // The next step's blocks, while this step computes (its pins replace
    // this step's: the handles above are not read again).
    if (step + 1 < kDecodeSteps) {
      if (auto sent = stream->Send({ask(latest)}); !sent.ok()) return Fail("Select", sent.status());
    }
    tokens_in_block += kTokensPerStep;                   // the model's forward pass
    if (tokens_in_block == static_cast<int>(kTokens)) {  // a block completed
      auto id = PutBlock(kv, profile_id, next_block++, &blocks);
      if (!id.ok()) return Fail("put block", id.status());
      auto appended = kv.AppendBlocks(context_id, {*id});
      if (!appended.ok()) return Fail("AppendBlocks", appended.status());
      latest = *id;
      tokens_in_block = 0;
    }
  }

  // 4. Done with the sequence.
  if (absl::Status st = stream->Close(); !st.ok()) return Fail("Select stream", st);
  kvtier::v1::ReleaseRequest release;
  release.set_context_id(context_id);
  if (auto released = kv.Release(release); !released.ok())
    return Fail("Release", released.status());
  if (absl::Status st = kv.CloseContext(context_id); !st.ok()) return Fail("CloseContext", st);
  std::printf("engine_loop: %d steps, %d blocks in the context, %d block reads verified\n",
              kDecodeSteps, next_block, verified);
  return verified > 0 ? 0 : 1;
}
