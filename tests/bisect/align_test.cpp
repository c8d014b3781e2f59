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
