#include "tests/fuzz/rpc_harness.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <google/protobuf/dynamic_message.h>
#include <grpcpp/support/byte_buffer.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_split.h"
#include "daemon/config.h"
#include "grpc/health/v1/health.pb.h"

namespace kvtier::fuzz {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "rpc_harness: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

std::unique_ptr<Message> NewMessage(const Descriptor* type) {
  const Message* prototype =
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(type);
  if (prototype == nullptr) Fail("no generated type for " + type->full_name());
  return std::unique_ptr<Message>(prototype->New());
}

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// Calls fn(message, field) for every set singular uint64 field and
// fn(message, nullptr) for every message, depth first.
template <class Fn>
void Walk(Message* m, const Fn& fn, int depth = 0) {
  if (depth > 8) return;
  fn(m, nullptr);
  const Reflection* r = m->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(*m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_UINT64 && !f->is_repeated()) {
      fn(m, f);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(*m, f); ++i) {
          Walk(r->MutableRepeatedMessage(m, f, i), fn, depth + 1);
        }
      } else {
        Walk(r->MutableMessage(m, f), fn, depth + 1);
      }
    }
  }
}

void Remember(std::vector<uint64_t>* ids, uint64_t id) {
  if (id == 0 || std::find(ids->begin(), ids->end(), id) != ids->end()) return;
  if (ids->size() < kMaxIds) ids->push_back(id);
}

enum Tag : int { kStart = 0, kWrite, kWritesDone, kRead, kFinish, kTags };

// Completion-queue tags: the address of one byte per Tag.
char tag_bytes[kTags];
void* T(Tag tag) { return &tag_bytes[tag]; }
Tag TagOf(const void* tag) { return static_cast<Tag>(static_cast<const char*>(tag) - tag_bytes); }

}  // namespace

std::unique_ptr<RpcHarness> RpcHarness::Start() {
  // The daemon logs every refused request, protobuf every string field
  // with invalid UTF-8: both stay quiet unless KVTIER_FUZZ_LOG is set.
  if (std::getenv("KVTIER_FUZZ_LOG") == nullptr) {
    spdlog::set_level(spdlog::level::off);
    google::protobuf::SetLogHandler(nullptr);
  }
  std::unique_ptr<RpcHarness> h(new RpcHarness());
  h->StartServer();
  h->DiscoverMethods();
  return h;
}

RpcHarness::~RpcHarness() {
  StopServer();
  if (std::getenv("KVTIER_FUZZ_STATS") == nullptr) return;
  for (const auto& [path, codes] : stats_) {
    std::fprintf(stderr, "%-60s", path.c_str());
    for (const auto& [code, n] : codes)
      std::fprintf(stderr, " %d:%llu", code, (unsigned long long)n);
    std::fprintf(stderr, "\n");
    for (const auto& [code, message] : first_messages_[path]) {
      std::fprintf(stderr, "    %d: %.150s\n", code, message.c_str());
    }
  }
}

void RpcHarness::StartServer() {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kvtier-fuzz-" +
                     std::to_string(::getpid()) + "-" + std::to_string(generation_++) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) Fail("mkdtemp " + tmpl);
  dir_ = tmpl;
  // Small tiers (fast start, eviction reachable); short leases so pins do
  // not pile up; every summary section on so that every scorer is legal;
  // reflection on, so that it is fuzzed too (and lists the services).
  auto config = daemon::LoadConfig(
      "", {"server.data_dir=" + dir_,          "log.level=off",
           "server.shutdown_grace_ms=200",     "server.reflection=true",
           "tiers.device.capacity_bytes=1MiB", "tiers.host.capacity_bytes=2MiB",
           "tiers.host.staging_bytes=256KiB",  "tiers.nvme.file_count=1",
           "tiers.nvme.file_size_bytes=2MiB",  "tiers.nvme.io_threads=1",
           "leases.default_ttl_ms=1000",       "leases.max_ttl_ms=5000",
           "limits.max_batch_blocks=64",       "limits.max_contexts=64",
           "index.summary_bounds=true",        "index.summary_weighted=true",
           "index.summary_per_layer=true",     "index.keep_summaries=true",
           "index.head_weights_min_blocks=4",  "select.max_contexts_per_request=16"});
  if (!config.ok()) Fail("config: " + config.status().ToString());
  auto server = daemon::Server::Start(*config);
  if (!server.ok()) Fail("start: " + server.status().ToString());
  server_ = std::move(*server);
  channel_ =
      grpc::CreateChannel("unix:" + server_->socket_path(), grpc::InsecureChannelCredentials());
  if (!channel_->WaitForConnected(std::chrono::system_clock::now() + kDeadline)) {
    Fail("cannot connect to " + server_->socket_path());
  }
  stub_ = std::make_unique<grpc::GenericStub>(channel_);
}

void RpcHarness::StopServer() {
  stub_.reset();
  channel_.reset();
  if (server_ != nullptr) server_->Shutdown();
  server_.reset();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  dir_.clear();
}

void RpcHarness::Restart() {
  StopServer();
  StartServer();
}

void RpcHarness::DiscoverMethods() {
  // Nothing else in this binary refers to the health messages: without this
  // their descriptors would not be linked in from kvtier_proto.
  grpc::health::v1::HealthCheckRequest::descriptor();
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  const Descriptor* req_type =
      pool->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionRequest");
  const Descriptor* resp_type =
      pool->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionResponse");
  if (req_type == nullptr || resp_type == nullptr) Fail("reflection types not linked");
  std::unique_ptr<Message> req = NewMessage(req_type);
  req->GetReflection()->SetString(req.get(), req_type->FindFieldByName("list_services"), "*");
  Method reflection{
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      pool->FindMethodByName("grpc.reflection.v1alpha.ServerReflection.ServerReflectionInfo")};
  if (reflection.descriptor == nullptr) Fail("reflection service descriptor not linked");
  CallResult listed = Call(reflection, {req->SerializeAsString()});
  if (!listed.status.ok() || listed.responses.size() != 1) {
    Fail("reflection ListServices failed: " + listed.status.error_message());
  }
  std::unique_ptr<Message> resp = NewMessage(resp_type);
  resp->ParseFromString(listed.responses[0]);
  const Reflection* r = resp->GetReflection();
  const Message& list = r->GetMessage(*resp, resp_type->FindFieldByName("list_services_response"));
  const FieldDescriptor* service_field = list.GetDescriptor()->FindFieldByName("service");
  std::vector<std::string> names;
  for (int i = 0; i < list.GetReflection()->FieldSize(list, service_field); ++i) {
    const Message& s = list.GetReflection()->GetRepeatedMessage(list, service_field, i);
    names.push_back(s.GetReflection()->GetString(s, s.GetDescriptor()->FindFieldByName("name")));
  }
  std::sort(names.begin(), names.end());
  methods_.clear();
  for (const std::string& name : names) {
    const google::protobuf::ServiceDescriptor* service = pool->FindServiceByName(name);
    if (service == nullptr) Fail("the daemon serves " + name + " but its descriptor is not linked");
    for (int i = 0; i < service->method_count(); ++i) {
      methods_.push_back(Method{"/" + name + "/" + service->method(i)->name(), service->method(i)});
    }
  }
  if (methods_.empty()) Fail("the daemon lists no services");
}

int RpcHarness::MethodIndex(const std::string& path) const {
  for (size_t i = 0; i < methods_.size(); ++i) {
    if (methods_[i].path == path) return static_cast<int>(i);
  }
  return -1;
}

std::string RpcHarness::Encode(const std::vector<CallSpec>& calls) const {
  std::string out;
  for (size_t c = 0; c < calls.size(); ++c) {
    const int index = MethodIndex(calls[c].method);
    if (index < 0) Fail("unknown method " + calls[c].method);
    if (c > 0) out.append(kCallSeparator.data(), kCallSeparator.size());
    out.push_back(static_cast<char>(index));
    for (size_t m = 0; m < calls[c].messages.size(); ++m) {
      if (m > 0) out.append(kMessageSeparator.data(), kMessageSeparator.size());
      out.append(calls[c].messages[m]);
    }
  }
  return out;
}

std::string RpcHarness::Substitute(const Method& method, const std::string& message) {
  std::unique_ptr<Message> m = NewMessage(method.descriptor->input_type());
  if (!m->ParseFromString(message)) return message;
  bool changed = false;
  Walk(m.get(), [&](Message* msg, const FieldDescriptor* f) {
    const Reflection* r = msg->GetReflection();
    if (f == nullptr) {
      const Descriptor* d = msg->GetDescriptor();
      if (d->full_name() != "kvtier.v1.SlotRef") return;
      const uint64_t k = r->GetUInt64(*msg, d->FindFieldByName("slot_id"));
      if (k >= 1 && k <= slots_.size() &&
          r->GetUInt64(*msg, d->FindFieldByName("generation")) == 0) {
        msg->ParseFromString(slots_[k - 1]);
        changed = true;
      }
      return;
    }
    const std::vector<uint64_t>* ids = f->name() == "context_id" ? &context_ids_
                                       : f->name() == "lease_id" ? &lease_ids_
                                                                 : nullptr;
    const uint64_t k = r->GetUInt64(*msg, f);
    if (ids != nullptr && k >= 1 && k <= ids->size()) {
      r->SetUInt64(msg, f, (*ids)[k - 1]);
      changed = true;
    }
  });
  return changed ? m->SerializeAsString() : message;
}

void RpcHarness::Record(const Message& response) {
  std::unique_ptr<Message> m(response.New());
  m->CopyFrom(response);
  Walk(m.get(), [&](Message* msg, const FieldDescriptor* f) {
    const Reflection* r = msg->GetReflection();
    if (f == nullptr) {
      if (msg->GetDescriptor()->full_name() == "kvtier.v1.SlotRef" && slots_.size() < kMaxIds) {
        slots_.push_back(msg->SerializeAsString());
      }
      return;
    }
    if (f->name() == "context_id") Remember(&context_ids_, r->GetUInt64(*msg, f));
    if (f->name() == "lease_id") Remember(&lease_ids_, r->GetUInt64(*msg, f));
  });
}

CallResult RpcHarness::Call(const Method& method, const std::vector<std::string>& messages) {
  const bool client_streaming = method.descriptor->client_streaming();
  const bool server_streaming = method.descriptor->server_streaming();
  // Health.Watch streams until cancelled: one answer, then cancel.
  const bool endless = method.path == "/grpc.health.v1.Health/Watch";
  std::vector<std::string> out;
  const size_t count = client_streaming ? std::min(messages.size(), kMaxMessages)
                                        : std::min<size_t>(messages.size(), 1);
  for (size_t i = 0; i < count; ++i) out.push_back(Substitute(method, messages[i]));

  CallResult result;
  grpc::ClientContext ctx;
  const auto start = std::chrono::system_clock::now();
  ctx.set_deadline(start + kDeadline);
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub_->PrepareCall(&ctx, method.path, &cq);
  call->StartCall(T(kStart));
  grpc::ByteBuffer write_buffer, read_buffer;
  size_t next = 0;
  int pending = 1;  // operations posted and not completed
  bool writing = false, reading = false, finishing = false, done = false;
  bool writes_closed = false, reads_done = false;
  auto post_write = [&] {
    if (next < out.size()) {
      write_buffer = ToBuffer(out[next++]);
      call->Write(write_buffer, T(kWrite));
    } else {
      call->WritesDone(T(kWritesDone));
    }
    writing = true;
    ++pending;
  };
  auto post_read = [&] {
    call->Read(&read_buffer, T(kRead));
    reading = true;
    ++pending;
  };
  while (!done) {
    void* tag = nullptr;
    bool ok = false;
    const auto wait_until = start + kDeadline + std::chrono::seconds(20);
    if (cq.AsyncNext(&tag, &ok, wait_until) != grpc::CompletionQueue::GOT_EVENT) {
      Fail("client completion queue stalled on " + method.path);
    }
    --pending;
    switch (TagOf(tag)) {
      case kStart:
        if (!ok) {
          writes_closed = reads_done = true;
          break;
        }
        post_write();
        post_read();
        break;
      case kWrite:
        writing = false;
        if (ok) {
          post_write();
        } else {
          writes_closed = true;
        }
        break;
      case kWritesDone:
        writing = false;
        writes_closed = true;
        break;
      case kRead:
        reading = false;
        if (!ok) {
          reads_done = true;
          break;
        }
        result.responses.push_back(ToString(read_buffer));
        if (endless || result.responses.size() >= kMaxResponses) ctx.TryCancel();
        post_read();
        break;
      case kFinish:
        done = true;
        break;
    }
    if (!done && !finishing && !writing && !reading && writes_closed && reads_done) {
      grpc::Status* status = &result.status;
      call->Finish(status, T(kFinish));
      finishing = true;
      ++pending;
    }
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  const auto elapsed = std::chrono::system_clock::now() - start;

  const int code = static_cast<int>(result.status.error_code());
  if (code < 0 || code > 16) Fail(method.path + ": status code " + std::to_string(code));
  if (++stats_[method.path][code] == 1)
    first_messages_[method.path][code] = result.status.error_message();
  if (result.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && elapsed >= kDeadline) {
    Fail(method.path + ": no answer within " + std::to_string(kDeadline.count()) + " s (hang)");
  }
  if (result.status.ok() && !server_streaming && result.responses.size() != 1) {
    Fail(method.path + ": OK with " + std::to_string(result.responses.size()) + " responses");
  }
  static const bool trace = std::getenv("KVTIER_FUZZ_TRACE") != nullptr;
  if (trace) {
    std::fprintf(stderr, "%s -> %d %s\n", method.path.c_str(), code,
                 result.status.error_message().c_str());
  }
  for (const std::string& bytes : result.responses) {
    std::unique_ptr<Message> response = NewMessage(method.descriptor->output_type());
    if (!response->ParseFromString(bytes)) {
      Fail(method.path + ": a response does not parse as " +
           method.descriptor->output_type()->full_name());
    }
    if (trace) std::fprintf(stderr, "  %.300s\n", response->ShortDebugString().c_str());
    Record(*response);
  }
  return result;
}

void RpcHarness::Cleanup() {
  const int close = MethodIndex("/kvtier.v1.KvTier/CloseContext");
  const int release = MethodIndex("/kvtier.v1.KvTier/Release");
  const std::vector<uint64_t> contexts = std::move(context_ids_);
  const std::vector<uint64_t> leases = std::move(lease_ids_);
  context_ids_.clear();
  lease_ids_.clear();
  slots_.clear();
  for (uint64_t id : contexts) {
    if (close < 0) break;
    std::unique_ptr<Message> m = NewMessage(methods_[close].descriptor->input_type());
    m->GetReflection()->SetUInt64(m.get(), m->GetDescriptor()->FindFieldByName("context_id"), id);
    Call(methods_[close], {m->SerializeAsString()});
  }
  for (uint64_t id : leases) {
    if (release < 0) break;
    std::unique_ptr<Message> m = NewMessage(methods_[release].descriptor->input_type());
    m->GetReflection()->SetUInt64(m.get(), m->GetDescriptor()->FindFieldByName("lease_id"), id);
    Call(methods_[release], {m->SerializeAsString()});
  }
  context_ids_.clear();
  lease_ids_.clear();
  slots_.clear();
}

void RpcHarness::RunInput(absl::string_view input) {
  size_t calls = 0;
  for (absl::string_view call : absl::StrSplit(input, kCallSeparator)) {
    if (calls++ == kMaxCalls) break;
    if (call.empty()) continue;
    const Method& method = methods_[static_cast<uint8_t>(call[0]) % methods_.size()];
    std::vector<std::string> messages;
    for (absl::string_view m : absl::StrSplit(call.substr(1), kMessageSeparator)) {
      if (messages.size() == kMaxMessages) break;
      messages.emplace_back(m);
    }
    Call(method, messages);
  }
  Cleanup();
}

}  // namespace kvtier::fuzz
