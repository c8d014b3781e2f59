#pragma once
// Alignment of two event sequences by signature (DESIGN.md, Rule 3): a
// shortest edit script, so that an inserted, deleted or fused op does not shift
// every event after it. Private to opguard_bisect.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace opguard::bisect {

// One element of an edit script: a matched pair (a >= 0 and b >= 0), an element
// only in the reference (b == -1) or only in the suspect (a == -1). Indices are
// positions in the two input arrays; the script lists them in order.
struct AlignStep {
  int32_t a = -1;
  int32_t b = -1;
};

// Myers' O((N+M)D) algorithm in linear space (middle snake, recursive), after
// stripping the common prefix and suffix. Signatures compare as integers.
// When the edit distance of a subproblem exceeds a work budget (very different
// sequences), it splits at the furthest-reaching path instead of searching
// on: the script stays valid, just possibly not the shortest.
std::vector<AlignStep> align_sequences(const uint64_t* a, std::size_t na, const uint64_t* b, std::size_t nb);

// A run of events one side has and the other not, between events of equal
// signatures, can sit at several places that make equally short scripts: the
// EMA copy's evaluation that one run skips, ahead of the model's evaluation of
// the same signatures. align_sequences puts it last; this moves each such
// one-sided gap to the place where the pairs it matches are most alike
// (`affinity(a_index, b_index)`, higher is more alike: equal fingerprints),
// where that place matches strictly more alike pairs. Gaps with events of
// both sides are left where they are. At most `max_slide` places are tried on
// each side of a gap.
void slide_gaps(std::vector<AlignStep>& script, const uint64_t* a, const uint64_t* b,
                const std::function<int64_t(int32_t, int32_t)>& affinity, int32_t max_slide = 4096);

}  // namespace opguard::bisect
