// The dataflow table on its own (bisect/dataflow.h): its storage index and the
// per-storage views it keeps, for id patterns and view counts the synthetic
// recordings of diff_test do not reach.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "../../bisect/dataflow.h"

using opguard::bisect::BitsSource;
using opguard::bisect::BitsState;
using opguard::bisect::Dataflow;
using opguard::bisect::TensorBits;

namespace {

TensorBits bits(uint64_t storage, uint64_t geometry, uint64_t fingerprint) {
  return {storage, geometry, 0, BitsState::kHashed, fingerprint};
}

}  // namespace

TEST_CASE("the dataflow finds the writer of each of 100000 storages whose ids collide in their low bits") {
  Dataflow flow;
  // Ids 2^20 apart, not the recorder's 1, 2, 3, ...: the index folds their high
  // bits into the slot (without that, this took seconds: one long probe run).
  std::vector<uint64_t> ids;
  for (uint64_t i = 1; i <= 100000; ++i) ids.push_back(i << 20);
  for (std::size_t i = 0; i < ids.size(); ++i)
    flow.record_write(bits(ids[i], 7, i), static_cast<int32_t>(i), i % 3 == 0, true);
  REQUIRE(flow.storages() == ids.size());
  for (std::size_t i = 0; i < ids.size(); i += 997) {
    CAPTURE(i);
    // Same view and fingerprint as written: the bits came from the writer.
    const BitsSource same = flow.explain(bits(ids[i], 7, i));
    CHECK(same.event == static_cast<int32_t>(i));
    CHECK(same.kind == (i % 3 == 0 ? BitsSource::kPropagated : BitsSource::kEnteredReference));
    // Other bits through the same view: changed outside any operator after it.
    const BitsSource changed = flow.explain(bits(ids[i], 7, i + 1));
    CHECK(changed.kind == BitsSource::kEnteredOutside);
    CHECK(changed.event == static_cast<int32_t>(i));
  }
  const BitsSource unseen = flow.explain(bits(uint64_t{3} << 20 | 1, 7, 0));
  CHECK(unseen.unseen);
  CHECK(unseen.event == -1);
}

TEST_CASE("a storage seen through more views than the dataflow keeps forgets the oldest first") {
  Dataflow flow;
  flow.record_write(bits(5, 0, 100), 0, false, true);
  // Views 1 .. kMaxViews + 2 after the write's view 0: views 0, 1 and 2 are forgotten.
  const uint64_t views = Dataflow::kMaxViews + 2;
  for (uint64_t g = 1; g <= views; ++g) flow.record_alias(bits(5, g, 100 + g), static_cast<int32_t>(g), g % 2 == 1);
  for (uint64_t g = 0; g <= views; ++g) {
    CAPTURE(g);
    const BitsSource s = flow.explain(bits(5, g, 100 + g));
    if (g <= 2) {
      // Forgotten: the storage's history (its only writer, event 0, equal in both runs) decides.
      CHECK(s.kind == BitsSource::kEnteredOutside);
      CHECK(s.event == 0);
    } else {
      CHECK(s.event == static_cast<int32_t>(g));
      CHECK(s.kind == (g % 2 == 1 ? BitsSource::kPropagated : BitsSource::kEnteredReference));
    }
  }
  // A write forgets every view.
  flow.record_write(bits(5, 1, 1), 40, true, false);
  const BitsSource after = flow.explain(bits(5, 9, 109));
  CHECK(after.kind == BitsSource::kPropagated);
  CHECK(after.event == 40);
}
