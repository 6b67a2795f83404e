// Shapes and parameters of the device-tier kernels (gpu/cuda/kernels.h),
// as plain structs passed by value to the kernels. Plain C++: the CPU
// references (tests/gpu/kernel_reference.h) use the same structs, and this
// header compiles without CUDA.
//
// Every pointer in a *Params struct is device memory unless noted; shapes
// are written next to each pointer, row-major, outermost first.
#ifndef KVTIER_GPU_CUDA_KERNEL_SHAPES_H_
#define KVTIER_GPU_CUDA_KERNEL_SHAPES_H_

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define KVTIER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KVTIER_HOST_DEVICE inline
#endif

namespace kvtier::gpu {

// Element type of key/value payloads and level vectors. The values equal
// kvtier::index::Dtype's.
enum class ElementType : uint8_t {
  kFp16 = 1,  // IEEE 754 binary16
  kBf16 = 2,  // bfloat16
  kFp32 = 3,  // IEEE 754 binary32
};

KVTIER_HOST_DEVICE int ElementSizeBytes(ElementType type) {
  return type == ElementType::kFp32                                   ? 4
         : (type == ElementType::kFp16 || type == ElementType::kBf16) ? 2
                                                                      : 0;
}

// One KV block payload: [layer][k|v][kv_head][token][dim] elements of
// dtype, i.e. L x 2 x H x T x D elements (index/summary/block_layout.h).
struct KvBlockShape {
  int32_t num_layers = 0;    // L
  int32_t num_kv_heads = 0;  // H
  int32_t block_tokens = 0;  // T
  int32_t head_dim = 0;      // D
  ElementType dtype = ElementType::kFp16;

  // Element index of key (layer l, head h, token t, dim d) in a block.
  KVTIER_HOST_DEVICE int64_t KeyIndex(int32_t l, int32_t h, int32_t t, int32_t d) const {
    return ((static_cast<int64_t>(l) * 2 * num_kv_heads + h) * block_tokens + t) * head_dim + d;
  }
  KVTIER_HOST_DEVICE int64_t BlockElements() const {
    return static_cast<int64_t>(num_layers) * 2 * num_kv_heads * block_tokens * head_dim;
  }
  KVTIER_HOST_DEVICE int64_t BlockBytes() const {
    return BlockElements() * ElementSizeBytes(dtype);
  }
};

// ---- Limits (Check*Params enforce them before any launch) ---------------
inline constexpr int32_t kMaxKernelLayers = 1024;
inline constexpr int32_t kMaxKernelKvHeads = 1024;
inline constexpr int32_t kMaxKernelBlockTokens = 65536;
inline constexpr int32_t kMaxKernelHeadDim = 1024;  // one thread per dim
inline constexpr int64_t kMaxKernelBlockBytes = int64_t{1} << 31;
inline constexpr int32_t kMaxPoolBlocks = 1 << 20;  // per launch
inline constexpr int64_t kMaxScoreRows = int64_t{1} << 26;
inline constexpr int32_t kMaxScoreDim = 1024;
inline constexpr int32_t kMaxAnchors = 4096;  // per launch

// ---- (a) Key pooling for blocks already in the arena --------------------
//
// For each block b (its payload starts at arena + block_offsets[b]):
//   mean[b][d]          = mean over l < L, h < H, t < T of K[l][h][t][d]
//   weighted_mean[b][d] = sum_{l,h} w[l][h] * mean_t K[l][h][t][d] / sum w
//   min[b][d], max[b][d] over l, h, t
//   layer_mean/min/max[b][l][d] the same over h, t for layer l
// with w = head_weights. Accumulation is fp32 in a fixed order, so results
// are deterministic run to run.
enum PoolFlag : uint32_t {
  kPoolOk = 0,
  kPoolNonFinite = 1,  // a key was NaN or Inf; outputs are unspecified
  kPoolBadOffset = 2,  // the block lies outside the arena or is misaligned;
                       // it was not read and its outputs are NaN
};

struct PoolKeysParams {
  KvBlockShape shape;
  const std::byte* arena = nullptr;  // device, arena_bytes bytes
  uint64_t arena_bytes = 0;
  const uint64_t* block_offsets = nullptr;  // [num_blocks] byte offsets
  int32_t num_blocks = 0;                   // 1..kMaxPoolBlocks
  const float* head_weights = nullptr;      // [L][H] or null
  // Outputs (fp32). mean and flags are required; the rest may be null.
  float* mean = nullptr;           // [num_blocks][D]
  float* weighted_mean = nullptr;  // [num_blocks][D]; needs head_weights
  float* min = nullptr;            // [num_blocks][D]
  float* max = nullptr;            // [num_blocks][D]
  float* layer_mean = nullptr;     // [num_blocks][L][D]
  float* layer_min = nullptr;      // [num_blocks][L][D]
  float* layer_max = nullptr;      // [num_blocks][L][D]
  uint32_t* flags = nullptr;       // [num_blocks] PoolFlag bits
};

// ---- (b) Scoring of stacked level vectors against anchors ---------------
//
//   kDot         scores[a][r] = anchors[a] . levels[r]
//   kCosineUnit  scores[a][r] = (1 + cos(anchors[a], levels[r])) / 2, in
//                [0, 1]; a zero vector has cos 0 (score 0.5). The same
//                mapping as index::ScorerKind::kKeyKey.
// Non-finite inputs: a row or an anchor holding a NaN or Inf element
// scores NaN with both kinds (the CPU reference agrees), and TopK ranks NaN
// last. Norms are accumulated in fp32: finite rows whose squared norm
// overflows (elements beyond ~1e18) score as zero vectors under kCosineUnit.
enum class ScoreKind : uint8_t { kDot = 0, kCosineUnit = 1 };

struct ScoreParams {
  const void* levels = nullptr;  // [num_rows][row_stride] of levels_type
                                 // (fp32 or fp16); row r is elements
                                 // [r * row_stride, r * row_stride + dim)
  ElementType levels_type = ElementType::kFp32;
  int64_t num_rows = 0;            // N, 1..kMaxScoreRows
  int64_t row_stride = 0;          // >= dim, in elements
  int32_t dim = 0;                 // D, 1..kMaxScoreDim
  const float* anchors = nullptr;  // [num_anchors][dim]
  int32_t num_anchors = 0;         // B, 1..kMaxAnchors
  ScoreKind kind = ScoreKind::kCosineUnit;
  float* scores = nullptr;  // [num_anchors][num_rows]
};

// ---- Top-K per anchor -----------------------------------------------------
//
// For each anchor a: the k rows with the largest scores[a][r], exact (radix
// select over the fp32 bit pattern, three passes of 11, 11 and 10 bits).
// Ties at the k-th value go to the lowest rows, so the set is the same on
// every run and equals a stable descending sort's first k. Output order:
// the rows greater than the k-th value in ascending row order, then the
// rows equal to it in ascending row order. NaN ranks below every number;
// -0.0 and +0.0 tie.
struct TopKParams {
  const float* scores = nullptr;  // [num_anchors][num_rows]
  int64_t num_rows = 0;           // N, 1..kMaxScoreRows
  int32_t num_anchors = 0;        // B, 1..kMaxAnchors
  int32_t k = 0;                  // 1..N
  int32_t* indices = nullptr;     // [num_anchors][k] row numbers
  float* values = nullptr;        // [num_anchors][k] their scores (may be null)
};

// ---- (c) Segmented scoring: many tables, one anchor per segment -----------
//
// The Selector's levels of many contexts scored in one launch. Segment s
// names num_rows fp16 rows of dim elements (contiguous, row stride = dim)
// and the anchor they are scored against:
//   scores[segments[s].out_offset + i] = anchors[segments[s].anchor] . row_i
// accumulated in fp32 (raw dot products: the index maps them to
// affinities). Segments are stacked in order: segments[0].out_offset == 0
// and out_offset[s + 1] = out_offset[s] + num_rows[s], total_rows in all.
// The launcher cannot read the device-side segment table: callers build it
// consistently (index/select/gpu_scoring.cc does).
struct RowSegment {
  const uint16_t* rows = nullptr;  // device, fp16 bits [num_rows][dim]
  int64_t num_rows = 0;            // >= 1
  int64_t out_offset = 0;
  int32_t anchor = 0;  // 0..num_anchors-1
  int32_t reserved = 0;
};

struct SegmentScoreParams {
  const RowSegment* segments = nullptr;  // device [num_segments]
  int32_t num_segments = 0;              // 1..kMaxSegments
  int64_t total_rows = 0;                // 1..kMaxScoreRows
  const float* anchors = nullptr;        // device [num_anchors][dim] fp32
  int32_t num_anchors = 0;               // 1..kMaxSegmentAnchors
  int32_t dim = 0;                       // 1..kMaxScoreDim
  float* scores = nullptr;               // device [total_rows]
};

inline constexpr int32_t kMaxSegments = 1 << 20;
inline constexpr int32_t kMaxSegmentAnchors = 1 << 20;

}  // namespace kvtier::gpu

#endif  // KVTIER_GPU_CUDA_KERNEL_SHAPES_H_
