// kvtier-eval --calibrate on a real dump: how a competing sink is weighed,
// the copy-tracking fields written as given, the JSON round trip, and the
// committed calibrations valid for their models' layout.
#include "bench/quality/calibrate.h"

#include <string>

#include "gtest/gtest.h"
#include "index/select/calibration.h"
#include "tests/testutil/status_matchers.h"

namespace kvtier::quality {
namespace {

using ::kvtier::testing::StatusIs;

class CalibrateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<KvDump> d =
        LoadKvDump(std::string(KVTIER_REALKV_DIR) + "/rk-persuasion-window-00.safetensors");
    if (!d.ok()) GTEST_SKIP() << "no shared dump: " << d.status();
    dump_ = std::move(*d);
  }

  // The prior and sink alone (no head search: fast).
  CalibrateOptions Options() const {
    CalibrateOptions o;
    o.max_heads = 0;
    return o;
  }

  KvDump dump_;
};

// austen-byte gives its first block under 1% of its attention: the sink
// competes, with sink_weight times its measured attention.
TEST_F(CalibrateTest, ACompetingSinkCountsSinkWeightTimesItsAttention) {
  CalibrateOptions o = Options();
  o.sink_weight = 1.0;
  absl::StatusOr<CalibrationResult> one = Calibrate(dump_, o);
  ASSERT_OK(one) << one.status();
  o.sink_weight = 2.0;
  absl::StatusOr<CalibrationResult> two = Calibrate(dump_, o);
  ASSERT_OK(two) << two.status();
  EXPECT_LT(one->sink_share, o.min_sink_share);
  EXPECT_EQ(two->calibration.sink_blocks, 0);
  EXPECT_GT(one->calibration.sink_mass, 0.0f);
  EXPECT_FLOAT_EQ(two->calibration.sink_mass, 2 * one->calibration.sink_mass);
  EXPECT_FLOAT_EQ(two->calibration.sink_mass_all, 2 * one->calibration.sink_mass_all);
  EXPECT_EQ(two->calibration.prior, one->calibration.prior);
  // A sink kept always (the share threshold below the measured share)
  // carries no sink mass, whatever the weight.
  o.min_sink_share = 0.0;
  absl::StatusOr<CalibrationResult> kept = Calibrate(dump_, o);
  ASSERT_OK(kept) << kept.status();
  EXPECT_EQ(kept->calibration.sink_blocks, 1);
  EXPECT_EQ(kept->calibration.sink_mass, -1.0f);
  o.sink_weight = -1;
  EXPECT_THAT(Calibrate(dump_, o),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("sink_weight")));
}

TEST_F(CalibrateTest, CopyFieldsAreWrittenAndReadBack) {
  CalibrateOptions o = Options();
  o.copy_run = 6;
  o.copy_hold = 64;
  o.copy_min_blocks = 4;
  o.copy_lead = 1;
  o.copy_min_mass = 0.05f;
  o.uncopied_weight = 0.0f;
  o.copy_weight = 8.0f;
  absl::StatusOr<CalibrationResult> r = Calibrate(dump_, o);
  ASSERT_OK(r) << r.status();
  EXPECT_EQ(r->calibration.copy_run, 6);
  EXPECT_EQ(r->calibration.copy_lead, 1);
  const std::string json = CalibrationToJson(*r);
  EXPECT_NE(json.find("\"copy_run\": 6"), std::string::npos) << json;
  EXPECT_NE(json.find("\"copy_weight\": 8"), std::string::npos) << json;
  absl::StatusOr<CalibrationResult> back = CalibrationFromJson(json);
  ASSERT_OK(back) << back.status();
  EXPECT_EQ(back->calibration, r->calibration);
  // Without copy tracking the fields are left out and read back as off.
  o.copy_run = 0;
  absl::StatusOr<CalibrationResult> off = Calibrate(dump_, o);
  ASSERT_OK(off) << off.status();
  const std::string plain = CalibrationToJson(*off);
  EXPECT_EQ(plain.find("copy_"), std::string::npos) << plain;
  back = CalibrationFromJson(plain);
  ASSERT_OK(back) << back.status();
  EXPECT_EQ(back->calibration, off->calibration);
}

TEST_F(CalibrateTest, CommittedCalibrationsFitTheirModels) {
  auto all = LoadCalibrations(KVTIER_CALIBRATION_DIR);
  ASSERT_OK(all) << all.status();
  ASSERT_EQ(all->count("austen-copy"), 1u);
  index::BlockLayout layout;
  layout.num_layers = dump_.num_layers;
  layout.num_kv_heads = dump_.num_kv_heads;
  layout.head_dim = dump_.head_dim;
  layout.block_size_tokens = 16;
  for (const auto& [model, c] : *all) {
    EXPECT_OK(index::ValidateCalibration(c, layout)) << model;
  }
  // The shipped copy model tracks copies one step ahead.
  const index::SelectionCalibration& copy = all->at("austen-copy");
  EXPECT_GT(copy.copy_run, 0);
  EXPECT_EQ(copy.copy_lead, 1);
}

}  // namespace
}  // namespace kvtier::quality
