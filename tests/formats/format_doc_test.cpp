// The h5py snippet of docs/FORMAT.md, extracted from the page as it stands and
// run on a step file written by StepWriter: it must print the event exactly,
// tensor bytes included (so the page and the format cannot drift apart).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "../support/process.h"
#include "values.h"
#include "opguard/formats/recording.h"

using opguard::DType;
using opguard::testing::read_file;
using opguard::testing::run;
using opguard::testing::TempDir;
namespace fmts = opguard::formats;

namespace {

const std::string kPython = OPGUARD_PYTHON_BIN;
const std::string kFormatMd = OPGUARD_FORMAT_MD;
const char* const kMarker = "<!-- read_event.py: extracted and run by tests/formats/format_doc_test.cpp -->";

// The ```python block right after the marker line.
std::string extract_snippet(const std::string& page) {
  std::size_t marker = page.find(kMarker);
  if (marker == std::string::npos) return "";
  std::size_t open = page.find("```python\n", marker);
  if (open == std::string::npos) return "";
  open += 10;
  std::size_t close = page.find("\n```", open);
  if (close == std::string::npos) return "";
  return page.substr(open, close - open + 1);
}

std::string hex(const std::vector<uint8_t>& bytes) {
  std::string out;
  char b[3];
  for (uint8_t x : bytes) {
    std::snprintf(b, sizeof(b), "%02x", x);
    out += b;
  }
  return out;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  const auto* p = reinterpret_cast<const uint8_t*>(values.data());
  return std::vector<uint8_t>(p, p + values.size() * sizeof(T));
}

fmts::Value tensor(const std::string& name, DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                   uint64_t fingerprint, int64_t data_index) {
  fmts::Value v = opguard::testing::tensor_value(name, dtype, std::move(sizes), std::move(strides), fingerprint);
  v.tensor.data_index = data_index;
  if (data_index >= 0) v.tensor.flags = fmts::kTensorHasData;
  return v;
}

}  // namespace

TEST_CASE("the h5py snippet of FORMAT.md prints an event and the exact bytes of its tensors") {
  const std::string snippet = extract_snippet(read_file(kFormatMd));
  REQUIRE_MESSAGE(!snippet.empty(), "no ```python block after the marker in " << kFormatMd);
  TempDir tmp;
  const std::string script = tmp / "read_event.py";
  std::ofstream(script) << snippet;
  const std::string path = tmp / "step00000003.h5";

  // Crafted bits: a float32 NaN with payload, -0, +inf, the smallest
  // subnormal, 1, -1 (transposed view); a 0-d bfloat16 NaN with payload; float16
  // in a tensor list; bool; a zero-size int64; complex64 output.
  const std::vector<uint32_t> f32 = {0x7fc00123, 0x80000000, 0x7f800000, 0x00000001, 0x3f800000, 0xbf800000};
  const std::vector<uint16_t> bf16 = {0x7fc1};
  const std::vector<uint16_t> f16 = {0x7e01, 0x8000};
  const std::vector<uint8_t> flags = {1, 0, 1};
  const std::vector<float> c64 = {1.5f, -0.0f, -2.25f, 3.0f};
  {
    fmts::StepWriter writer(path, 0, 3);
    const int64_t d_f32 = writer.write_tensor(DType::kFloat32, {2, 3}, f32.data(), 24);
    const int64_t d_bf16 = writer.write_tensor(DType::kBFloat16, {}, bf16.data(), 2);
    const int64_t d_f16 = writer.write_tensor(DType::kFloat16, {2}, f16.data(), 4);
    const int64_t d_bool = writer.write_tensor(DType::kBool, {3}, flags.data(), 3);
    const int64_t d_empty = writer.write_tensor(DType::kInt64, {0, 4}, nullptr, 0);
    const int64_t d_c64 = writer.write_tensor(DType::kComplex64, {2}, c64.data(), 16);

    fmts::Event first;  // another event in the file, of the main thread
    first.id = fmts::make_event_id(0, 7);
    first.seq = 7;
    first.step = 3;
    first.op = "aten::zero_";
    writer.add_event(first);

    fmts::Event e;
    e.stream = 2;
    e.seq = 57;
    e.id = fmts::make_event_id(2, 57);
    e.step = 3;
    e.phase = fmts::Phase::kBackward;
    e.op = "aten::custom";
    e.overload = "out";
    e.schema = "aten::custom.out(...)";
    e.scope = "blocks.1.attn";
    e.inputs.push_back(tensor("self", DType::kFloat32, {2, 3}, {1, 2}, 0x0123456789abcdefULL, d_f32));
    e.inputs.push_back(tensor("other", DType::kBFloat16, {}, {}, 0xfedcba9876543210ULL, d_bf16));
    fmts::Value alpha;
    alpha.kind = fmts::ValueKind::kDouble;
    alpha.name = "alpha";
    alpha.text = "-0x1.8p+1";
    e.inputs.push_back(alpha);
    fmts::Value list;
    list.kind = fmts::ValueKind::kTensorList;
    list.name = "tensors";
    list.list_len = 2;
    e.inputs.push_back(list);
    e.inputs.push_back(tensor("tensors", DType::kFloat16, {2}, {1}, 42, d_f16));
    fmts::Value none;
    none.name = "tensors";
    e.inputs.push_back(none);
    e.inputs.push_back(tensor("mask", DType::kBool, {3}, {1}, 43, d_bool));
    e.inputs.push_back(tensor("empty", DType::kInt64, {0, 4}, {4, 1}, 44, d_empty));
    e.inputs.push_back(tensor("fingerprint_only", DType::kFloat32, {5}, {2}, 45, -1));
    e.outputs.push_back(tensor("out", DType::kComplex64, {2}, {1}, 46, d_c64));
    writer.add_event(e);
    writer.close();
  }

  auto r = run({kPython, script, path, "2.57"}, tmp.path().string());
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string expected =
      "aten::custom.out step 3 backward [blocks.1.attn]\n"
      "input 0 self: tensor [2, 3] strides [1, 2] fingerprint 0123456789abcdef float32 data " +
      hex(bytes_of(f32)) +
      "\n"
      "input 1 other: tensor [] strides [] fingerprint fedcba9876543210 bfloat16 data " +
      hex(bytes_of(bf16)) +
      "\n"
      "input 2 alpha: double = -0x1.8p+1\n"
      "input 3 tensors: tensor_list\n"
      "input 4 tensors: tensor [2] strides [1] fingerprint 000000000000002a float16 data " +
      hex(bytes_of(f16)) +
      "\n"
      "input 5 tensors: none\n"
      "input 6 mask: tensor [3] strides [1] fingerprint 000000000000002b bool data 010001\n"
      "input 7 empty: tensor [0, 4] strides [4, 1] fingerprint 000000000000002c int64 data \n"
      "input 8 fingerprint_only: tensor [5] strides [2] fingerprint 000000000000002d\n"
      "output 0 out: tensor [2] strides [1] fingerprint 000000000000002e complex64 data " +
      hex(bytes_of(c64)) + "\n";
  CHECK(r.out == expected);

  auto main_thread = run({kPython, script, path, "7"}, tmp.path().string());
  REQUIRE(main_thread.exit_code == 0);
  CHECK(main_thread.out == "aten::zero_. step 3 other []\n");
}
