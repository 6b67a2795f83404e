// GPU scoring for Select: the pooled key-key tree levels of every open
// context kept in HBM and scored there, a whole Select batch at once.
//
// NewCudaLevelScorer(device) is the mirrored LevelScorer (level_scorer.h)
// over gpu::CudaRowScorer (gpu/cuda/row_scorer.h): each context's grid,
// chunk and page rows live in device tables attached to the context (freed
// when it closes) and are brought up to date incrementally; each batch is
// one sequence on the scorer's stream: the new rows, the anchors and the
// segment table in one batched copy, one segmented scoring launch over
// every context of the batch, one copy of the scores back, one wait. The
// Selector ranks from those scores exactly as its CPU one-pass algorithm
// does (masks, sinks and local window, stability, budget); stability
// windows stay on the host with the context.
//
// Errors: Unavailable without CUDA in this build or without a usable
// device (the daemon then scores on the CPU), InvalidArgument for an
// ordinal that names no device. Scoring errors come back from ScoreLevels;
// the Selector then scores that batch on the CPU.
//
// Thread safety: as LevelScorer: one thread at a time per scorer; each
// Selector makes its own (one CUDA stream each).
#ifndef KVTIER_INDEX_SELECT_GPU_SCORING_H_
#define KVTIER_INDEX_SELECT_GPU_SCORING_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "index/select/level_scorer.h"

namespace kvtier::index {

// Batches with fewer stacked level rows than this stay on the CPU when the
// daemon scores on a GPU: below it the device round trip (copies, launch,
// wait: tens of microseconds) costs more than the CPU descent. An estimate
// until it is measured on a device (docs/GPU.md).
inline constexpr int64_t kDefaultGpuMinRows = 4096;

absl::StatusOr<std::unique_ptr<LevelScorer>> NewCudaLevelScorer(int device_ordinal);

}  // namespace kvtier::index

#endif  // KVTIER_INDEX_SELECT_GPU_SCORING_H_
