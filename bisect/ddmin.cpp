// ddmin over change indices, with every subset's outcome cached: the
// complement tests at granularity 2 repeat the subset tests, and the final
// 1-minimality check repeats tests ddmin already made.

#include <algorithm>
#include <map>
#include <numeric>

#include "opguard/bisect/bisect.h"

namespace opguard::bisect {
namespace {

// `c` cut into `n` contiguous parts as equal as possible (n <= c.size()).
std::vector<std::vector<int>> split(const std::vector<int>& c, std::size_t n) {
  std::vector<std::vector<int>> parts;
  std::size_t begin = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t end = begin + (c.size() - begin) / (n - k);
    parts.emplace_back(c.begin() + begin, c.begin() + end);
    begin = end;
  }
  return parts;
}

std::vector<int> minus(const std::vector<int>& c, const std::vector<int>& d) {
  std::vector<int> out;
  std::set_difference(c.begin(), c.end(), d.begin(), d.end(), std::back_inserter(out));
  return out;
}

}  // namespace

const char* trial_outcome_name(TrialOutcome o) {
  switch (o) {
    case TrialOutcome::kGood: return "good";
    case TrialOutcome::kBad: return "bad";
    case TrialOutcome::kOther: return "other";
    case TrialOutcome::kFailed: return "failed";
  }
  return "failed";
}

DdminResult ddmin(int n, const Oracle& oracle) {
  std::map<std::vector<int>, TrialOutcome> cache;
  auto bad = [&](const std::vector<int>& subset) {
    auto it = cache.find(subset);
    if (it == cache.end()) it = cache.emplace(subset, oracle(subset)).first;
    return it->second == TrialOutcome::kBad;
  };
  std::vector<int> c(static_cast<std::size_t>(std::max(n, 0)));
  std::iota(c.begin(), c.end(), 0);
  std::size_t granularity = 2;
  while (c.size() >= 2) {
    const auto parts = split(c, std::min(granularity, c.size()));
    bool reduced = false;
    for (const auto& d : parts) {
      if (bad(d)) {
        c = d;
        granularity = 2;
        reduced = true;
        break;
      }
    }
    for (std::size_t k = 0; !reduced && k < parts.size(); ++k) {
      const auto complement = minus(c, parts[k]);
      if (bad(complement)) {
        c = complement;
        granularity = std::max<std::size_t>(granularity - 1, 2);
        reduced = true;
      }
    }
    if (reduced) continue;
    if (granularity >= c.size()) break;
    granularity = std::min(c.size(), granularity * 2);
  }
  // 1-minimality, checked rather than trusted: remove each change in turn (a
  // removal that still gives the bad bits shrinks the set and starts over).
  DdminResult result;
  bool again = true;
  while (again) {
    again = false;
    for (std::size_t k = 0; k < c.size(); ++k) {
      auto smaller = c;
      smaller.erase(smaller.begin() + static_cast<std::ptrdiff_t>(k));
      if (bad(smaller)) {
        c = smaller;
        again = true;
        break;
      }
    }
  }
  result.minimal = c;
  result.one_minimal = true;
  result.oracle_calls = static_cast<int>(cache.size());
  return result;
}

}  // namespace opguard::bisect
