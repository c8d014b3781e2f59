#include "free_running.h"

#include <algorithm>
#include <cstring>

#include "opguard/formats/tensor_view.h"
#include "strided.h"

namespace opguard::replay::detail {

std::optional<formats::TensorData> FreeRunning::feed(const formats::TensorMeta& m,
                                                     const formats::TensorData* recorded) const {
  if (m.storage_id == 0 || (m.flags & formats::kTensorUninitialized) || m.numel() <= 0) return std::nullopt;
  auto it = storages_.find(m.storage_id);
  if (it == storages_.end()) return std::nullopt;
  const Storage& s = it->second;
  if (s.dtype != m.dtype || m.strides.size() != m.sizes.size()) return std::nullopt;
  if (s.version_exact ? m.version != s.version : m.version <= s.version) return std::nullopt;
  if (m.has_fingerprint()) {
    auto fp = s.fingerprints.find(formats::view_geometry(m));
    if (fp != s.fingerprints.end() && fp->second != m.fingerprint) return std::nullopt;
  }
  const std::size_t es = dtype_size(m.dtype);
  const int64_t available = static_cast<int64_t>(s.known.size());
  int64_t known = 0;
  for_each_element(m, [&](int64_t, int64_t e) { known += e < available && s.known[e]; });
  if (known == 0) return std::nullopt;
  const int64_t numel = m.numel();
  if (known < numel && (recorded == nullptr || recorded->bytes.size() != static_cast<std::size_t>(numel) * es))
    return std::nullopt;
  formats::TensorData out;
  out.dtype = m.dtype;
  out.sizes = m.sizes;
  if (known < numel) out.bytes = recorded->bytes;
  else out.bytes.resize(static_cast<std::size_t>(numel) * es);
  for_each_element(m, [&](int64_t i, int64_t e) {
    if (e < available && s.known[e]) std::memcpy(out.bytes.data() + i * es, s.bytes.data() + e * es, es);
  });
  return out;
}

void FreeRunning::write(const formats::TensorMeta& m, const OutValue& bits, bool version_known) {
  if (m.storage_id == 0 || bits.kind != formats::ValueKind::kTensor || !bits.bytes_valid) return;
  if (bits.dtype != m.dtype || bits.sizes != m.sizes || m.strides.size() != m.sizes.size()) return;
  Storage& s = storages_[m.storage_id];
  if (s.dtype != m.dtype) s = Storage{};
  s.dtype = m.dtype;
  // Elements not written now keep what earlier replayed writes left: only the
  // window's ops (which all went through here) wrote this storage since.
  if (!version_known || m.version != s.version || !s.version_exact) s.fingerprints.clear();
  s.version = m.version;
  s.version_exact = version_known;
  const std::size_t es = dtype_size(m.dtype);
  const int64_t extent = storage_extent(m);
  if (static_cast<int64_t>(s.known.size()) < extent) {
    s.known.resize(extent, 0);
    s.bytes.resize(static_cast<std::size_t>(extent) * es, 0);
  }
  scatter_view(m, es, bits.bytes.data(), s.bytes.data());
  for_each_element(m, [&](int64_t, int64_t e) { s.known[e] = 1; });
  if (version_known && m.has_fingerprint()) s.fingerprints[formats::view_geometry(m)] = m.fingerprint;
}

void FreeRunning::record(const formats::Event& ev, const ExecResult& exec) {
  std::vector<uint64_t> written;
  for (std::size_t k = 0; k < ev.outputs.size() && k < exec.outputs.size(); ++k) {
    const auto& m = ev.outputs[k].tensor;
    if (ev.outputs[k].kind != formats::ValueKind::kTensor) continue;
    write(m, exec.outputs[k], true);
    written.push_back(m.storage_id);
  }
  // Mutated arguments the op does not return: their new version is not
  // recorded (the inputs are recorded before the call).
  for (const auto& [index, bits] : exec.mutated) {
    if (index >= ev.inputs.size()) continue;
    const auto& m = ev.inputs[index].tensor;
    if (std::find(written.begin(), written.end(), m.storage_id) != written.end()) continue;
    write(m, bits, false);
  }
}

}  // namespace opguard::replay::detail
