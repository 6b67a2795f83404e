// The engine streams of Streams (streams.h): contexts driven as an
// inference engine drives them, Select every decode step.
#include "absl/strings/str_cat.h"
#include "tests/load/stream_worker.h"
#include "tests/load/streams.h"

namespace kvtier::load {
namespace {

std::string GrpcText(const grpc::Status& st) {
  return absl::StrCat("code ", static_cast<int>(st.error_code()), ": ", st.error_message());
}

}  // namespace

void Streams::RunEngine(Worker* w) {
  while (!Done()) {
    if (w->context_id == 0 && !OpenNewContext(w)) continue;
    SelectStep(w);
    if (++w->steps % options_.selects_per_block == 0) AppendStep(w);
    if (w->appends_tried >= options_.context_blocks) CloseContext(w);
  }
  if (w->context_id != 0) CloseContext(w);
  if (w->select != nullptr) {
    w->select->WritesDone();
    const grpc::Status st = w->select->Finish();
    if (!st.ok()) Fail(w, "Select stream finished with " + GrpcText(st));
  }
}

bool Streams::OpenNewContext(Worker* w) {
  std::vector<std::string> prompt;
  // Shared prefix ids live in stream `streams`, in groups of
  // shared_prefix_blocks: engines that draw the same group share a prefix.
  const int shared = options_.shared_prefix_blocks;
  if (shared > 0) {
    const uint64_t groups = options_.ids_per_stream / static_cast<uint64_t>(shared);
    const uint64_t group = w->UniformSeq(groups);
    for (int k = 0; k < shared; ++k) {
      prompt.push_back(BlockId(static_cast<uint32_t>(options_.streams), group * shared + k));
    }
  }
  while (prompt.size() < static_cast<size_t>(options_.prompt_blocks)) {
    prompt.push_back(BlockId(w->stream, w->next_seq++ % options_.ids_per_stream));
  }
  std::vector<std::string> stored;
  Put(w, prompt, w->Coin(options_.durable_fraction), w->Coin(options_.slot_fraction), &stored);
  if (stored.empty()) return false;
  v1::OpenContextRequest open;
  open.set_profile_id(options_.profile_id);
  open.set_lease_ttl_ms(options_.lease_ttl_ms);
  v1::Segment* segment = open.add_segments();
  segment->set_label("prompt");
  for (const std::string& id : stored) segment->add_block_ids(id);
  v1::OpenContextResponse opened;
  grpc::Status st;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ScopedTimer timer(&w->stats, Op::kOpen);
    st = w->client->kvtier_stub()->OpenContext(&ctx, open, &opened);
  }
  Called(w);
  w->stats.CallCode(Op::kOpen, st.error_code());
  if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    ++w->counters.contexts_evicted;  // a prompt block was evicted since its put
    return false;
  }
  if (!st.ok()) {
    Fail(w, "OpenContext: " + GrpcText(st));
    return false;
  }
  if (opened.num_blocks() != stored.size()) {
    Fail(w,
         absl::StrCat("OpenContext: ", opened.num_blocks(), " blocks, ", stored.size(), " sent"));
  }
  ++w->counters.contexts_opened;
  w->context_id = opened.context_id();
  w->context_ids = std::move(stored);
  w->steps = 0;
  w->appends_tried = 0;
  return true;
}

void Streams::SelectStep(Worker* w) {
  if (w->select == nullptr) {
    w->select_ctx = std::make_unique<grpc::ClientContext>();
    w->select_ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::hours(1));
    w->select = w->client->kvtier_stub()->Select(w->select_ctx.get());
  }
  v1::SelectRequest req;
  req.set_request_id(++w->request_id);
  v1::ContextSelect* entry = req.add_contexts();
  entry->set_context_id(w->context_id);
  entry->set_max_blocks(options_.select_budget_blocks);
  v1::SelectResponse resp;
  bool ok = false;
  {
    ScopedTimer timer(&w->stats, Op::kSelect);
    ok = w->select->Write(req) && w->select->Read(&resp);
  }
  Called(w);
  if (!ok) {
    const grpc::Status st = w->select->Finish();  // the stream is over: Finish says why
    w->stats.CallCode(Op::kSelect, st.ok() ? -1 : st.error_code());
    Fail(w, "Select stream broke: " + GrpcText(st));
    w->select.reset();
    w->select_ctx.reset();
    return;
  }
  w->stats.CallCode(Op::kSelect, 0);
  ++w->counters.selects;
  if (resp.request_id() != w->request_id || resp.contexts_size() != 1) {
    return Fail(w, absl::StrCat("Select ", w->request_id, ": ", resp.ShortDebugString()));
  }
  const v1::ContextSelection& sel = resp.contexts(0);
  w->stats.ItemCode(Op::kSelect, sel.status().code());
  if (sel.status().code() != kOk) {
    return Fail(w, absl::StrCat("Select of context ", w->context_id, ": code ", sel.status().code(),
                                ": ", sel.status().message()));
  }
  if (sel.blocks_size() > static_cast<int>(options_.select_budget_blocks)) {
    Fail(w, absl::StrCat("Select: ", sel.blocks_size(), " blocks over a budget of ",
                         options_.select_budget_blocks));
  }
  for (const v1::SelectedBlock& b : sel.blocks()) {
    if (b.position() >= w->context_ids.size() || b.block_id() != w->context_ids[b.position()]) {
      Fail(w, absl::StrCat("Select: block ", Hex(b.block_id()), " at position ", b.position(),
                           " is not the context's"));
    } else if (b.residency() == v1::RESIDENCY_RESIDENT) {
      ++w->counters.selected_resident;
      // Pinned by the context's Select set until the next Select.
      CheckSlot(w, "Select", b.block_id(), b.handle().arena_id(), b.handle().offset_bytes(),
                b.handle().size_bytes());
    } else if (b.residency() == v1::RESIDENCY_PENDING) {
      ++w->counters.selected_pending;
    } else {
      ++w->counters.selected_absent;  // evicted from every tier
    }
  }
}

void Streams::AppendStep(Worker* w) {
  ++w->appends_tried;
  const std::string id = BlockId(w->stream, w->next_seq++ % options_.ids_per_stream);
  std::vector<std::string> stored;
  Put(w, {id}, w->Coin(options_.durable_fraction), w->Coin(options_.slot_fraction), &stored);
  if (stored.empty()) return;
  v1::AppendBlocksRequest append;
  append.set_context_id(w->context_id);
  append.add_block_ids(id);
  v1::AppendBlocksResponse appended;
  grpc::Status st;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ScopedTimer timer(&w->stats, Op::kAppend);
    st = w->client->kvtier_stub()->AppendBlocks(&ctx, append, &appended);
  }
  Called(w);
  w->stats.CallCode(Op::kAppend, st.error_code());
  if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    ++w->counters.contexts_evicted;  // evicted between its put and the append
    return;
  }
  if (!st.ok()) return Fail(w, "AppendBlocks: " + GrpcText(st));
  ++w->counters.appends;
  w->context_ids.push_back(id);
  if (appended.num_blocks() != w->context_ids.size()) {
    Fail(w, absl::StrCat("AppendBlocks: context ", w->context_id, " has ", appended.num_blocks(),
                         " blocks, expected ", w->context_ids.size()));
  }
}

void Streams::CloseContext(Worker* w) {
  v1::CloseContextRequest close;
  close.set_context_id(w->context_id);
  v1::CloseContextResponse closed;
  grpc::Status st;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ScopedTimer timer(&w->stats, Op::kClose);
    st = w->client->kvtier_stub()->CloseContext(&ctx, close, &closed);
  }
  Called(w);
  w->stats.CallCode(Op::kClose, st.error_code());
  if (!st.ok()) Fail(w, absl::StrCat("CloseContext ", w->context_id, ": ", GrpcText(st)));
  w->context_id = 0;
  w->context_ids.clear();
}

}  // namespace kvtier::load
