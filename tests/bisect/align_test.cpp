// The alignment is a shortest edit script: checked against a dynamic-programming
// LCS on random sequences, and on the cases diff meets (inserted, deleted and
// fused ops).

#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "../../bisect/align.h"

namespace {

using opguard::bisect::align_sequences;
using opguard::bisect::AlignStep;

std::size_t lcs(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  std::vector<std::vector<std::size_t>> t(a.size() + 1, std::vector<std::size_t>(b.size() + 1, 0));
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j)
      t[i][j] = a[i - 1] == b[j - 1] ? t[i - 1][j - 1] + 1 : std::max(t[i - 1][j], t[i][j - 1]);
  return t[a.size()][b.size()];
}

// Valid: every element of both sides appears once, in order; matches are equal.
std::size_t check_script(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b,
                         const std::vector<AlignStep>& s) {
  int next_a = 0, next_b = 0;
  std::size_t matches = 0;
  for (const auto& step : s) {
    if (step.a >= 0) REQUIRE(step.a == next_a++);
    if (step.b >= 0) REQUIRE(step.b == next_b++);
    if (step.a >= 0 && step.b >= 0) {
      REQUIRE(a[step.a] == b[step.b]);
      ++matches;
    }
  }
  REQUIRE(next_a == static_cast<int>(a.size()));
  REQUIRE(next_b == static_cast<int>(b.size()));
  return matches;
}

std::vector<AlignStep> align(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  return align_sequences(a.data(), a.size(), b.data(), b.size());
}

}  // namespace

TEST_CASE("identical sequences align one to one") {
  std::vector<uint64_t> a = {1, 2, 3, 4, 5};
  auto s = align(a, a);
  CHECK(check_script(a, a, s) == 5);
  CHECK(s.size() == 5);
}

TEST_CASE("one inserted op does not shift the ops after it") {
  std::vector<uint64_t> a = {1, 2, 3, 4, 5, 6}, b = {1, 2, 3, 99, 4, 5, 6};
  auto s = align(a, b);
  CHECK(check_script(a, b, s) == 6);
  CHECK(s[3].a == -1);
  CHECK(s[3].b == 3);
  CHECK(s[4].a == 3);
  CHECK(s[4].b == 4);
}

TEST_CASE("a deleted op and a fused pair leave the rest matched") {
  std::vector<uint64_t> a = {1, 2, 3, 4, 5, 6, 7}, b = {1, 3, 45, 6, 7};
  auto s = align(a, b);
  CHECK(check_script(a, b, s) == 4);  // 1, 3, 6, 7
}

TEST_CASE("empty sides align as pure insertions or deletions") {
  std::vector<uint64_t> a = {}, b = {1, 2};
  CHECK(check_script(a, b, align(a, b)) == 0);
  CHECK(check_script(b, a, align(b, a)) == 0);
  CHECK(align(a, a).empty());
}

TEST_CASE("the edit script is as short as a dynamic-programming LCS says on random sequences") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = rng() % 60, m = rng() % 60;
    const uint64_t alphabet = 1 + rng() % 6;
    std::vector<uint64_t> a(n), b(m);
    for (auto& x : a) x = rng() % alphabet;
    for (auto& x : b) x = rng() % alphabet;
    INFO("trial " << trial);
    CHECK(check_script(a, b, align(a, b)) == lcs(a, b));
  }
}

TEST_CASE("long mostly-equal sequences with scattered edits align near-optimally and stay valid") {
  std::mt19937_64 rng(11);
  std::vector<uint64_t> a(20000);
  for (auto& x : a) x = rng();
  std::vector<uint64_t> b;
  int edits = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (i % 997 == 0) {
      b.push_back(rng());  // inserted
      ++edits;
    }
    if (i % 1499 == 0) {
      ++edits;
      continue;  // deleted
    }
    b.push_back(a[i]);
  }
  auto s = align(a, b);
  const std::size_t matches = check_script(a, b, s);
  CHECK(matches == a.size() - a.size() / 1499 - 1);
}

TEST_CASE("a one-sided gap among equal signatures moves to where the pairs are most alike, and only there") {
  using opguard::bisect::slide_gaps;
  // The reference evaluates the EMA copy (E) and then the model (M), the same
  // signatures; the suspect evaluates the model only. Values: the event's
  // "content" (what it read); pairs of equal content are alike.
  const std::vector<uint64_t> a = {7, 1, 2, 3, 1, 2, 3, 9}, b = {7, 1, 2, 3, 9};
  const std::vector<int> content_a = {0, 10, 11, 12, 20, 21, 22, 30}, content_b = {0, 20, 21, 22, 30};
  auto like = [&](int32_t i, int32_t j) { return int64_t{content_a[i] == content_b[j]}; };
  auto s = align(a, b);
  REQUIRE(check_script(a, b, s) == 5);
  CHECK(s[1].b == 1);
  CHECK(s[1].a == 1);  // the prefix takes the EMA's events
  slide_gaps(s, a.data(), b.data(), like);
  CHECK(check_script(a, b, s) == 5);
  for (const auto& step : s)
    if (step.a >= 0 && step.b >= 0) CHECK(content_a[step.a] == content_b[step.b]);
  // Suspect-only events, the gap on the other side; and a slide to the right.
  auto t = align(b, a);
  slide_gaps(t, b.data(), a.data(), [&](int32_t i, int32_t j) { return int64_t{content_b[i] == content_a[j]}; });
  CHECK(check_script(b, a, t) == 5);
  for (const auto& step : t)
    if (step.a >= 0 && step.b >= 0) CHECK(content_b[step.a] == content_a[step.b]);
  const std::vector<int> early_b = {0, 10, 11, 12, 30};  // the suspect evaluated the EMA copy: stays
  auto u = align(a, b);
  slide_gaps(u, a.data(), b.data(), [&](int32_t i, int32_t j) { return int64_t{content_a[i] == early_b[j]}; });
  CHECK(u[1].a == 1);
  CHECK(u[4].b == -1);
  // No difference in affinity: the script is left as it was.
  auto v = align(a, b);
  const auto before = v;
  slide_gaps(v, a.data(), b.data(), [](int32_t, int32_t) { return int64_t{1}; });
  for (std::size_t i = 0; i < v.size(); ++i) CHECK((v[i].a == before[i].a && v[i].b == before[i].b));
}

TEST_CASE("gap sliding keeps every script valid on random sequences with repeats") {
  using opguard::bisect::slide_gaps;
  std::mt19937_64 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::vector<uint64_t> a, b;
    const int na = static_cast<int>(rng() % 40), nb = static_cast<int>(rng() % 40);
    for (int i = 0; i < na; ++i) a.push_back(rng() % 3);
    for (int j = 0; j < nb; ++j) b.push_back(rng() % 3);
    auto s = align(a, b);
    const std::size_t matches = check_script(a, b, s);
    slide_gaps(s, a.data(), b.data(), [&](int32_t i, int32_t j) { return static_cast<int64_t>((i * 31 + j * 17) % 5); });
    CHECK(check_script(a, b, s) == matches);
  }
}
