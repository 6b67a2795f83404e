#include "bench/quality/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "bench/quality/kv_dump.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/kernels/simd.h"
#include "tests/testutil/status_matchers.h"
#include "tests/testutil/temp_dir.h"

using ::kvtier::testing::StatusIs;

namespace kvtier::quality {
namespace {

using ::testing::HasSubstr;

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// A file with an 8-byte prefix, `header` and `data` as given.
std::string RawFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

// A file in a scratch directory that lives as long as the returned object.
struct TempFile {
  explicit TempFile(const char* name) : path(dir.File(std::string(name) + ".safetensors")) {}
  testing::ScopedTempDir dir{"safetensors"};
  std::string path;
};

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  std::vector<TensorToWrite> t;
  t.push_back({"a", TensorDtype::kF32, {2, 3}, Bytes({1, 2, 3, 4, 5, 6})});
  std::string half(4, '\0');
  const uint16_t h[2] = {index::simd::FloatToHalf(0.5f), index::simd::FloatToHalf(-2.0f)};
  std::memcpy(half.data(), h, 4);
  t.push_back({"b", TensorDtype::kF16, {2}, half});
  absl::StatusOr<std::string> bytes = SerializeSafetensors(t, {{"k", "v \"quoted\""}});
  ASSERT_OK(bytes) << bytes.status();
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Parse(*bytes, "mem");
  ASSERT_OK(f) << f.status();
  EXPECT_EQ(f->metadata().at("k"), "v \"quoted\"");
  absl::StatusOr<std::vector<float>> a = f->ReadFloat("a", {2, 3});
  ASSERT_OK(a) << a.status();
  EXPECT_EQ(*a, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  absl::StatusOr<std::vector<float>> b = f->ReadFloat("b", {});
  ASSERT_OK(b);
  EXPECT_EQ(*b, (std::vector<float>{0.5f, -2.0f}));
  // Wrong expected shape and missing tensors are named.
  EXPECT_THAT(f->ReadFloat("a", {3, 2}).status().message(), HasSubstr("shape mismatch"));
  EXPECT_THAT(f->ReadFloat("zzz", {}).status().message(), HasSubstr("\"zzz\" is missing"));
  EXPECT_THAT(f->ReadInt32("a", {}).status().message(), HasSubstr("dtype unsupported"));
}

TEST(SafetensorsTest, RejectsBadHeaderLength) {
  EXPECT_THAT(SafetensorsFile::Parse("abc", "f").status().message(),
              HasSubstr("bad header length"));
  std::string f = RawFile("{}", "");
  f[0] = 100;  // claims 100 header bytes, 2 follow
  absl::Status s = SafetensorsFile::Parse(f, "f").status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr("bad header length"));
  std::string huge = RawFile("{}", "");
  huge[7] = 1;  // 2^56 bytes
  EXPECT_THAT(SafetensorsFile::Parse(huge, "f").status().message(), HasSubstr("exceeds the limit"));
}

TEST(SafetensorsTest, RejectsJsonErrors) {
  EXPECT_THAT(SafetensorsFile::Parse(RawFile("{\"a\":", ""), "f").status().message(),
              HasSubstr("JSON header parse error"));
  EXPECT_THAT(SafetensorsFile::Parse(RawFile("[1]", ""), "f").status().message(),
              HasSubstr("not an object"));
}

TEST(SafetensorsTest, RejectsUnsupportedDtype) {
  const std::string h = R"({"x":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})";
  absl::Status s = SafetensorsFile::Parse(RawFile(h, "a"), "f").status();
  EXPECT_THAT(s.message(), HasSubstr("tensor \"x\""));
  EXPECT_THAT(s.message(), HasSubstr("dtype unsupported"));
}

TEST(SafetensorsTest, RejectsOffsetsOutOfRange) {
  const std::string h = R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  absl::Status s = SafetensorsFile::Parse(RawFile(h, std::string(12, '\0')), "f").status();
  EXPECT_THAT(s.message(), HasSubstr("data_offsets [0, 16] out of range"));
  const std::string reversed = R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})";
  EXPECT_THAT(
      SafetensorsFile::Parse(RawFile(reversed, std::string(8, '\0')), "f").status().message(),
      HasSubstr("out of range"));
}

TEST(SafetensorsTest, RejectsShapeMismatch) {
  const std::string h = R"({"x":{"dtype":"F16","shape":[2,3],"data_offsets":[0,8]}})";
  absl::Status s = SafetensorsFile::Parse(RawFile(h, std::string(8, '\0')), "f").status();
  EXPECT_THAT(s.message(), HasSubstr("shape mismatch"));
  EXPECT_THAT(s.message(), HasSubstr("needs 12 bytes"));
}

TEST(SafetensorsTest, RejectsTruncatedDumpFile) {
  SyntheticDumpOptions o;
  o.seq_len = 64;
  absl::StatusOr<KvDump> d = MakeSyntheticDump(o);
  ASSERT_OK(d) << d.status();
  absl::StatusOr<std::string> bytes = SerializeKvDump(*d);
  ASSERT_OK(bytes);
  const TempFile file("dump");
  const std::string& path = file.path;
  ASSERT_OK(WriteFile(path, *bytes));
  absl::StatusOr<KvDump> back = LoadKvDump(path);
  ASSERT_OK(back) << back.status();
  EXPECT_EQ(back->seq_len, 64);
  EXPECT_EQ(back->k.size(), d->k.size());
  EXPECT_EQ(back->tokens, d->tokens);

  // Cut the data: the last tensor's offsets run past the end.
  ASSERT_OK(WriteFile(path, bytes->substr(0, bytes->size() - 10)));
  absl::Status s = LoadKvDump(path).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("out of range"));
  // Cut inside the header.
  ASSERT_OK(WriteFile(path, bytes->substr(0, 40)));
  EXPECT_THAT(LoadKvDump(path).status().message(), HasSubstr("bad header length"));
  ::unlink(path.c_str());
  EXPECT_THAT(LoadKvDump(path).status(), StatusIs(absl::StatusCode::kNotFound));
}

TEST(KvDumpTest, RejectsInconsistentShapesAndMetadata) {
  SyntheticDumpOptions o;
  o.seq_len = 32;
  absl::StatusOr<KvDump> d = MakeSyntheticDump(o);
  ASSERT_OK(d);
  d->metadata["layers"] = "7";
  absl::StatusOr<std::string> bytes = SerializeKvDump(*d);
  ASSERT_OK(bytes);
  // SerializeKvDump rewrites the shape fields: corrupt one by hand.
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Parse(*bytes, "m");
  ASSERT_OK(f);
  EXPECT_OK(KvDumpFromSafetensors(*f, "m"));
  std::map<std::string, std::string> meta = f->metadata();
  meta["head_dim"] = "31";
  std::vector<TensorToWrite> t;
  for (const TensorInfo& ti : f->tensors()) {
    t.push_back({ti.name, ti.dtype, ti.shape, std::string(f->Data(ti))});
  }
  absl::StatusOr<std::string> bad = SerializeSafetensors(t, meta);
  ASSERT_OK(bad);
  absl::StatusOr<SafetensorsFile> fb = SafetensorsFile::Parse(*bad, "m");
  ASSERT_OK(fb);
  EXPECT_THAT(KvDumpFromSafetensors(*fb, "m").status().message(),
              HasSubstr("metadata \"head_dim\" is 31"));
  // v with a different shape than k.
  t[3].shape[2] = 16;
  t[3].data.resize(t[3].data.size() / 2);
  absl::StatusOr<std::string> bad_v = SerializeSafetensors(t, f->metadata());
  ASSERT_OK(bad_v);
  absl::StatusOr<SafetensorsFile> fv = SafetensorsFile::Parse(*bad_v, "m");
  ASSERT_OK(fv);
  absl::Status s = KvDumpFromSafetensors(*fv, "m").status();
  EXPECT_THAT(s.message(), HasSubstr("tensor \"v\""));
  EXPECT_THAT(s.message(), HasSubstr("shape mismatch"));
}

TEST(KvDumpTest, NamesAndKinds) {
  EXPECT_EQ(DumpName("/x/y/rk-a-recall-03.safetensors"), "rk-a-recall-03");
  EXPECT_EQ(DumpKind("rk-a-recall-03"), "rk-a-recall");
  EXPECT_EQ(DumpKind("plain"), "plain");
  EXPECT_EQ(DumpKind("trailing-"), "trailing-");
}

}  // namespace
}  // namespace kvtier::quality
