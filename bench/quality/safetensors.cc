#include "bench/quality/safetensors.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/quality/json.h"
#include "index/kernels/simd.h"
#include "storage/common/errno_status.h"

namespace kvtier::quality {
namespace {

struct DtypeEntry {
  TensorDtype dtype;
  const char* name;
  int size_bytes;
};

constexpr DtypeEntry kDtypes[] = {
    {TensorDtype::kF16, "F16", 2},   {TensorDtype::kBF16, "BF16", 2}, {TensorDtype::kF32, "F32", 4},
    {TensorDtype::kF64, "F64", 8},   {TensorDtype::kI8, "I8", 1},     {TensorDtype::kI16, "I16", 2},
    {TensorDtype::kI32, "I32", 4},   {TensorDtype::kI64, "I64", 8},   {TensorDtype::kU8, "U8", 1},
    {TensorDtype::kU16, "U16", 2},   {TensorDtype::kU32, "U32", 4},   {TensorDtype::kU64, "U64", 8},
    {TensorDtype::kBool, "BOOL", 1},
};

const DtypeEntry* FindDtype(absl::string_view name) {
  for (const DtypeEntry& e : kDtypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// Parses one tensor entry of the header.
absl::Status ParseTensor(const std::string& label, const std::string& name, const JsonValue& v,
                         uint64_t data_size, TensorInfo* out) {
  auto err = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": tensor \"", name, "\": ", what));
  };
  if (v.type != JsonValue::Type::kObject) return err("entry is not an object");
  const JsonValue* dtype = v.Find("dtype");
  const JsonValue* shape = v.Find("shape");
  const JsonValue* offsets = v.Find("data_offsets");
  if (dtype == nullptr || dtype->type != JsonValue::Type::kString) {
    return err("\"dtype\" is missing or not a string");
  }
  const DtypeEntry* entry = FindDtype(dtype->string);
  if (entry == nullptr) {
    return err(absl::StrCat("dtype unsupported: \"", dtype->string, "\""));
  }
  if (shape == nullptr || shape->type != JsonValue::Type::kArray) {
    return err("\"shape\" is missing or not an array");
  }
  if (shape->array.size() > static_cast<size_t>(kMaxRank)) {
    return err(
        absl::StrCat("shape has rank ", shape->array.size(), ", above the limit ", kMaxRank));
  }
  out->name = name;
  out->dtype = entry->dtype;
  out->shape.clear();
  uint64_t elements = 1;
  for (const JsonValue& d : shape->array) {
    if (d.type != JsonValue::Type::kNumber || !d.is_integer || d.integer < 0) {
      return err("shape holds a value that is not a non-negative integer");
    }
    out->shape.push_back(d.integer);
    if (d.integer != 0 && elements > kMaxFileBytes / static_cast<uint64_t>(d.integer)) {
      return err(absl::StrCat("shape ", ShapeString(out->shape), " is too large"));
    }
    elements *= static_cast<uint64_t>(d.integer);
  }
  if (offsets == nullptr || offsets->type != JsonValue::Type::kArray ||
      offsets->array.size() != 2) {
    return err("\"data_offsets\" is missing or not [begin, end]");
  }
  for (const JsonValue& o : offsets->array) {
    if (o.type != JsonValue::Type::kNumber || !o.is_integer || o.integer < 0) {
      return err("data_offsets holds a value that is not a non-negative integer");
    }
  }
  out->begin = static_cast<uint64_t>(offsets->array[0].integer);
  out->end = static_cast<uint64_t>(offsets->array[1].integer);
  if (out->begin > out->end || out->end > data_size) {
    return err(absl::StrCat("data_offsets [", out->begin, ", ", out->end,
                            "] out of range (data section is ", data_size, " bytes)"));
  }
  const uint64_t want = elements * static_cast<uint64_t>(entry->size_bytes);
  if (out->end - out->begin != want) {
    return err(absl::StrCat("shape mismatch: shape ", ShapeString(out->shape), " of ", entry->name,
                            " needs ", want, " bytes but data_offsets span ",
                            out->end - out->begin));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view TensorDtypeName(TensorDtype dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "unknown";
}

int TensorDtypeSizeBytes(TensorDtype dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.dtype == dtype) return e.size_bytes;
  }
  return 0;
}

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes, absl::string_view label) {
  SafetensorsFile f;
  f.label_ = std::string(label);
  const std::string& l = f.label_;
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(l, ": bad header length: file is ", bytes.size(),
                     " bytes, shorter than the 8-byte length prefix"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) {
    n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  }
  if (n > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        l, ": bad header length: ", n, " bytes exceeds the limit of ", kMaxHeaderBytes));
  }
  if (n > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(l, ": bad header length: ", n,
                                                   " bytes but only ", bytes.size() - 8,
                                                   " follow the prefix (truncated file?)"));
  }
  absl::StatusOr<JsonValue> header = ParseJson(absl::string_view(bytes).substr(8, n));
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(l, ": ", header.status().message()));
  }
  if (header->type != JsonValue::Type::kObject) {
    return absl::InvalidArgumentError(
        absl::StrCat(l, ": JSON header parse error: the header is not an object"));
  }
  f.data_start_ = 8 + n;
  const uint64_t data_size = bytes.size() - f.data_start_;
  for (const auto& [name, value] : header->object) {
    if (name == "__metadata__") {
      if (value.type != JsonValue::Type::kObject) {
        return absl::InvalidArgumentError(absl::StrCat(l, ": __metadata__ is not an object"));
      }
      for (const auto& [k, v] : value.object) {
        if (v.type != JsonValue::Type::kString) {
          return absl::InvalidArgumentError(
              absl::StrCat(l, ": __metadata__ value of \"", k, "\" is not a string"));
        }
        f.metadata_[k] = v.string;
      }
      continue;
    }
    TensorInfo t;
    if (absl::Status s = ParseTensor(l, name, value, data_size, &t); !s.ok()) {
      return s;
    }
    f.tensors_.push_back(std::move(t));
  }
  f.bytes_ = std::move(bytes);
  return f;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (file == nullptr) return ErrnoToStatus(errno, "open " + path);
  if (std::fseek(file.get(), 0, SEEK_END) != 0) {
    return ErrnoToStatus(errno, "seek " + path);
  }
  const long size = std::ftell(file.get());
  if (size < 0) return ErrnoToStatus(errno, "size of " + path);
  if (static_cast<uint64_t>(size) > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file is ", size, " bytes, above the limit ", kMaxFileBytes));
  }
  std::rewind(file.get());
  std::string bytes(static_cast<size_t>(size), '\0');
  if (size > 0 && std::fread(bytes.data(), 1, bytes.size(), file.get()) != bytes.size()) {
    if (std::ferror(file.get())) return ErrnoToStatus(EIO, "read " + path);
    return absl::DataLossError(absl::StrCat(path, ": short read"));
  }
  return Parse(std::move(bytes), path);
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

absl::string_view SafetensorsFile::Data(const TensorInfo& t) const {
  return absl::string_view(bytes_).substr(data_start_ + t.begin, t.end - t.begin);
}

absl::Status SafetensorsFile::Check(absl::string_view name, TensorDtype want,
                                    const std::vector<int64_t>& shape,
                                    const TensorInfo** out) const {
  const TensorInfo* t = Find(name);
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(label_, ": tensor \"", name, "\" is missing"));
  }
  if (t->dtype != want && !(want == TensorDtype::kF32 &&
                            (t->dtype == TensorDtype::kF16 || t->dtype == TensorDtype::kBF16))) {
    return absl::InvalidArgumentError(absl::StrCat(
        label_, ": tensor \"", name, "\": dtype unsupported here: ", TensorDtypeName(t->dtype),
        " (want ", want == TensorDtype::kF32 ? "F16, BF16 or F32" : TensorDtypeName(want), ")"));
  }
  if (!shape.empty() && t->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(label_, ": tensor \"", name,
                                                   "\": shape mismatch: ", ShapeString(t->shape),
                                                   ", expected ", ShapeString(shape)));
  }
  *out = t;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadFloat(
    absl::string_view name, const std::vector<int64_t>& shape) const {
  const TensorInfo* t = nullptr;
  if (absl::Status s = Check(name, TensorDtype::kF32, shape, &t); !s.ok()) {
    return s;
  }
  const absl::string_view data = Data(*t);
  std::vector<float> out(static_cast<size_t>(t->num_elements()));
  switch (t->dtype) {
    case TensorDtype::kF16:
      index::simd::HalfToFloatN(data.data(), out.data(), out.size());
      break;
    case TensorDtype::kBF16:
      index::simd::BfloatToFloatN(data.data(), out.data(), out.size());
      break;
    default:
      std::memcpy(out.data(), data.data(), data.size());
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> SafetensorsFile::ReadInt32(
    absl::string_view name, const std::vector<int64_t>& shape) const {
  const TensorInfo* t = nullptr;
  if (absl::Status s = Check(name, TensorDtype::kI32, shape, &t); !s.ok()) {
    return s;
  }
  const absl::string_view data = Data(*t);
  std::vector<int32_t> out(static_cast<size_t>(t->num_elements()));
  std::memcpy(out.data(), data.data(), data.size());
  return out;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors, const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  uint64_t offset = 0;
  bool first = true;
  for (const TensorToWrite& t : tensors) {
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    const uint64_t want = elements * static_cast<uint64_t>(TensorDtypeSizeBytes(t.dtype));
    if (t.data.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": ", t.data.size(),
                                                     " bytes of data, shape ", ShapeString(t.shape),
                                                     " needs ", want));
    }
    if (!first) header += ",";
    first = false;
    AppendJsonString(t.name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"", TensorDtypeName(t.dtype),
                    "\",\"shape\":", ShapeString(t.shape), ",\"data_offsets\":[", offset, ",",
                    offset + want, "]}");
    offset += want;
  }
  if (!metadata.empty()) {
    if (!first) header += ",";
    header += "\"__metadata__\":{";
    bool first_meta = true;
    for (const auto& [k, v] : metadata) {
      if (!first_meta) header += ",";
      first_meta = false;
      AppendJsonString(k, &header);
      header += ":";
      AppendJsonString(v, &header);
    }
    header += "}";
  }
  header += "}";
  // Pad the header with spaces to a multiple of 8 bytes, as writers do.
  while (header.size() % 8 != 0) header += ' ';
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  out += header;
  for (const TensorToWrite& t : tensors) out += t.data;
  return out;
}

absl::Status WriteFile(const std::string& path, absl::string_view bytes) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (file == nullptr) return ErrnoToStatus(errno, "open " + path);
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file.get()) != bytes.size()) {
    return ErrnoToStatus(errno != 0 ? errno : EIO, "write " + path);
  }
  if (std::fclose(file.release()) != 0) {
    return ErrnoToStatus(errno, "close " + path);
  }
  return absl::OkStatus();
}

}  // namespace kvtier::quality
