#include "index/select/level_scorer.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"

namespace kvtier::index {
namespace {

// ---- host backend -------------------------------------------------------

class HostTable final : public RowBackend::Table {
 public:
  HostTable(int32_t dim, int64_t capacity_rows)
      : dim_(dim), capacity_rows_(capacity_rows), rows_(static_cast<size_t>(capacity_rows) * dim) {}
  int64_t capacity_rows() const override { return capacity_rows_; }
  int32_t dim() const { return dim_; }
  uint16_t* rows() { return rows_.data(); }
  const uint16_t* rows() const { return rows_.data(); }

 private:
  const int32_t dim_;
  const int64_t capacity_rows_;
  std::vector<uint16_t> rows_;
};

class HostRowBackend final : public RowBackend {
 public:
  uint64_t family() const override { return 1; }
  std::string name() const override { return "host"; }

  absl::StatusOr<std::unique_ptr<Table>> NewTable(int32_t dim, int64_t capacity_rows) override {
    if (dim < 1 || capacity_rows < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("NewTable: dim ", dim, ", capacity_rows ", capacity_rows));
    }
    return std::unique_ptr<Table>(new HostTable(dim, capacity_rows));
  }

  absl::Status QueueWrite(Table* table, int64_t first_row, const uint16_t* rows,
                          int64_t count) override {
    auto* host = static_cast<HostTable*>(table);
    if (first_row < 0 || count < 1 || first_row > host->capacity_rows() - count) {
      return absl::InvalidArgumentError(absl::StrCat("QueueWrite: rows [", first_row, ", +", count,
                                                     ") outside ", host->capacity_rows()));
    }
    // Staged now, applied at Score: the order a device sees them in.
    Write w{host, first_row, std::vector<uint16_t>(rows, rows + count * host->dim())};
    writes_.push_back(std::move(w));
    return absl::OkStatus();
  }

  absl::Status Score(absl::Span<const float> anchors, int32_t dim,
                     absl::Span<const Segment> segments, float* out) override {
    for (Write& w : writes_) {
      std::memcpy(w.table->rows() + w.first_row * w.table->dim(), w.rows.data(),
                  w.rows.size() * sizeof(uint16_t));
    }
    writes_.clear();
    for (const Segment& seg : segments) {
      const auto* table = static_cast<const HostTable*>(seg.table);
      if (table->dim() != dim || seg.num_rows > table->capacity_rows() ||
          static_cast<size_t>(seg.anchor + 1) * dim > anchors.size()) {
        return absl::InvalidArgumentError("Score: segment does not fit its table or anchors");
      }
      simd::DotRowsHalf(table->rows(), static_cast<size_t>(seg.num_rows), static_cast<size_t>(dim),
                        anchors.data() + seg.anchor * dim, out);
      out += seg.num_rows;
    }
    return absl::OkStatus();
  }

  void DiscardQueued() override { writes_.clear(); }

 private:
  struct Write {
    HostTable* table;
    int64_t first_row;
    std::vector<uint16_t> rows;
  };
  std::vector<Write> writes_;
};

// ---- the mirror of one context -------------------------------------------

enum Level { kGrids = 0, kChunks = 1, kPages = 2, kLevels = 3 };

// The backend's copy of one context's tree rows; synced[l] rows of level l
// are known to equal the tree's.
class LevelMirror final : public ContextAttachment {
 public:
  LevelMirror(uint64_t family, int32_t dim) : family_(family), dim_(dim) {}
  uint64_t family() const { return family_; }
  int32_t dim() const { return dim_; }
  std::unique_ptr<RowBackend::Table> tables[kLevels];
  int64_t synced[kLevels] = {0, 0, 0};
  void MarkStale() { std::fill(std::begin(synced), std::end(synced), 0); }

 private:
  const uint64_t family_;
  const int32_t dim_;
};

int64_t LevelRows(const ContextTree& t, int level) {
  return level == kGrids ? t.num_grids() : level == kChunks ? t.num_chunks() : t.num_pages();
}
const uint16_t* LevelData(const ContextTree& t, int level) {
  return level == kGrids ? t.grid_rows() : level == kChunks ? t.chunk_rows() : t.page_rows();
}

class MirroredLevelScorer final : public LevelScorer {
 public:
  explicit MirroredLevelScorer(std::unique_ptr<RowBackend> backend)
      : backend_(std::move(backend)) {}

  std::string name() const override { return backend_->name(); }

  absl::Status ScoreLevels(absl::Span<const LevelJob> jobs, float* out) override {
    // Usually one dim (one profile) per batch; jobs of other dims are
    // scored in further calls.
    dims_.clear();
    for (const LevelJob& job : jobs) {
      const int32_t d = job.context->tree().dim();
      if (std::find(dims_.begin(), dims_.end(), d) == dims_.end()) dims_.push_back(d);
    }
    offsets_.assign(jobs.size() + 1, 0);
    for (size_t j = 0; j < jobs.size(); ++j) {
      const ContextTree& t = jobs[j].context->tree();
      offsets_[j + 1] = offsets_[j] + t.num_grids() + t.num_chunks() + t.num_pages();
    }
    for (int32_t dim : dims_) {
      if (absl::Status s = ScoreDim(jobs, dim, out); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  // Scores the jobs of one dim into their slices of out.
  absl::Status ScoreDim(absl::Span<const LevelJob> jobs, int32_t dim, float* out) {
    const bool alone = dims_.size() == 1;
    anchors_.clear();
    segments_.clear();
    touched_.clear();
    pending_.clear();
    absl::Status status;
    for (size_t j = 0; j < jobs.size() && status.ok(); ++j) {
      const ContextTree& t = jobs[j].context->tree();
      if (t.dim() != dim) continue;
      LevelMirror* mirror = MirrorOf(jobs[j].context, dim);
      touched_.push_back(mirror);
      const int32_t anchor = static_cast<int32_t>(anchors_.size() / dim);
      anchors_.insert(anchors_.end(), jobs[j].unit_anchor, jobs[j].unit_anchor + dim);
      for (int level = 0; level < kLevels && status.ok(); ++level) {
        status = Sync(t, level, mirror);
        const int64_t rows = LevelRows(t, level);
        if (status.ok() && rows > 0) {
          segments_.push_back({mirror->tables[level].get(), rows, anchor});
        }
      }
    }
    float* target = out;
    if (status.ok() && !alone) {
      int64_t total = 0;
      for (const RowBackend::Segment& seg : segments_) total += seg.num_rows;
      scratch_.resize(static_cast<size_t>(total));
      target = scratch_.data();
    }
    if (status.ok() && !segments_.empty()) {
      status = backend_->Score(anchors_, dim, segments_, target);
    }
    if (!status.ok()) {
      backend_->DiscardQueued();
      for (LevelMirror* mirror : touched_) mirror->MarkStale();
      return absl::Status(status.code(),
                          absl::StrCat(backend_->name(), " level scoring: ", status.message()));
    }
    for (const Pending& p : pending_) p.mirror->synced[p.level] = p.rows;
    if (!alone) {  // scatter this dim's jobs into their slices
      const float* from = scratch_.data();
      for (size_t j = 0; j < jobs.size(); ++j) {
        if (jobs[j].context->tree().dim() != dim) continue;
        const size_t n = offsets_[j + 1] - offsets_[j];
        std::memcpy(out + offsets_[j], from, n * sizeof(float));
        from += n;
      }
    }
    return absl::OkStatus();
  }

  LevelMirror* MirrorOf(ContextIndex* context, int32_t dim) {
    auto* mirror = dynamic_cast<LevelMirror*>(context->attachment());
    if (mirror == nullptr || mirror->family() != backend_->family() || mirror->dim() != dim) {
      context->set_attachment(std::make_unique<LevelMirror>(backend_->family(), dim));
      mirror = static_cast<LevelMirror*>(context->attachment());
    }
    return mirror;
  }

  // Queues the rows of `level` the backend's copy lacks.
  absl::Status Sync(const ContextTree& t, int level, LevelMirror* mirror) {
    const int64_t rows = LevelRows(t, level);
    if (rows == 0) return absl::OkStatus();
    std::unique_ptr<RowBackend::Table>& table = mirror->tables[level];
    int64_t& synced = mirror->synced[level];
    if (table == nullptr || table->capacity_rows() < rows) {
      const int64_t capacity = std::max<int64_t>(64, rows + rows / 2);
      absl::StatusOr<std::unique_ptr<RowBackend::Table>> fresh =
          backend_->NewTable(t.dim(), capacity);
      if (!fresh.ok()) return fresh.status();
      table = std::move(*fresh);
      synced = 0;
    }
    if (synced > rows) synced = 0;  // trees only grow; be safe anyway
    // Pages never change once written; Append rewrites the last chunk and
    // the last grid, so those are sent again.
    const int64_t first = level == kPages ? synced : std::max<int64_t>(0, synced - 1);
    if (first < rows) {
      absl::Status s = backend_->QueueWrite(table.get(), first,
                                            LevelData(t, level) + first * t.dim(), rows - first);
      if (!s.ok()) return s;
    }
    pending_.push_back({mirror, level, rows});
    return absl::OkStatus();
  }

  struct Pending {
    LevelMirror* mirror;
    int level;
    int64_t rows;
  };

  const std::unique_ptr<RowBackend> backend_;
  // Scratch reused across batches.
  std::vector<int32_t> dims_;
  std::vector<size_t> offsets_;
  std::vector<float> anchors_;
  std::vector<RowBackend::Segment> segments_;
  std::vector<LevelMirror*> touched_;
  std::vector<Pending> pending_;
  std::vector<float> scratch_;
};

}  // namespace

std::unique_ptr<RowBackend> NewHostRowBackend() { return std::make_unique<HostRowBackend>(); }

std::unique_ptr<LevelScorer> NewMirroredLevelScorer(std::unique_ptr<RowBackend> backend) {
  return std::make_unique<MirroredLevelScorer>(std::move(backend));
}

}  // namespace kvtier::index
