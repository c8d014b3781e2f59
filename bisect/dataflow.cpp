#include "dataflow.h"

#include <algorithm>

namespace opguard::bisect {
namespace {

// Views of one storage remembered between writes. A storage is rarely seen
// through more than a handful of geometries (the tensor, its transpose, a few
// reshapes); the oldest is forgotten first.
constexpr std::size_t kMaxViews = 16;

}  // namespace

BitsSource Dataflow::explain(const formats::TensorMeta& m) const {
  auto it = storages_.find(m.storage_id);
  if (m.storage_id == 0 || it == storages_.end()) return {BitsSource::kEnteredOutside, -1, true};
  const Storage& s = it->second;
  const uint64_t geometry = view_geometry(m);
  const BitsState state = bits_state(m);
  for (auto o = s.seen.rbegin(); o != s.seen.rend(); ++o) {
    if (o->geometry != geometry || o->version != m.version) continue;
    const bool same_bits = o->state == state && (state != BitsState::kHashed || o->fingerprint == m.fingerprint);
    if (!same_bits) return {BitsSource::kEnteredOutside, o->event};
    return {o->differs ? BitsSource::kPropagated : BitsSource::kEnteredReference, o->event};
  }
  // Not seen through this view since the last write (a write through another
  // view, a reshape the recording did not show): the storage's history decides.
  if (s.last_divergent_writer >= 0) return {BitsSource::kPropagated, s.last_divergent_writer};
  BitsSource entered{BitsSource::kEnteredOutside, s.last_writer};
  entered.view_unseen = true;
  return entered;
}

Provenance Dataflow::provenance(const formats::TensorMeta& m) const {
  auto it = storages_.find(m.storage_id);
  if (m.storage_id == 0 || it == storages_.end()) return {};
  const Storage& s = it->second;
  const uint64_t geometry = view_geometry(m);
  const BitsState state = bits_state(m);
  for (auto o = s.seen.rbegin(); o != s.seen.rend(); ++o) {
    if (o->geometry != geometry || o->version != m.version) continue;
    const bool same_bits = o->state == state && (state != BitsState::kHashed || o->fingerprint == m.fingerprint);
    if (!same_bits) return {};
    return {true, o->differs, o->event};
  }
  // As explain(): a storage any divergent event wrote may hold its bits.
  if (s.last_divergent_writer >= 0) return {true, true, s.last_divergent_writer};
  if (s.last_writer >= 0) return {true, false, s.last_writer};
  return {};
}

void Dataflow::add(Storage& s, const Observation& o) {
  for (auto& seen : s.seen) {
    if (seen.geometry == o.geometry && seen.version == o.version) {
      seen = o;
      return;
    }
  }
  if (s.seen.size() >= kMaxViews) s.seen.erase(s.seen.begin());
  s.seen.push_back(o);
}

void Dataflow::observe_input(const formats::TensorMeta& m, int32_t event, bool differs) {
  if (m.storage_id == 0) return;
  Storage& s = storages_[m.storage_id];
  const uint64_t geometry = view_geometry(m);
  const BitsState state = bits_state(m);
  for (auto& seen : s.seen) {
    if (seen.geometry != geometry || seen.version != m.version) continue;
    // The first observer of these bits stays; bits that changed without an
    // operator make this event their first observer.
    if (seen.state != state || (state == BitsState::kHashed && seen.fingerprint != m.fingerprint))
      seen = {geometry, m.version, state, m.fingerprint, differs, event};
    return;
  }
  add(s, {geometry, m.version, state, m.fingerprint, differs, event});
}

void Dataflow::record_write(const formats::TensorMeta& m, int32_t event, bool differs, bool bits_known) {
  if (m.storage_id == 0) return;
  Storage& s = storages_[m.storage_id];
  s.seen.clear();
  s.last_writer = event;
  if (differs) s.last_divergent_writer = event;
  if (bits_known) s.seen.push_back({view_geometry(m), m.version, bits_state(m), m.fingerprint, differs, event});
}

void Dataflow::record_alias(const formats::TensorMeta& m, int32_t event, bool differs) {
  if (m.storage_id == 0) return;
  Storage& s = storages_[m.storage_id];
  add(s, {view_geometry(m), m.version, bits_state(m), m.fingerprint, differs, event});
}

}  // namespace opguard::bisect
