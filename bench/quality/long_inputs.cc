#include "bench/quality/long_inputs.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "bench/quality/calibrate.h"

namespace kvtier::quality {

absl::Status LoadLongInputs(const std::string& dumps_dir, const std::string& calibration_dir,
                            std::vector<KvDump>* dumps, index::SelectionCalibration* copy) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dumps_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rkc-", 0) != 0 || e.path().extension() != ".safetensors") continue;
    absl::StatusOr<KvDump> d = LoadKvDump(e.path().string());
    if (!d.ok()) return d.status();
    dumps->push_back(std::move(*d));
  }
  if (dumps->empty()) {
    return absl::NotFoundError(absl::StrCat("no rkc-*.safetensors dumps in ", dumps_dir));
  }
  std::sort(dumps->begin(), dumps->end(),
            [](const KvDump& a, const KvDump& b) { return a.name < b.name; });
  absl::StatusOr<std::map<std::string, index::SelectionCalibration>> cals =
      LoadCalibrations(calibration_dir);
  if (!cals.ok()) return cals.status();
  if (!cals->count("austen-copy")) {
    return absl::NotFoundError(absl::StrCat("no austen-copy calibration in ", calibration_dir));
  }
  *copy = cals->at("austen-copy");
  copy->copy_run = 0;
  return absl::OkStatus();
}

index::SelectionCalibration PairedCalibration(const index::SelectionCalibration& copy) {
  index::SelectionCalibration c = copy;
  c.num_q_heads = 2;
  c.retrieval_heads.clear();
  for (int32_t l = 0; l < 4; ++l) {
    for (int32_t h = 0; h < 2; ++h) c.retrieval_heads.push_back({l, h});
  }
  c.head_weights.assign(8, 0.5f);
  c.softmax_scale = 0.125f;
  return c;
}

}  // namespace kvtier::quality
