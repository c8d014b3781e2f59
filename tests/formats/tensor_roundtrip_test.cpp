// Full tensors through StepWriter::write_tensor and StepReader::read_tensor:
// every dtype comes back with exactly the bits it went in with. The inputs are
// crafted at the bit level (NaN payloads, signalling NaNs, signed zeros,
// infinities, subnormals, extreme integers), the values a converting or
// normalising write path would change.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <hdf5.h>

#include <cstring>
#include <string>
#include <vector>

#include "../support/process.h"
#include "opguard/core/dtype.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"

using opguard::DType;
using opguard::testing::TempDir;
namespace fmts = opguard::formats;

namespace {

// Appends the low `size` bytes of `bits`, little-endian.
void put(std::vector<uint8_t>& out, uint64_t bits, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) out.push_back(static_cast<uint8_t>(bits >> (8 * i)));
}

// Element bit patterns per floating format: quiet NaN with a payload,
// signalling NaN, negative NaN, +0, -0, +inf, -inf, the smallest and the
// largest subnormal, the largest finite value, 1.0, -1.0.
std::vector<uint64_t> float_patterns(std::size_t size) {
  switch (size) {
    case 8:
      return {0x7ff8000000000123, 0x7ff0000000000001, 0xfff8000000000000, 0x0000000000000000,
              0x8000000000000000, 0x7ff0000000000000, 0xfff0000000000000, 0x0000000000000001,
              0x000fffffffffffff, 0x7fefffffffffffff, 0x3ff0000000000000, 0xbff0000000000000};
    case 4:
      return {0x7fc00123, 0x7f800001, 0xffc00000, 0x00000000, 0x80000000, 0x7f800000,
              0xff800000, 0x00000001, 0x007fffff, 0x7f7fffff, 0x3f800000, 0xbf800000};
    default:
      OPGUARD_CHECK(false && "no float patterns for this size");
      return {};
  }
}

std::vector<uint8_t> crafted_bytes(DType d) {
  std::vector<uint8_t> out;
  auto put_all = [&](const std::vector<uint64_t>& patterns, std::size_t size) {
    for (uint64_t p : patterns) put(out, p, size);
  };
  switch (d) {
    case DType::kFloat64: put_all(float_patterns(8), 8); break;
    case DType::kFloat32: put_all(float_patterns(4), 4); break;
    case DType::kFloat16:
      put_all({0x7e01, 0x7c01, 0xfe00, 0x0000, 0x8000, 0x7c00, 0xfc00, 0x0001, 0x03ff, 0x7bff, 0x3c00, 0xbc00}, 2);
      break;
    case DType::kBFloat16:
      put_all({0x7fc1, 0x7f81, 0xffc0, 0x0000, 0x8000, 0x7f80, 0xff80, 0x0001, 0x007f, 0x7f7f, 0x3f80, 0xbf80}, 2);
      break;
    case DType::kInt8: put_all({0x80, 0x7f, 0xff, 0x00, 0x01}, 1); break;
    case DType::kInt16: put_all({0x8000, 0x7fff, 0xffff, 0x0000, 0x0001}, 2); break;
    case DType::kInt32: put_all({0x80000000, 0x7fffffff, 0xffffffff, 0x0, 0x1}, 4); break;
    case DType::kInt64:
      put_all({0x8000000000000000, 0x7fffffffffffffff, 0xffffffffffffffff, 0x0, 0x1}, 8);
      break;
    case DType::kUInt8: put_all({0x00, 0xff, 0x80, 0x7f, 0x01}, 1); break;
    case DType::kUInt16: put_all({0x0000, 0xffff, 0x8000, 0x0001}, 2); break;
    case DType::kUInt32: put_all({0x0, 0xffffffff, 0x80000000, 0x1}, 4); break;
    case DType::kUInt64: put_all({0x0, 0xffffffffffffffff, 0x8000000000000000, 0x1}, 8); break;
    case DType::kBool: put_all({0, 1, 1, 0}, 1); break;
    case DType::kFloat8E4M3: put_all({0x7f, 0xff, 0x00, 0x80, 0x01, 0x07, 0x7e, 0x38}, 1); break;
    case DType::kFloat8E5M2: put_all({0x7d, 0x7c, 0xfc, 0x00, 0x80, 0x01, 0x03, 0x7b}, 1); break;
    case DType::kComplex64:
      // (re, im) pairs mixing every float32 pattern with another one.
      for (std::size_t i = 0; i < float_patterns(4).size(); ++i) {
        put(out, float_patterns(4)[i], 4);
        put(out, float_patterns(4)[(i + 5) % float_patterns(4).size()], 4);
      }
      break;
    case DType::kComplex128:
      for (std::size_t i = 0; i < float_patterns(8).size(); ++i) {
        put(out, float_patterns(8)[i], 8);
        put(out, float_patterns(8)[(i + 7) % float_patterns(8).size()], 8);
      }
      break;
  }
  return out;
}

std::vector<DType> all_dtypes() {
  std::vector<DType> out;
  for (int i = 0; i < opguard::kNumDTypes; ++i) out.push_back(static_cast<DType>(i));
  return out;
}

int64_t elements(DType d, const std::vector<uint8_t>& bytes) {
  return static_cast<int64_t>(bytes.size() / opguard::dtype_size(d));
}

}  // namespace

TEST_CASE("every dtype round-trips bit for bit through a step file, NaN payloads and signed zeros included") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  std::vector<std::vector<uint8_t>> written;
  std::vector<std::vector<int64_t>> shapes;
  {
    fmts::StepWriter writer(path, 0, 0);
    for (DType d : all_dtypes()) {
      std::vector<uint8_t> bytes = crafted_bytes(d);
      REQUIRE(bytes.size() % opguard::dtype_size(d) == 0);
      REQUIRE(bytes.size() > 0);
      std::vector<int64_t> sizes = {elements(d, bytes)};
      int64_t index = writer.write_tensor(d, sizes, bytes.data(), bytes.size());
      CHECK(index == static_cast<int64_t>(written.size()));
      written.push_back(bytes);
      shapes.push_back(sizes);
    }
    writer.close();
  }
  fmts::StepReader reader(path);
  REQUIRE(reader.data_count() == written.size());
  for (DType d : all_dtypes()) {
    CAPTURE(opguard::dtype_name(d));
    const auto i = static_cast<std::size_t>(d);
    fmts::TensorData data = reader.read_tensor(static_cast<int64_t>(i));
    CHECK(data.dtype == d);
    CHECK(data.sizes == shapes[i]);
    REQUIRE(data.bytes.size() == written[i].size());
    CHECK(std::memcmp(data.bytes.data(), written[i].data(), written[i].size()) == 0);
  }
}

// Format 3: the dtype attribute is where the HDF5 type does not tell the dtype.
TEST_CASE("/data/<n> carries a dtype attribute exactly for float16, bfloat16, bool and the float8s") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  {
    fmts::StepWriter writer(path, 0, 0);
    for (DType d : all_dtypes()) {
      std::vector<uint8_t> bytes = crafted_bytes(d);
      writer.write_tensor(d, {elements(d, bytes)}, bytes.data(), bytes.size());
    }
    writer.close();
  }
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  for (DType d : all_dtypes()) {
    CAPTURE(opguard::dtype_name(d));
    const std::string name = "/data/" + std::to_string(static_cast<int>(d));
    const bool expected = d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kBool ||
                          d == DType::kFloat8E4M3 || d == DType::kFloat8E5M2;
    CHECK(H5Aexists_by_name(file, name.c_str(), "dtype", H5P_DEFAULT) == (expected ? 1 : 0));
  }
  H5Fclose(file);
}

TEST_CASE("a /data dataset whose dtype attribute is missing where its HDF5 type does not tell the dtype is refused") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  std::vector<uint8_t> half = crafted_bytes(DType::kFloat16), flags = crafted_bytes(DType::kBool);
  {
    fmts::StepWriter writer(path, 0, 0);
    writer.write_tensor(DType::kFloat16, {elements(DType::kFloat16, half)}, half.data(), half.size());
    writer.write_tensor(DType::kBool, {elements(DType::kBool, flags)}, flags.data(), flags.size());
    writer.close();
  }
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  CHECK(H5Adelete_by_name(file, "/data/0", "dtype", H5P_DEFAULT) >= 0);
  CHECK(H5Adelete_by_name(file, "/data/1", "dtype", H5P_DEFAULT) >= 0);
  H5Fclose(file);
  fmts::StepReader reader(path);
  CHECK_THROWS_WITH_AS(reader.read_tensor(int64_t{0}), doctest::Contains("has no dtype attribute"),
                       opguard::FormatError);
  // Without its attribute a bool tensor reads as the uint8 its HDF5 type names,
  // which its value row then contradicts.
  CHECK(reader.read_tensor(int64_t{1}).dtype == DType::kUInt8);
  fmts::TensorMeta meta;
  meta.dtype = DType::kBool;
  meta.sizes = {elements(DType::kBool, flags)};
  meta.strides = {1};
  meta.data_index = 1;
  CHECK_THROWS_AS(reader.read_tensor(meta), opguard::FormatError);
}

TEST_CASE("a multi-dimensional tensor keeps its shape and its row-major bytes") {
  TempDir tmp;
  const std::string path = tmp / "step00000001.h5";
  std::vector<uint8_t> bytes = crafted_bytes(DType::kFloat32);  // 12 elements
  const std::vector<int64_t> sizes = {2, 3, 2};
  {
    fmts::StepWriter writer(path, 3, 1);
    REQUIRE(writer.write_tensor(DType::kFloat32, sizes, bytes.data(), bytes.size()) == 0);
    CHECK(writer.bytes_written() == bytes.size());
    writer.close();
  }
  fmts::StepReader reader(path);
  CHECK(reader.rank() == 3);
  CHECK(reader.step() == 1);
  fmts::TensorData data = reader.read_tensor(0);
  CHECK(data.sizes == sizes);
  CHECK(data.bytes == bytes);
}

TEST_CASE("zero-size tensors of every dtype come back with their shape and no bytes") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  const std::vector<std::vector<int64_t>> shapes = {{0}, {3, 0}, {0, 5, 2}};
  {
    fmts::StepWriter writer(path, 0, 0);
    for (DType d : all_dtypes()) {
      for (const auto& sizes : shapes) writer.write_tensor(d, sizes, nullptr, 0);
    }
    writer.close();
  }
  fmts::StepReader reader(path);
  REQUIRE(reader.data_count() == all_dtypes().size() * shapes.size());
  int64_t index = 0;
  for (DType d : all_dtypes()) {
    for (const auto& sizes : shapes) {
      CAPTURE(opguard::dtype_name(d));
      fmts::TensorData data = reader.read_tensor(index++);
      CHECK(data.dtype == d);
      CHECK(data.sizes == sizes);
      CHECK(data.bytes.empty());
    }
  }
}

TEST_CASE("0-d tensors of every dtype are stored as HDF5 scalars and come back with no dimensions") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  std::vector<std::vector<uint8_t>> written;
  {
    fmts::StepWriter writer(path, 0, 0);
    for (DType d : all_dtypes()) {
      std::vector<uint8_t> bytes = crafted_bytes(d);
      bytes.resize(opguard::dtype_size(d));  // the first crafted element: a NaN with payload for floats
      writer.write_tensor(d, {}, bytes.data(), bytes.size());
      written.push_back(bytes);
    }
    writer.close();
  }
  fmts::StepReader reader(path);
  for (DType d : all_dtypes()) {
    CAPTURE(opguard::dtype_name(d));
    fmts::TensorData data = reader.read_tensor(static_cast<int64_t>(d));
    CHECK(data.dtype == d);
    CHECK(data.sizes.empty());
    CHECK(data.bytes == written[static_cast<std::size_t>(d)]);
  }
}

TEST_CASE("a tensor larger than one fingerprint chunk round-trips") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  // 3 MiB + 8 bytes of int64 counting up: every element distinct.
  const int64_t n = (3 << 20) / 8 + 1;
  std::vector<int64_t> values(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = i * 0x0101010101 - (n / 2);
  {
    fmts::StepWriter writer(path, 0, 0);
    writer.write_tensor(DType::kInt64, {n}, values.data(), values.size() * 8);
    writer.close();
  }
  fmts::StepReader reader(path);
  fmts::TensorData data = reader.read_tensor(0);
  REQUIRE(data.bytes.size() == values.size() * 8);
  CHECK(std::memcmp(data.bytes.data(), values.data(), data.bytes.size()) == 0);
}

TEST_CASE("reading a tensor checks it against the dtype and shape its value row names") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  std::vector<uint8_t> bytes = crafted_bytes(DType::kInt32);  // 5 elements
  {
    fmts::StepWriter writer(path, 0, 0);
    writer.write_tensor(DType::kInt32, {5}, bytes.data(), bytes.size());
    writer.close();
  }
  fmts::StepReader reader(path);
  fmts::TensorMeta meta;
  meta.dtype = DType::kInt32;
  meta.sizes = {5};
  meta.strides = {1};
  meta.data_index = 0;
  CHECK(reader.read_tensor(meta).bytes == bytes);
  meta.dtype = DType::kUInt32;
  CHECK_THROWS_AS(reader.read_tensor(meta), opguard::FormatError);
  meta.dtype = DType::kInt32;
  meta.sizes = {1, 5};
  CHECK_THROWS_AS(reader.read_tensor(meta), opguard::FormatError);
  CHECK_THROWS_AS(reader.read_tensor(int64_t{1}), opguard::FormatError);
  CHECK_THROWS_AS(reader.read_tensor(int64_t{-1}), opguard::FormatError);
}
