// Reader and writer of the safetensors format (the realkv dumps, see
// /work/shared/data/realkv/README.md):
//
//   bytes [0, 8)          N: header length, little-endian uint64
//   bytes [8, 8 + N)      JSON object, one member per tensor:
//                           "name": {"dtype": "F16", "shape": [d0, ...],
//                                    "data_offsets": [begin, end]}
//                         plus an optional "__metadata__" object whose
//                         values are all strings
//   bytes [8 + N, EOF)    tensor data, little endian, row-major; a tensor's
//                         bytes are [8 + N + begin, 8 + N + end)
//
// Every tensor is checked at parse time: known dtype (F16, BF16, F32, F64,
// I32, I64, U8, ...; only F16, BF16, F32 and I32 can be read as values),
// non-negative shape with rank <= kMaxRank, begin <= end <= data size, and
// end - begin == product(shape) * dtype size. Limits: N <= kMaxHeaderBytes,
// file <= kMaxFileBytes.
//
// Errors are InvalidArgument naming the file (when known), the tensor and
// the problem: "bad header length", "JSON header parse error", "dtype
// unsupported", "data_offsets out of range", "shape mismatch".
//
// Thread safety: a SafetensorsFile is immutable after Parse; const methods
// may be called from many threads.
#ifndef KVTIER_BENCH_QUALITY_SAFETENSORS_H_
#define KVTIER_BENCH_QUALITY_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvtier::quality {

inline constexpr uint64_t kMaxHeaderBytes = uint64_t{16} << 20;  // 16 MiB
inline constexpr uint64_t kMaxFileBytes = uint64_t{16} << 30;    // 16 GiB
inline constexpr int kMaxRank = 8;

enum class TensorDtype : uint8_t {
  kF16,
  kBF16,
  kF32,
  kF64,
  kI8,
  kI16,
  kI32,
  kI64,
  kU8,
  kU16,
  kU32,
  kU64,
  kBool,
};

// "F16", "BF16", ...; the names used in the header.
absl::string_view TensorDtypeName(TensorDtype dtype);
int TensorDtypeSizeBytes(TensorDtype dtype);

struct TensorInfo {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // relative to the first data byte
  uint64_t end = 0;
  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  // Parses a whole file held in `bytes` (kept by the object). `label`
  // names the file in error messages.
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes, absl::string_view label);
  // Reads and parses `path`.
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const TensorInfo* Find(absl::string_view name) const;
  // The raw bytes of a tensor of this file.
  absl::string_view Data(const TensorInfo& tensor) const;

  // Tensor `name` converted to float (F16, BF16, F32). InvalidArgument when
  // absent, of another dtype, or when `shape` is not empty and differs.
  absl::StatusOr<std::vector<float>> ReadFloat(absl::string_view name,
                                               const std::vector<int64_t>& shape) const;
  // Tensor `name` as int32 (I32 only).
  absl::StatusOr<std::vector<int32_t>> ReadInt32(absl::string_view name,
                                                 const std::vector<int64_t>& shape) const;

  const std::string& label() const { return label_; }

 private:
  SafetensorsFile() = default;
  absl::Status Check(absl::string_view name, TensorDtype want, const std::vector<int64_t>& shape,
                     const TensorInfo** out) const;

  std::string label_;
  std::string bytes_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: raw little-endian bytes of `dtype` and `shape`.
struct TensorToWrite {
  std::string name;
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> shape;
  std::string data;
};

// Serialises tensors (in the given order) and metadata to the format above.
// InvalidArgument when a tensor's data size disagrees with its shape.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors, const std::map<std::string, std::string>& metadata);

// Writes `bytes` to `path` (truncating). Errors from the file system.
absl::Status WriteFile(const std::string& path, absl::string_view bytes);

}  // namespace kvtier::quality

#endif  // KVTIER_BENCH_QUALITY_SAFETENSORS_H_
