// Conversions between kvtier.v1 messages and storage types, with request
// validation that names the proto field.
#ifndef KVTIER_DAEMON_CONVERT_H_
#define KVTIER_DAEMON_CONVERT_H_

#include "absl/status/statusor.h"
#include "kvtier/v1/types.pb.h"
#include "storage/catalog/records.h"
#include "storage/store/block_store.h"

namespace kvtier::daemon {

// INVALID_ARGUMENT naming "profile.<field>" for a bad field.
absl::StatusOr<ModelProfile> FromProto(const v1::ModelProfile& proto);
v1::ModelProfile ToProto(const ModelProfile& profile);

v1::Tier ToProto(TierId tier);
v1::BlockHandle ToProto(const DeviceHandle& handle);

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_CONVERT_H_
