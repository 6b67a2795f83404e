#include "index/select/gpu_scoring.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/cuda/row_scorer.h"

namespace kvtier::index {
namespace {

// gpu::GpuStatus -> absl::Status (same codes, device_ops.h).
absl::Status ToStatus(const gpu::GpuStatus& s) {
  switch (s.code) {
    case gpu::GpuStatus::kOk:
      return absl::OkStatus();
    case gpu::GpuStatus::kInvalidArgument:
      return absl::InvalidArgumentError(s.message);
    case gpu::GpuStatus::kOutOfMemory:
      return absl::ResourceExhaustedError(s.message);
    case gpu::GpuStatus::kUnavailable:
      return absl::UnavailableError(s.message);
    case gpu::GpuStatus::kDeadlineExceeded:
      return absl::DeadlineExceededError(s.message);
    case gpu::GpuStatus::kInternal:
      break;
  }
  return absl::InternalError(s.message);
}

class CudaTable final : public RowBackend::Table {
 public:
  explicit CudaTable(std::unique_ptr<gpu::CudaRowTable> table) : table_(std::move(table)) {}
  int64_t capacity_rows() const override { return table_->capacity_rows(); }
  gpu::CudaRowTable* get() const { return table_.get(); }

 private:
  const std::unique_ptr<gpu::CudaRowTable> table_;
};

class CudaRowBackend final : public RowBackend {
 public:
  explicit CudaRowBackend(std::unique_ptr<gpu::CudaRowScorer> scorer)
      : scorer_(std::move(scorer)), name_(absl::StrCat("cuda:", scorer_->device())) {}

  // Device tables are shared by every scorer of the device.
  uint64_t family() const override { return 0x100 + static_cast<uint64_t>(scorer_->device()); }
  std::string name() const override { return name_; }

  absl::StatusOr<std::unique_ptr<Table>> NewTable(int32_t dim, int64_t capacity_rows) override {
    std::unique_ptr<gpu::CudaRowTable> table;
    if (absl::Status s = ToStatus(scorer_->NewTable(dim, capacity_rows, &table)); !s.ok()) {
      return s;
    }
    return std::unique_ptr<Table>(new CudaTable(std::move(table)));
  }

  absl::Status QueueWrite(Table* table, int64_t first_row, const uint16_t* rows,
                          int64_t count) override {
    return ToStatus(
        scorer_->QueueWrite(static_cast<CudaTable*>(table)->get(), first_row, rows, count));
  }

  absl::Status Score(absl::Span<const float> anchors, int32_t dim,
                     absl::Span<const Segment> segments, float* out) override {
    segments_.clear();
    for (const Segment& s : segments) {
      segments_.push_back({static_cast<const CudaTable*>(s.table)->get(), s.num_rows, s.anchor});
    }
    return ToStatus(scorer_->Score(anchors.data(), static_cast<int32_t>(anchors.size() / dim), dim,
                                   segments_, out));
  }

  void DiscardQueued() override { scorer_->DiscardQueued(); }

 private:
  const std::unique_ptr<gpu::CudaRowScorer> scorer_;
  const std::string name_;
  std::vector<gpu::CudaRowSegment> segments_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<LevelScorer>> NewCudaLevelScorer(int device_ordinal) {
  std::unique_ptr<gpu::CudaRowScorer> scorer;
  if (absl::Status s = ToStatus(gpu::CudaRowScorer::Create(device_ordinal, &scorer)); !s.ok()) {
    return s;
  }
  return NewMirroredLevelScorer(std::make_unique<CudaRowBackend>(std::move(scorer)));
}

}  // namespace kvtier::index
