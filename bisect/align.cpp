// Myers' diff (E. W. Myers, "An O(ND) Difference Algorithm and Its
// Variations", 1986), linear-space variant: find the middle snake of the
// shortest edit path, recurse on both halves. The common prefix and suffix are
// matched first without any search: two runs under the same config align in
// one linear scan.

#include "align.h"

#include <algorithm>

namespace opguard::bisect {
namespace {

// Work budget of one middle-snake search, in diagonal extensions: beyond it the
// search stops at the furthest-reaching path (GNU diff's "too expensive"
// heuristic). 50M keeps one search under ~0.1 s; sequences a few thousand
// events long and mostly equal never come near it.
constexpr int64_t kSnakeWork = 50'000'000;
constexpr int kMinSnakeDepth = 64;

class Aligner {
 public:
  Aligner(const uint64_t* a, const uint64_t* b, std::vector<AlignStep>& out) : a_(a), b_(b), out_(out) {}

  void run(int a0, int a1, int b0, int b1) {
    while (a0 < a1 && b0 < b1 && a_[a0] == b_[b0]) out_.push_back({a0++, b0++});
    const int suffix_a = a1;
    while (a0 < a1 && b0 < b1 && a_[a1 - 1] == b_[b1 - 1]) --a1, --b1;
    if (a0 == a1) {
      for (int j = b0; j < b1; ++j) out_.push_back({-1, j});
    } else if (b0 == b1) {
      for (int i = a0; i < a1; ++i) out_.push_back({i, -1});
    } else {
      Snake s = middle_snake(a0, a1, b0, b1);
      if (s.give_up) {
        for (int i = a0; i < a1; ++i) out_.push_back({i, -1});
        for (int j = b0; j < b1; ++j) out_.push_back({-1, j});
      } else {
        run(a0, s.x0, b0, s.y0);
        for (int k = 0; k < s.x1 - s.x0; ++k) out_.push_back({s.x0 + k, s.y0 + k});
        run(s.x1, a1, s.y1, b1);
      }
    }
    for (int i = a1; i < suffix_a; ++i) out_.push_back({i, b1 + (i - a1)});
  }

 private:
  struct Snake {
    int x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // absolute; matches run from (x0,y0) to (x1,y1)
    bool give_up = false;
  };

  // Precondition: both ranges non-empty, first and last elements differ.
  Snake middle_snake(int a0, int a1, int b0, int b1) {
    const int n = a1 - a0, m = b1 - b0;
    const int delta = n - m;
    const bool odd = (delta & 1) != 0;
    const int max_d = (n + m + 1) / 2;
    const int budget = static_cast<int>(std::max<int64_t>(kMinSnakeDepth, kSnakeWork / (n + m)));
    const int d_limit = std::min(max_d, budget);
    const int off = d_limit + 1;
    vf_.assign(2 * d_limit + 3, 0);
    vb_.assign(2 * d_limit + 3, 0);
    for (int d = 0; d <= d_limit; ++d) {
      for (int k = -d; k <= d; k += 2) {
        int x = (k == -d || (k != d && vf_[off + k - 1] < vf_[off + k + 1])) ? vf_[off + k + 1] : vf_[off + k - 1] + 1;
        int y = x - k;
        const int sx = x, sy = y;
        while (x < n && y < m && a_[a0 + x] == b_[b0 + y]) ++x, ++y;
        vf_[off + k] = x;
        const int kb = delta - k;
        if (odd && kb >= -(d - 1) && kb <= d - 1 && x + vb_[off + kb] >= n) return {a0 + sx, b0 + sy, a0 + x, b0 + y, false};
      }
      for (int k = -d; k <= d; k += 2) {
        int x = (k == -d || (k != d && vb_[off + k - 1] < vb_[off + k + 1])) ? vb_[off + k + 1] : vb_[off + k - 1] + 1;
        int y = x - k;
        const int sx = x, sy = y;
        while (x < n && y < m && a_[a1 - 1 - x] == b_[b1 - 1 - y]) ++x, ++y;
        vb_[off + k] = x;
        const int kf = delta - k;
        if (!odd && kf >= -d && kf <= d && x + vf_[off + kf] >= n)
          return {a0 + n - x, b0 + m - y, a0 + n - sx, b0 + m - sy, false};
      }
    }
    // Over budget: split at the forward path that got furthest (x + y largest).
    int best_x = 0, best_k = 0, best_reach = -1;
    for (int k = -d_limit; k <= d_limit; k += 2) {
      const int x = vf_[off + k], y = x - k;
      if (x < 0 || y < 0 || x > n || y > m) continue;
      if (x + y > best_reach) best_reach = x + y, best_x = x, best_k = k;
    }
    if (best_reach <= 0 || best_reach >= n + m) return {0, 0, 0, 0, true};
    const int y = best_x - best_k;
    return {a0 + best_x, b0 + y, a0 + best_x, b0 + y, false};
  }

  const uint64_t* a_;
  const uint64_t* b_;
  std::vector<AlignStep>& out_;
  std::vector<int> vf_, vb_;
};

}  // namespace

void slide_gaps(std::vector<AlignStep>& script, const uint64_t* a, const uint64_t* b,
                const std::function<int64_t(int32_t, int32_t)>& affinity, int32_t max_slide) {
  const auto n = static_cast<int64_t>(script.size());
  auto matched = [&](int64_t i) { return script[i].a >= 0 && script[i].b >= 0; };
  int64_t s = 0;
  while (s < n) {
    if (matched(s)) {
      ++s;
      continue;
    }
    int64_t e = s;
    while (e < n && !matched(e)) ++e;
    const bool deletion = script[s].b < 0;  // reference events only; else suspect events only
    bool one_sided = true;
    for (int64_t i = s; i < e; ++i) one_sided = one_sided && ((script[i].b < 0) == deletion);
    if (!one_sided) {
      s = e;
      continue;
    }
    // The gap's side (`side` index of each step, its signatures) and the
    // other side's index of a matched step.
    const uint64_t* sig = deletion ? a : b;
    auto own = [&](int64_t i) { return deletion ? script[i].a : script[i].b; };
    auto other = [&](int64_t i) { return deletion ? script[i].b : script[i].a; };
    auto pair_affinity = [&](int32_t own_index, int32_t other_index) {
      return deletion ? affinity(own_index, other_index) : affinity(other_index, own_index);
    };
    const int32_t g = own(s), len = static_cast<int32_t>(e - s);
    // Left by k: the k matched steps before the gap pair their other-side
    // events with own + len instead; right by k: those after, with own - len.
    int64_t best_delta = 0, delta = 0;
    int32_t best_shift = 0;
    for (int32_t k = 1; k <= max_slide && s - k >= 0 && matched(s - k); ++k) {
      const int32_t x = own(s - k);
      if (x != g - k || (k > 1 && other(s - k) != other(s - k + 1) - 1) || sig[x] != sig[x + len]) break;
      delta += pair_affinity(x + len, other(s - k)) - pair_affinity(x, other(s - k));
      if (delta > best_delta) best_delta = delta, best_shift = -k;
    }
    delta = 0;
    for (int32_t k = 1; k <= max_slide && e + k - 1 < n && matched(e + k - 1); ++k) {
      const int32_t x = own(e + k - 1);
      if (x != g + len + k - 1 || (k > 1 && other(e + k - 1) != other(e + k - 2) + 1) || sig[x] != sig[x - len])
        break;
      delta += pair_affinity(x - len, other(e + k - 1)) - pair_affinity(x, other(e + k - 1));
      if (delta > best_delta) best_delta = delta, best_shift = k;
    }
    if (best_shift == 0) {
      s = e;
      continue;
    }
    // Rewrite [lo, hi): the gap's steps and the |shift| matched ones it moves past.
    const int64_t lo = best_shift < 0 ? s + best_shift : s, hi = best_shift < 0 ? e : e + best_shift;
    const int32_t k = best_shift < 0 ? -best_shift : best_shift;
    const int32_t first_other = other(best_shift < 0 ? lo : e);
    const int32_t new_gap = best_shift < 0 ? g - k : g + k;
    std::vector<AlignStep> rewritten;
    auto gap_step = [&](int32_t x) { return deletion ? AlignStep{x, -1} : AlignStep{-1, x}; };
    auto pair_step = [&](int32_t x, int32_t y) { return deletion ? AlignStep{x, y} : AlignStep{y, x}; };
    if (best_shift < 0) {
      for (int32_t i = 0; i < len; ++i) rewritten.push_back(gap_step(new_gap + i));
      for (int32_t i = 0; i < k; ++i) rewritten.push_back(pair_step(new_gap + len + i, first_other + i));
    } else {
      for (int32_t i = 0; i < k; ++i) rewritten.push_back(pair_step(g + i, first_other + i));
      for (int32_t i = 0; i < len; ++i) rewritten.push_back(gap_step(new_gap + i));
    }
    std::copy(rewritten.begin(), rewritten.end(), script.begin() + lo);
    s = hi;
  }
}

std::vector<AlignStep> align_sequences(const uint64_t* a, std::size_t na, const uint64_t* b, std::size_t nb) {
  std::vector<AlignStep> script;
  script.reserve(std::max(na, nb) + 8);
  Aligner aligner(a, b, script);
  aligner.run(0, static_cast<int>(na), 0, static_cast<int>(nb));
  return script;
}

}  // namespace opguard::bisect
