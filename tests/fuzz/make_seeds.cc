// kvtier_fuzz_seeds CORPUS_DIR: writes the structured seed inputs of the
// fuzz targets into CORPUS_DIR/<target>/seed-* with the real encoders, so
// that the seeds follow the formats as they change. Regenerate after a
// change to a record format, the summary codec, the protos or the method
// list (a daemon_rpc input names its method by index). Found inputs kept
// next to the seeds (crash-*, found-*) are not touched.
//
// daemon_rpc seeds are run against a fresh daemon as they are written, and
// every call's status is printed, so a seed that no longer reaches what it
// was written for shows up.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "grpc/health/v1/health.pb.h"
#include "index/summary/summary_codec.h"
#include "kvtier/v1/admin.pb.h"
#include "kvtier/v1/kvtier.pb.h"
#include "storage/catalog/record_format.h"
#include "tests/fuzz/rpc_harness.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = kvtier::v1;
using kvtier::fuzz::CallSpec;

fs::path root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(root / target);
  std::ofstream(root / target / ("seed-" + name), std::ios::binary) << bytes;
}

// ---- catalog_record --------------------------------------------------------

void CatalogSeeds() {
  namespace cf = kvtier::catalog_format;
  // Raw (mode m) and, for checked values, sealed (mode m | 8: check dropped).
  auto both = [](const std::string& name, uint8_t mode, const std::string& encoded, bool checked) {
    Write("catalog_record", name, std::string(1, static_cast<char>(mode)) + encoded);
    if (checked) {
      Write("catalog_record", name + "-sealed",
            std::string(1, static_cast<char>(mode | 8)) + encoded.substr(0, encoded.size() - 4));
    }
  };
  both("block-key", 0, cf::EncodeBlockKey({"tenant-a", 7, "block-0001"}), false);
  kvtier::BlockRecord r;
  r.size_bytes = 4096;
  r.checksum = 0x1234567890abcdefull;
  r.created_micros = 1700000000000000;
  r.last_access_micros = 1700000000000001;
  both("block-record", 1, cf::EncodeBlockRecord(r), true);
  r.nvme = kvtier::NvmeExtent{1, 8192, 4096};
  r.durable = true;
  r.summary = std::string(40, 's');
  both("block-record-nvme", 1, cf::EncodeBlockRecord(r), true);
  kvtier::ModelProfile p;
  p.profile_id = 3;
  p.name = "qwen2.5-7b";
  p.revision = "main";
  p.layers = 28;
  p.kv_heads = 4;
  p.head_dim = 128;
  p.block_size_tokens = 16;
  both("profile", 2, cf::EncodeProfileRecord(p), true);
  p.calibration = std::string(24, 'c');
  p.owner = "tenant-a";
  both("profile-calibrated", 2, cf::EncodeProfileRecord(p), true);
  both("context-version-key", 3, cf::EncodeContextVersionKey({"t", 7, "ctx-1", 2}), false);
  kvtier::ContextVersionRecord c;
  c.version = 1;
  c.context_key = "ctx-1";
  c.block_ids = {"b0", "b1"};
  c.tokens = 32;
  c.retention = 0.5f;
  both("context-version-record", 4, cf::EncodeContextVersionRecord(c), false);
  both("u32", 5, cf::EncodeU32(1), false);
  both("u64", 6, cf::EncodeU64(42), false);
  both("prefix", 7, std::string("ab\xff\xff", 4), false);
}

// ---- summary_codec ---------------------------------------------------------

void SummarySeeds() {
  namespace ix = kvtier::index;
  ix::BlockSummary s;
  s.dim = 4;
  s.mean = {0.5f, -1.0f, 2.0f, 0.0f};
  auto emit = [](const std::string& name, const ix::BlockSummary& s, ix::SummaryEncoding enc,
                 bool int8) {
    ix::SummaryCodecOptions options;
    options.encoding = enc;
    options.layer_int8 = int8;
    auto blob = ix::EncodeSummary(s, options);
    if (!blob.ok()) {
      std::fprintf(stderr, "summary seed %s: %s\n", name.c_str(), blob.status().ToString().c_str());
      std::exit(1);
    }
    Write("summary_codec", name, std::string(1, '\0') + *blob);
    std::string sealed = *blob;
    sealed[20] ^= 0x55;  // the target recomputes it (mode 1)
    Write("summary_codec", name + "-sealed", std::string(1, '\1') + sealed);
  };
  emit("mean-fp32", s, ix::SummaryEncoding::kFp32, false);
  s.weighted_mean = {1.0f, 1.0f, 0.25f, -0.25f};
  s.weights_version = 3;
  s.min = {-1.0f, -2.0f, 0.0f, -0.5f};
  s.max = {1.0f, 0.0f, 3.0f, 0.5f};
  s.radius = 1.5f;
  emit("bounds-fp16", s, ix::SummaryEncoding::kFp16, false);
  s.num_layers = 2;
  s.layer_mean = {0.1f, 0.2f, 0.3f, 0.4f, -0.1f, -0.2f, -0.3f, -0.4f};
  emit("layers-int8", s, ix::SummaryEncoding::kFp16, true);
  s.layer_min = s.layer_mean;
  s.layer_max = s.layer_mean;
  s.key_heads = {0, 3};
  s.key_tokens = 2;
  s.head_keys.assign(2 * 2 * 4, 5);
  s.key_scales = {0.01f, 0.02f};
  emit("all-sections-fp16", s, ix::SummaryEncoding::kFp16, false);
  emit("all-sections-int8", s, ix::SummaryEncoding::kFp32, true);
}

// ---- config ----------------------------------------------------------------

void ConfigSeeds() {
  Write("config", "defaults", kvtier::daemon::DefaultConfigToml());
  Write("config", "small",
        "[server]\ndata_dir = \"/srv/kvtier\"\nsocket_mode = \"0600\"\n"
        "[tiers.host]\ncapacity_bytes = \"64MiB\"\n[tiers.nvme]\nfile_size_bytes = 1048576\n"
        "[select]\ntheta = 0.5\nstability_scorers = \"keykey, mass\"\n");
  Write("config", "overrides",
        std::string("[log]\nlevel = \"debug\"\n") + '\0' +
            "tiers.device.capacity_bytes=4MiB\nindex.summary_per_layer=true\n"
            "server.tcp_address=127.0.0.1:1\nserver.tls_cert_file=\"a.pem\"\n"
            "server.tls_key_file=b.pem\nselect.default_scorer=\"quest\"\n");
  Write("config", "syntax-error", "[server\ndata_dir = 'x'\n");
  Write("config", "unknown-key", "[tiers]\nplacment = \"lru\"\n");
}

// ---- daemon_rpc ------------------------------------------------------------

std::string FloatBlock(size_t bytes, int salt) {  // fp16 values, finite
  std::string out(bytes, '\0');
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    const uint16_t h = static_cast<uint16_t>(0x3000 + ((i * 37 + salt * 101) % 0x0c00));
    out[i] = static_cast<char>(h & 0xff);
    out[i + 1] = static_cast<char>(h >> 8);
  }
  return out;
}

// layers 2, kv heads 2, head_dim 8, 2 tokens, fp16: 256-byte blocks.
v1::RegisterProfileRequest Profile(bool calibrated) {
  v1::RegisterProfileRequest req;
  v1::ModelProfile* p = req.mutable_profile();
  p->set_name(calibrated ? "fuzz-calibrated" : "fuzz");
  p->set_revision("r1");
  p->set_num_layers(2);
  p->set_num_kv_heads(2);
  p->set_head_dim(8);
  p->set_block_size_tokens(2);
  p->set_dtype(v1::DTYPE_FP16);
  if (calibrated) {
    v1::SelectionCalibration* c = p->mutable_calibration();
    c->set_num_q_heads(4);
    v1::HeadRef* h = c->add_retrieval_heads();
    h->set_layer(1);
    h->set_q_head(2);
    for (float f : {0.5f, 0.25f, 0.125f}) c->add_prior(f);
    for (float f : {0.6f, 0.3f, 0.1f}) c->add_prior_all(f);
    c->add_head_weights(0.8f);
  }
  return req;
}
constexpr size_t kBlockBytes = 256;

v1::PutBlocksRequest Put(uint64_t profile, int first, int count, bool durable) {
  v1::PutBlocksRequest req;
  req.set_profile_id(profile);
  req.set_durable(durable);
  for (int i = first; i < first + count; ++i) {
    v1::BlockPut* b = req.add_blocks();
    b->set_block_id("b" + std::to_string(i));
    b->set_data(FloatBlock(kBlockBytes, i));
  }
  return req;
}

template <class M>
std::string S(const M& m) {
  return m.SerializeAsString();
}

std::string Ids(uint64_t profile, std::initializer_list<const char*> ids, int mode = -1) {
  v1::GetBlocksRequest req;  // fields 1, 2 match Lookup and DeleteBlocks
  req.set_profile_id(profile);
  for (const char* id : ids) req.add_block_ids(id);
  if (mode >= 0) req.set_mode(static_cast<v1::ReturnMode>(mode));
  return S(req);
}

std::string Open(uint64_t profile, std::vector<std::vector<std::string>> segments) {
  v1::OpenContextRequest req;
  req.set_profile_id(profile);
  for (const auto& seg : segments) {
    v1::Segment* s = req.add_segments();
    for (const auto& id : seg) s->add_block_ids(id);
  }
  return S(req);
}

std::string Select(uint64_t request_id, v1::Scorer scorer, size_t anchor, size_t query,
                   size_t head_queries, uint32_t budget) {
  v1::SelectRequest req;
  req.set_request_id(request_id);
  v1::ContextSelect* c = req.add_contexts();
  c->set_context_id(1);  // placeholder: the first context of this input
  c->set_scorer(scorer);
  c->set_max_blocks(budget);
  c->set_step(request_id);
  for (size_t i = 0; i < anchor; ++i) c->add_anchor(std::sin(static_cast<float>(i) + 1.0f));
  for (size_t i = 0; i < query; ++i) c->add_query(std::cos(static_cast<float>(i)));
  for (size_t i = 0; i < head_queries; ++i) c->add_head_queries(0.5f + static_cast<float>(i % 3));
  return S(req);
}

std::string Reflection(const std::string& field, const std::string& value) {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  const auto* type = pool->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionRequest");
  std::unique_ptr<google::protobuf::Message> m(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(type)->New());
  m->GetReflection()->SetString(m.get(), type->FindFieldByName(field), value);
  return m->SerializeAsString();
}

void DaemonSeeds() {
  std::unique_ptr<kvtier::fuzz::RpcHarness> h = kvtier::fuzz::RpcHarness::Start();
  auto seed = [&](const std::string& name, const std::vector<CallSpec>& calls) {
    Write("daemon_rpc", name, h->Encode(calls));
    std::printf("%-16s", name.c_str());
    for (const CallSpec& c : calls) {
      const auto& m = h->methods()[h->MethodIndex(c.method)];
      std::printf(" %s=%d", c.method.substr(c.method.rfind('/') + 1).c_str(),
                  static_cast<int>(h->Call(m, c.messages).status.error_code()));
    }
    std::printf("\n");
    h->Restart();  // each seed starts from an empty daemon, as when run alone
  };
  // One seed per method with an empty request (a valid encoding of each).
  for (const auto& m : h->methods()) {
    std::string name = m.path.substr(1);
    for (char& ch : name) ch = (ch == '/' || ch == '.') ? '-' : ch;
    seed("empty-" + name, {{m.path, {""}}});
  }
  const std::string kv = "/kvtier.v1.KvTier/";
  const std::string P = S(Profile(false)), PC = S(Profile(true));
  v1::ReleaseRequest release_lease, release_context;
  release_lease.set_lease_id(1);
  release_context.set_context_id(1);
  v1::CloseContextRequest close;
  close.set_context_id(1);
  v1::AppendBlocksRequest append;
  append.set_context_id(1);
  append.add_block_ids("b4");
  v1::GetProfileRequest get_profile;
  get_profile.set_profile_id(1);
  seed("blocks", {{kv + "RegisterProfile", {P}},
                  {kv + "PutBlocks", {S(Put(1, 0, 3, false)), S(Put(1, 3, 2, true))}},
                  {kv + "Lookup", {Ids(1, {"b0", "b1", "b9"})}},
                  {kv + "GetBlocks", {Ids(1, {"b0", "b4"}, v1::RETURN_MODE_BYTES)}},
                  {kv + "GetBlocks", {Ids(1, {"b1", "b2"}, v1::RETURN_MODE_HANDLES)}},
                  {kv + "Release", {S(release_lease)}},
                  {kv + "DeleteBlocks", {Ids(1, {"b0", "b9"})}},
                  {kv + "GetProfile", {S(get_profile)}}});
  seed("context",
       {{kv + "RegisterProfile", {P}},
        {kv + "PutBlocks", {S(Put(1, 0, 6, false))}},
        {kv + "OpenContext", {Open(1, {{"b0", "b1"}, {"b2", "b3"}})}},
        {kv + "AppendBlocks", {S(append)}},
        {kv + "Select",
         {Select(1, v1::SCORER_KEY_KEY, 8, 0, 0, 3), Select(2, v1::SCORER_KEY_KEY, 16, 0, 0, 3),
          Select(3, v1::SCORER_QUEST, 0, 8, 0, 2), Select(4, v1::SCORER_ARKVALE, 0, 8, 0, 2)}},
        {kv + "Release", {S(release_context)}},
        {kv + "CloseContext", {S(close)}}});
  seed("select-scorers",
       {{kv + "RegisterProfile", {P}},
        {kv + "PutBlocks", {S(Put(1, 0, 8, false))}},
        {kv + "OpenContext", {Open(1, {{"b0", "b1", "b2"}, {"b3", "b4", "b5"}})}},
        {kv + "Select",
         {Select(1, v1::SCORER_KEY_KEY_WEIGHTED, 8, 0, 0, 4),
          Select(2, v1::SCORER_KEYDIFF, 8, 0, 0, 4), Select(3, v1::SCORER_RECENCY, 0, 0, 0, 2),
          Select(4, v1::SCORER_RANDOM, 0, 0, 0, 2),
          Select(5, v1::SCORER_UNSPECIFIED, 0, 0, 0, 2)}}});
  seed("mass", {{kv + "RegisterProfile", {PC}},
                {kv + "PutBlocks", {S(Put(1, 0, 6, false))}},
                {kv + "OpenContext", {Open(1, {{"b0", "b1", "b2", "b3", "b4", "b5"}})}},
                {kv + "Select",
                 {Select(1, v1::SCORER_MASS, 0, 0, 8, 3), Select(2, v1::SCORER_MASS, 0, 0, 0, 3)}},
                {kv + "GetProfile", {S(get_profile)}}});
  v1::ReserveSlotsRequest reserve;
  reserve.set_profile_id(1);
  reserve.set_count(2);
  v1::PutBlocksRequest staged;
  staged.set_profile_id(1);
  for (int i = 1; i <= 2; ++i) {
    v1::BlockPut* b = staged.add_blocks();
    b->set_block_id("s" + std::to_string(i));
    b->mutable_slot()->set_slot_id(i);  // placeholder: the i-th reserved slot
  }
  seed("staging", {{kv + "RegisterProfile", {P}},
                   {kv + "OpenArena", {""}},
                   {kv + "ReserveSlots", {S(reserve)}},
                   {kv + "PutBlocks", {S(staged)}},
                   {kv + "Lookup", {Ids(1, {"s1", "s2"})}}});
  const std::string admin = "/kvtier.v1.Admin/";
  v1::ListBlocksRequest list;
  list.set_limit(10);
  seed("admin", {{kv + "RegisterProfile", {P}},
                 {kv + "PutBlocks", {S(Put(1, 0, 4, true))}},
                 {admin + "Stats", {""}},
                 {admin + "ListBlocks", {S(list)}},
                 {admin + "Verify", {""}},
                 {admin + "Drain", {""}},
                 {admin + "ListContexts", {""}}});
  grpc::health::v1::HealthCheckRequest health;
  health.set_service("kvtier.v1.KvTier");
  seed("health",
       {{"/grpc.health.v1.Health/Check", {S(health)}}, {"/grpc.health.v1.Health/Watch", {""}}});
  const std::string refl = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
  seed("reflection", {{refl,
                       {Reflection("list_services", "*"),
                        Reflection("file_containing_symbol", "kvtier.v1.KvTier"),
                        Reflection("file_by_filename", "kvtier/v1/admin.proto")}}});
  v1::PutBlocksRequest bad = Put(1, 0, 2, false);
  bad.mutable_blocks(0)->set_data("short");
  bad.mutable_blocks(1)->set_xxh3(1);
  seed("bad-puts", {{kv + "RegisterProfile", {P}},
                    {kv + "PutBlocks", {S(bad), S(Put(0, 0, 1, false))}},
                    {kv + "OpenContext", {Open(1, {{"b0", "b0"}})}},
                    {kv + "Select", {Select(1, v1::SCORER_KEY_KEY, 3, 0, 0, 1)}}});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR   (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  root = argv[1];
  CatalogSeeds();
  SummarySeeds();
  ConfigSeeds();
  DaemonSeeds();
  return 0;
}
