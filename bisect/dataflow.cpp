#include "dataflow.h"

#include "opguard/core/error.h"

namespace opguard::bisect {

int64_t Dataflow::Index::find(uint64_t id) const {
  if (keys_.empty()) return -1;
  const std::size_t mask = keys_.size() - 1;
  for (std::size_t i = slot(id);; i = (i + 1) & mask) {
    if (keys_[i] == id) return values_[i];
    if (keys_[i] == 0) return -1;
  }
}

uint32_t Dataflow::Index::find_or_insert(uint64_t id, uint32_t fresh) {
  if (2 * (used_ + 1) > keys_.size()) grow();  // at most half full: probes stay short
  const std::size_t mask = keys_.size() - 1;
  for (std::size_t i = slot(id);; i = (i + 1) & mask) {
    if (keys_[i] == id) return values_[i];
    if (keys_[i] == 0) {
      keys_[i] = id;
      values_[i] = fresh;
      ++used_;
      return fresh;
    }
  }
}

void Dataflow::Index::grow() {
  std::vector<uint64_t> keys = std::move(keys_);
  std::vector<uint32_t> values = std::move(values_);
  const std::size_t size = keys.empty() ? 1024 : 2 * keys.size();
  keys_.assign(size, 0);
  values_.assign(size, 0);
  used_ = 0;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (keys[i] != 0) find_or_insert(keys[i], values[i]);
}

Dataflow::Storage& Dataflow::storage(uint64_t id) {
  const uint32_t i = index_.find_or_insert(id, count_);
  if (i == count_) {
    OPGUARD_CHECK(count_ < UINT32_MAX);
    if (count_ % kChunk == 0) chunks_.push_back(std::make_unique<Storage[]>(kChunk));
    ++count_;
  }
  return chunks_[i / kChunk][i % kChunk];
}

BitsSource Dataflow::explain(const TensorBits& m) const {
  const int64_t at = m.storage_id == 0 ? -1 : index_.find(m.storage_id);
  if (at < 0) return {BitsSource::kEnteredOutside, -1, true};
  const Storage& s = this->at(static_cast<uint32_t>(at));
  for (std::size_t k = s.seen.size(); k-- > 0;) {
    const Observation& o = s.seen[k];
    if (o.geometry != m.geometry || o.version != m.version) continue;
    const bool same_bits = o.state == m.state && (m.state != BitsState::kHashed || o.fingerprint == m.fingerprint);
    // Changed since: name the op that last wrote the storage, not a view op
    // or a reader that saw the old bits (numpy() makes an aten::resolve_neg).
    if (!same_bits) return {BitsSource::kEnteredOutside, s.last_writer >= 0 ? s.last_writer : o.event};
    return {o.differs ? BitsSource::kPropagated : BitsSource::kEnteredReference, o.event};
  }
  // Not seen through this view since the last write (a write through another
  // view, a reshape the recording did not show): the storage's history decides.
  if (s.last_divergent_writer >= 0) return {BitsSource::kPropagated, s.last_divergent_writer};
  BitsSource entered{BitsSource::kEnteredOutside, s.last_writer};
  entered.view_unseen = true;
  return entered;
}

Provenance Dataflow::provenance(const TensorBits& m) const {
  const int64_t at = m.storage_id == 0 ? -1 : index_.find(m.storage_id);
  if (at < 0) return {};
  const Storage& s = this->at(static_cast<uint32_t>(at));
  for (std::size_t k = s.seen.size(); k-- > 0;) {
    const Observation& o = s.seen[k];
    if (o.geometry != m.geometry || o.version != m.version) continue;
    const bool same_bits = o.state == m.state && (m.state != BitsState::kHashed || o.fingerprint == m.fingerprint);
    if (!same_bits) return {false, false, -1, s.last_writer};
    return {true, o.differs, o.event};
  }
  // As explain(): a storage any divergent event wrote may hold its bits.
  if (s.last_divergent_writer >= 0) return {true, true, s.last_divergent_writer};
  if (s.last_writer >= 0) return {true, false, s.last_writer};
  return {};
}

void Dataflow::add(Storage& s, const Observation& o) {
  for (std::size_t k = 0; k < s.seen.size(); ++k) {
    if (s.seen[k].geometry == o.geometry && s.seen[k].version == o.version) {
      s.seen[k] = o;
      return;
    }
  }
  if (s.seen.size() >= kMaxViews) s.seen.erase_oldest();
  s.seen.push_back(o);
}

void Dataflow::observe_input(const TensorBits& m, int32_t event, bool differs) {
  if (m.storage_id == 0) return;
  Storage& s = storage(m.storage_id);
  const Observation o{m.geometry, m.fingerprint, m.version, event, m.state, differs};
  for (std::size_t k = 0; k < s.seen.size(); ++k) {
    Observation& seen = s.seen[k];
    if (seen.geometry != m.geometry || seen.version != m.version) continue;
    // The first observer of these bits stays; bits that changed without an
    // operator make this event their first observer.
    if (seen.state != m.state || (m.state == BitsState::kHashed && seen.fingerprint != m.fingerprint)) seen = o;
    return;
  }
  add(s, o);
}

void Dataflow::record_write(const TensorBits& m, int32_t event, bool differs, bool bits_known) {
  if (m.storage_id == 0) return;
  Storage& s = storage(m.storage_id);
  s.seen.clear();
  s.last_writer = event;
  if (differs) s.last_divergent_writer = event;
  if (bits_known) s.seen.push_back({m.geometry, m.fingerprint, m.version, event, m.state, differs});
}

void Dataflow::record_alias(const TensorBits& m, int32_t event, bool differs) {
  if (m.storage_id == 0) return;
  add(storage(m.storage_id), {m.geometry, m.fingerprint, m.version, event, m.state, differs});
}

}  // namespace opguard::bisect
