#pragma once
// The median the benchmark programs report (the upper one of an even count).

#include <algorithm>
#include <vector>

namespace opguard::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace opguard::bench
