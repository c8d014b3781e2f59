// ddmin on synthetic oracles whose minimal change sets are known: one knob,
// a pair that flips the bits only together, knobs whose trials fail or give
// third bits, and the knob-difference helpers of bisect config.

#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <utility>
#include <vector>

#include "opguard/bisect/bisect.h"

namespace bisect = opguard::bisect;
using bisect::TrialOutcome;

namespace {

bool has(const std::vector<int>& s, int x) { return std::find(s.begin(), s.end(), x) != s.end(); }

// Counts distinct subsets asked, and checks the oracle is never asked twice.
struct Counting {
  explicit Counting(std::function<TrialOutcome(const std::vector<int>&)> fn) : f(std::move(fn)) {}
  std::function<TrialOutcome(const std::vector<int>&)> f;
  std::set<std::vector<int>> asked;
  bool repeated = false;
  bisect::Oracle oracle() {
    return [this](const std::vector<int>& s) {
      repeated = repeated || !asked.insert(s).second;
      CHECK(std::is_sorted(s.begin(), s.end()));
      return f(s);
    };
  }
};

}  // namespace

TEST_CASE("ddmin finds the one knob of eight that flips the bits, in fewer trials than one per subset") {
  Counting c{[](const std::vector<int>& s) { return has(s, 5) ? TrialOutcome::kBad : TrialOutcome::kGood; }};
  const auto r = bisect::ddmin(8, c.oracle());
  CHECK(r.minimal == std::vector<int>{5});
  CHECK(r.one_minimal);
  CHECK_FALSE(c.repeated);
  CHECK(r.oracle_calls == static_cast<int>(c.asked.size()));
  CHECK(r.oracle_calls <= 12);  // log2(8) halvings plus the checks, far below 2^8
}

TEST_CASE("ddmin keeps a pair of knobs that only flip the bits together, and drops the others") {
  Counting c{[](const std::vector<int>& s) {
    return has(s, 1) && has(s, 6) ? TrialOutcome::kBad : TrialOutcome::kGood;
  }};
  const auto r = bisect::ddmin(7, c.oracle());
  CHECK(r.minimal == std::vector<int>{1, 6});
  CHECK(r.one_minimal);
  CHECK_FALSE(c.repeated);
}

TEST_CASE("trials where the op fails or gives third bits are unresolved, not the divergence") {
  // Knob 0 alone makes the op fail; knob 3 without knob 0 gives other bits;
  // the bad bits need 2 and 3 together.
  Counting c{[](const std::vector<int>& s) {
    if (has(s, 0) && !has(s, 3)) return TrialOutcome::kFailed;
    if (has(s, 2) && has(s, 3)) return TrialOutcome::kBad;
    if (has(s, 3)) return TrialOutcome::kOther;
    return TrialOutcome::kGood;
  }};
  const auto r = bisect::ddmin(5, c.oracle());
  CHECK(r.minimal == std::vector<int>{2, 3});
  CHECK(r.one_minimal);
}

TEST_CASE("when every knob is needed, ddmin returns all of them") {
  Counting c{[](const std::vector<int>& s) { return s.size() == 4 ? TrialOutcome::kBad : TrialOutcome::kGood; }};
  const auto r = bisect::ddmin(4, c.oracle());
  CHECK(r.minimal == std::vector<int>{0, 1, 2, 3});
  CHECK(r.one_minimal);
}

TEST_CASE("of two independent explanations ddmin returns one, and it is 1-minimal") {
  // {1} alone or {3,4} together give the bad bits.
  auto f = [](const std::vector<int>& s) {
    return has(s, 1) || (has(s, 3) && has(s, 4)) ? TrialOutcome::kBad : TrialOutcome::kGood;
  };
  Counting c{f};
  const auto r = bisect::ddmin(6, c.oracle());
  CHECK((r.minimal == std::vector<int>{1} || r.minimal == std::vector<int>{3, 4}));
  for (std::size_t k = 0; k < r.minimal.size(); ++k) {
    auto smaller = r.minimal;
    smaller.erase(smaller.begin() + static_cast<std::ptrdiff_t>(k));
    CHECK(f(smaller) != TrialOutcome::kBad);
  }
}

TEST_CASE("one knob: ddmin asks nothing beyond removing it") {
  Counting c{[](const std::vector<int>& s) { return s.empty() ? TrialOutcome::kGood : TrialOutcome::kBad; }};
  const auto r = bisect::ddmin(1, c.oracle());
  CHECK(r.minimal == std::vector<int>{0});
  CHECK(r.oracle_calls == 1);  // the empty set
}

TEST_CASE("config differences name changed, added and removed knobs; applying them all gives the bad config") {
  const auto good = opguard::replay::Config::parse("threads=2,cpu_capability=avx2,mkldnn=on");
  const auto bad = opguard::replay::Config::parse("threads=1,mkldnn=on,deterministic=on");
  const auto d = bisect::config_differences(good, bad);
  REQUIRE(d.size() == 3);
  CHECK(d[0].knob == "threads");
  CHECK(d[0].good_value == "2");
  CHECK(d[0].bad_value == "1");
  CHECK(d[1].knob == "cpu_capability");
  CHECK(d[1].bad_value.empty());
  CHECK(d[2].knob == "deterministic");
  CHECK(d[2].good_value.empty());
  CHECK(d[0].text() == "threads: 2 -> 1");
  const auto all = bisect::apply_changes(good, d);
  CHECK(bisect::config_differences(all, bad).empty());
  CHECK(bisect::apply_changes(good, {d[0]}).to_string() == "threads=1,cpu_capability=avx2,mkldnn=on");
  CHECK(bisect::config_differences(good, good).empty());
}

TEST_CASE("shrink's text gives the slices as opguard repro --slices takes them") {
  bisect::ShrinkResult r;
  r.diverges = true;
  r.slices = {{0, 1, 0, 1}, {1, 1, 2, 3}};
  const std::string t = bisect::shrink_text(r);
  CHECK(t.find("): 0:1:0:1,1:1:2:3\n") != std::string::npos);
}
