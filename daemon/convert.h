// Conversions between kvtier.v1 messages and storage types, with request
// validation that names the proto field.
#ifndef KVTIER_DAEMON_CONVERT_H_
#define KVTIER_DAEMON_CONVERT_H_

#include "absl/status/statusor.h"
#include "index/select/calibration.h"
#include "index/summary/block_layout.h"
#include "kvtier/v1/kvtier.pb.h"
#include "kvtier/v1/types.pb.h"
#include "storage/catalog/records.h"
#include "storage/store/block_store.h"

namespace kvtier::daemon {

// INVALID_ARGUMENT naming "profile.<field>" for a bad field (the
// calibration included: "profile.calibration.prior[3]: ..."). A valid
// calibration is stored in ModelProfile::calibration as its proto bytes.
absl::StatusOr<ModelProfile> FromProto(const v1::ModelProfile& proto);
v1::ModelProfile ToProto(const ModelProfile& profile);

// The index layout of a profile's blocks.
index::BlockLayout LayoutOf(const ModelProfile& profile);

// The profile's selection calibration (uncalibrated when it has none).
// DATA_LOSS when the stored bytes do not parse or no longer validate.
absl::StatusOr<index::SelectionCalibration> CalibrationOf(const ModelProfile& profile);

v1::Tier ToProto(TierId tier);
v1::BlockHandle ToProto(const DeviceHandle& handle);

// The API's form of the compactor's records (daemon/compaction).
v1::ContextVersion ToProto(const ContextVersionRecord& record);
v1::CompactedSlots ToProto(const CompactedSlotsRecord& record);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_CONVERT_H_
