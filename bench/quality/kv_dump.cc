#include "bench/quality/kv_dump.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "index/kernels/simd.h"

namespace kvtier::quality {
namespace {

// Checks metadata field `key` (when present) against the tensor shape.
absl::Status CheckMeta(const SafetensorsFile& f, const char* key, int64_t actual) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) return absl::OkStatus();
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(f.label(), ": metadata \"", key, "\" (\"",
                                                   it->second, "\") is not an integer"));
  }
  if (v != actual) {
    return absl::InvalidArgumentError(absl::StrCat(f.label(), ": shape mismatch: metadata \"", key,
                                                   "\" is ", v, " but the tensors give ", actual));
  }
  return absl::OkStatus();
}

std::string HalfBytes(const std::vector<float>& v) {
  std::string out(v.size() * 2, '\0');
  index::simd::FloatToHalfN(v.data(), reinterpret_cast<uint16_t*>(out.data()), v.size());
  return out;
}

}  // namespace

std::string DumpName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string ext = ".safetensors";
  if (base.size() > ext.size() && base.compare(base.size() - ext.size(), ext.size(), ext) == 0) {
    base.resize(base.size() - ext.size());
  }
  return base;
}

std::string DumpKind(const std::string& name) {
  size_t dash = name.find_last_of('-');
  if (dash == std::string::npos || dash + 1 == name.size()) return name;
  for (size_t i = dash + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return name;
  }
  return name.substr(0, dash);
}

absl::StatusOr<KvDump> KvDumpFromSafetensors(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* q = f.Find("q");
  const TensorInfo* k = f.Find("k");
  const TensorInfo* v = f.Find("v");
  for (const auto& [t, n] : {std::pair{q, "q"}, {k, "k"}, {v, "v"}}) {
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(f.label(), ": tensor \"", n, "\" is missing"));
    }
    if (t->shape.size() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.label(), ": tensor \"", n, "\": shape mismatch: rank ", t->shape.size(),
                       ", expected 4 ([layers, heads, T, head_dim])"));
    }
  }
  KvDump d;
  d.name = name;
  d.kind = DumpKind(name);
  d.metadata = f.metadata();
  d.num_layers = static_cast<int32_t>(q->shape[0]);
  d.num_q_heads = static_cast<int32_t>(q->shape[1]);
  d.seq_len = q->shape[2];
  d.head_dim = static_cast<int32_t>(q->shape[3]);
  d.num_kv_heads = static_cast<int32_t>(k->shape[1]);
  if (d.num_layers < 1 || d.num_q_heads < 1 || d.num_kv_heads < 1 || d.head_dim < 1 ||
      d.seq_len < 1 || d.seq_len > kMaxDumpTokens || d.head_dim > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.label(),
                     ": tensor \"q\": shape mismatch: every dimension must be "
                     ">= 1 (T <= ",
                     kMaxDumpTokens, ", head_dim <= 4096)"));
  }
  if (d.num_q_heads % d.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.label(), ": shape mismatch: q_heads (", d.num_q_heads,
                     ") is not a multiple of kv_heads (", d.num_kv_heads, ")"));
  }
  const std::vector<int64_t> kv_shape = {d.num_layers, d.num_kv_heads, d.seq_len, d.head_dim};
  auto q_or = f.ReadFloat("q", {});
  if (!q_or.ok()) return q_or.status();
  auto k_or = f.ReadFloat("k", kv_shape);
  if (!k_or.ok()) return k_or.status();
  auto v_or = f.ReadFloat("v", kv_shape);
  if (!v_or.ok()) return v_or.status();
  d.q = std::move(*q_or);
  d.k = std::move(*k_or);
  d.v = std::move(*v_or);
  if (f.Find("tokens") != nullptr) {
    auto tok = f.ReadInt32("tokens", {d.seq_len});
    if (!tok.ok()) return tok.status();
    d.tokens = std::move(*tok);
  }
  for (const auto& [key, actual] : {std::pair<const char*, int64_t>{"layers", d.num_layers},
                                    {"q_heads", d.num_q_heads},
                                    {"kv_heads", d.num_kv_heads},
                                    {"head_dim", d.head_dim},
                                    {"seq_len", d.seq_len}}) {
    if (absl::Status s = CheckMeta(f, key, actual); !s.ok()) return s;
  }
  for (const std::vector<float>* t : {&d.q, &d.k, &d.v}) {
    for (float x : *t) {
      if (!std::isfinite(x)) {
        return absl::InvalidArgumentError(
            absl::StrCat(f.label(), ": q, k or v holds a non-finite value"));
      }
    }
  }
  return d;
}

absl::StatusOr<KvDump> LoadKvDump(const std::string& path) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Read(path);
  if (!f.ok()) return f.status();
  return KvDumpFromSafetensors(*f, DumpName(path));
}

absl::StatusOr<KvDump> TruncateDump(const KvDump& d, int64_t tokens) {
  if (tokens < 1 || tokens > d.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens (", tokens, ") must be in [1, ", d.seq_len, "]"));
  }
  KvDump out = d;
  out.seq_len = tokens;
  auto cut = [&](const std::vector<float>& src, int32_t heads, std::vector<float>* dst) {
    dst->clear();
    for (int32_t l = 0; l < d.num_layers; ++l) {
      for (int32_t h = 0; h < heads; ++h) {
        const size_t first = (static_cast<size_t>(l) * heads + h) * d.seq_len * d.head_dim;
        dst->insert(dst->end(), src.begin() + first, src.begin() + first + tokens * d.head_dim);
      }
    }
  };
  cut(d.q, d.num_q_heads, &out.q);
  cut(d.k, d.num_kv_heads, &out.k);
  cut(d.v, d.num_kv_heads, &out.v);
  if (!d.tokens.empty()) out.tokens.resize(tokens);
  out.metadata["seq_len"] = absl::StrCat(tokens);
  return out;
}

absl::StatusOr<std::string> SerializeKvDump(const KvDump& d) {
  std::vector<TensorToWrite> t;
  if (!d.tokens.empty()) {
    TensorToWrite tok{"tokens", TensorDtype::kI32, {d.seq_len}, {}};
    tok.data.assign(reinterpret_cast<const char*>(d.tokens.data()),
                    d.tokens.size() * sizeof(int32_t));
    t.push_back(std::move(tok));
  }
  t.push_back({"q",
               TensorDtype::kF16,
               {d.num_layers, d.num_q_heads, d.seq_len, d.head_dim},
               HalfBytes(d.q)});
  t.push_back({"k",
               TensorDtype::kF16,
               {d.num_layers, d.num_kv_heads, d.seq_len, d.head_dim},
               HalfBytes(d.k)});
  t.push_back({"v",
               TensorDtype::kF16,
               {d.num_layers, d.num_kv_heads, d.seq_len, d.head_dim},
               HalfBytes(d.v)});
  std::map<std::string, std::string> meta = d.metadata;
  meta["layers"] = absl::StrCat(d.num_layers);
  meta["q_heads"] = absl::StrCat(d.num_q_heads);
  meta["kv_heads"] = absl::StrCat(d.num_kv_heads);
  meta["head_dim"] = absl::StrCat(d.head_dim);
  meta["seq_len"] = absl::StrCat(d.seq_len);
  return SerializeSafetensors(t, meta);
}

absl::StatusOr<KvDump> MakeSyntheticDump(const SyntheticDumpOptions& o) {
  constexpr int32_t kPosPairs = 4;
  const int32_t D = o.head_dim;
  if (o.num_layers < 1 || o.num_q_heads < 1 || o.num_kv_heads < 1 ||
      o.num_q_heads % o.num_kv_heads != 0 || D < 2 * kPosPairs + 8 || D % 2 != 0 ||
      o.seq_len < 16 || o.seq_len > kMaxDumpTokens || o.topic_run_tokens < 1) {
    return absl::InvalidArgumentError(
        "synthetic options: need layers, heads >= 1, q_heads a multiple of "
        "kv_heads, even head_dim >= 16, 16 <= seq_len <= 2^20, "
        "topic_run_tokens >= 1");
  }
  KvDump d;
  d.name = absl::StrCat("synthetic-", o.recall ? "recall" : "window", "-", o.seed);
  d.kind = DumpKind(d.name);
  d.num_layers = o.num_layers;
  d.num_q_heads = o.num_q_heads;
  d.num_kv_heads = o.num_kv_heads;
  d.head_dim = D;
  d.seq_len = o.seq_len;
  d.metadata["mode"] = o.recall ? "recall" : "window";
  d.metadata["model"] = "synthetic";
  const int64_t T = o.seq_len;
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  // Dimensions: [0, 2*kPosPairs) positional rotation, 2*kPosPairs the sink,
  // the rest topics.
  const int32_t sink_dim = 2 * kPosPairs;
  const int32_t topic_first = sink_dim + 1;
  const int32_t topic_dims = D - topic_first;
  const int64_t runs = (T + o.topic_run_tokens - 1) / o.topic_run_tokens;
  std::vector<float> topics(static_cast<size_t>(runs) * topic_dims);
  for (int64_t r = 0; r < runs; ++r) {
    float norm = 0;
    float* t = &topics[r * topic_dims];
    for (int32_t i = 0; i < topic_dims; ++i) {
      t[i] = normal(rng);
      norm += t[i] * t[i];
    }
    for (int32_t i = 0; i < topic_dims; ++i) t[i] /= std::sqrt(norm);
  }
  // Recall mode: the last quarter repeats the first quarter's topics.
  auto topic_of = [&](int64_t pos) -> const float* {
    int64_t p = pos;
    if (o.recall && pos >= 3 * T / 4) p = pos - 3 * T / 4;
    return &topics[(p / o.topic_run_tokens) * topic_dims];
  };
  auto pos_angle = [](int64_t pos, int32_t f) {
    return 6.283185307f * static_cast<float>(pos) / static_cast<float>(8 << (2 * f));
  };
  d.tokens.resize(T);
  for (int64_t t = 0; t < T; ++t) d.tokens[t] = static_cast<int32_t>(t % 256);
  d.q.assign(static_cast<size_t>(o.num_layers) * o.num_q_heads * T * D, 0);
  d.k.assign(static_cast<size_t>(o.num_layers) * o.num_kv_heads * T * D, 0);
  d.v.assign(d.k.size(), 0);
  for (int32_t l = 0; l < o.num_layers; ++l) {
    for (int32_t h = 0; h < o.num_kv_heads; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        float* k = &d.k[((static_cast<size_t>(l) * o.num_kv_heads + h) * T + t) * D];
        float* v = &d.v[((static_cast<size_t>(l) * o.num_kv_heads + h) * T + t) * D];
        for (int32_t f = 0; f < kPosPairs; ++f) {
          k[2 * f] = 2.0f * std::cos(pos_angle(t, f));
          k[2 * f + 1] = 2.0f * std::sin(pos_angle(t, f));
        }
        k[sink_dim] = t == 0 ? 5.0f : 0.0f;
        const float* topic = topic_of(t);
        for (int32_t i = 0; i < topic_dims; ++i) {
          k[topic_first + i] = 3.0f * topic[i] + 0.4f * normal(rng);
        }
        for (int32_t i = 0; i < D; ++i) v[i] = normal(rng);
      }
    }
    for (int32_t h = 0; h < o.num_q_heads; ++h) {
      // Even heads lean local, odd heads lean on topics.
      const bool local = (h + l) % 2 == 0;
      const float pos_gain = local ? 2.5f : 0.8f;
      const float topic_gain = local ? 1.0f : 4.0f;
      for (int64_t t = 0; t < T; ++t) {
        float* q = &d.q[((static_cast<size_t>(l) * o.num_q_heads + h) * T + t) * D];
        for (int32_t f = 0; f < kPosPairs; ++f) {
          q[2 * f] = pos_gain * std::cos(pos_angle(t, f));
          q[2 * f + 1] = pos_gain * std::sin(pos_angle(t, f));
        }
        q[sink_dim] = 3.0f;
        const float* topic = topic_of(t);
        for (int32_t i = 0; i < topic_dims; ++i) {
          q[topic_first + i] = topic_gain * topic[i] + 0.3f * normal(rng);
        }
      }
    }
  }
  return d;
}

}  // namespace kvtier::quality
