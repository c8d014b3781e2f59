// Readers on input that is not a valid recording: truncated, corrupted, foreign
// HDF5, another format version, not HDF5 at all, not a recording directory.
// Each gives FormatError (a sentence for exit code 65), never a crash.
#include <doctest/doctest.h>
#include <hdf5.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../support/h5_edit.h"
#include "../support/process.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"

using opguard::DType;
using opguard::testing::column_rows;
using opguard::testing::read_file;
using opguard::testing::set_column_row;
using opguard::testing::set_int_attribute;
using opguard::testing::TempDir;
namespace fmts = opguard::formats;
namespace fs = std::filesystem;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A small but complete step file: two tensors and two events referring to them.
std::string write_sample_step(const std::string& path) {
  fmts::StepWriter writer(path, 0, 4);
  std::vector<float> a(64);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f;
  std::vector<int64_t> b = {1, -2, 3};
  int64_t ia = writer.write_tensor(DType::kFloat32, {8, 8}, a.data(), a.size() * 4);
  int64_t ib = writer.write_tensor(DType::kInt64, {3}, b.data(), b.size() * 8);
  for (uint64_t seq : {0, 1}) {
    fmts::Event e;
    e.id = fmts::make_event_id(0, seq);
    e.seq = seq;
    e.step = 4;
    e.op = "aten::mul";
    e.overload = "Tensor";
    e.schema = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor";
    e.scope = "blocks.0.mlp";
    fmts::Value in;
    in.kind = fmts::ValueKind::kTensor;
    in.name = "self";
    in.tensor.sizes = {8, 8};
    in.tensor.strides = {8, 1};
    in.tensor.data_index = ia;
    in.tensor.flags = fmts::kTensorHasData;
    e.inputs.push_back(in);
    fmts::Value out;
    out.kind = fmts::ValueKind::kTensor;
    out.tensor.dtype = DType::kInt64;
    out.tensor.sizes = {3};
    out.tensor.strides = {1};
    out.tensor.data_index = ib;
    out.tensor.flags = fmts::kTensorHasData;
    e.outputs.push_back(out);
    writer.add_event(e);
  }
  writer.close();
  return read_file(path);
}

// Opens `path` and reads everything in it. Returns "ok" or "FormatError";
// any other exception fails the test (a crash fails the binary).
std::string read_everything(const std::string& path) {
  try {
    fmts::StepReader reader(path);
    for (const auto& e : reader.events()) {
      for (const auto* side : {&e.inputs, &e.outputs}) {
        for (const auto& v : *side) {
          if (fmts::carries_tensor(v.kind) && v.tensor.data_index >= 0) reader.read_tensor(v.tensor);
        }
      }
    }
    for (std::size_t i = 0; i < reader.data_count(); ++i) reader.read_tensor(static_cast<int64_t>(i));
    return "ok";
  } catch (const opguard::FormatError& e) {
    // One sentence naming the file.
    CHECK(std::string(e.what()).find(path) != std::string::npos);
    return "FormatError";
  }
}

// A foreign HDF5 file: a dataset and, optionally, opguard's root attributes
// with the given values (to imitate another version or kind).
void write_foreign_hdf5(const std::string& path, int format_version = -1, const char* kind = nullptr) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  REQUIRE(file >= 0);
  hsize_t dims[1] = {4};
  hid_t space = H5Screate_simple(1, dims, nullptr);
  hid_t ds = H5Dcreate2(file, "temperature", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  double values[4] = {1.5, 2.5, 3.5, 4.5};
  REQUIRE(H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) >= 0);
  H5Dclose(ds);
  H5Sclose(space);
  hid_t scalar = H5Screate(H5S_SCALAR);
  if (format_version >= 0) {
    hid_t attr = H5Acreate2(file, "opguard_format", H5T_STD_I32LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(attr, H5T_NATIVE_INT, &format_version) >= 0);
    H5Aclose(attr);
  }
  if (kind != nullptr) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    hid_t attr = H5Acreate2(file, "kind", type, scalar, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(attr, type, &kind) >= 0);
    H5Aclose(attr);
    H5Tclose(type);
  }
  H5Sclose(scalar);
  REQUIRE(H5Fclose(file) >= 0);
}

}  // namespace

TEST_CASE("a step file truncated at any length gives FormatError") {
  TempDir tmp;
  const std::string good = tmp / "good.h5";
  const std::string bytes = write_sample_step(good);
  REQUIRE(read_everything(good) == "ok");
  const std::string cut = tmp / "cut.h5";
  std::size_t tried = 0;
  for (std::size_t len = 0; len < bytes.size(); len += (len < 4096 ? 61 : 509)) {
    CAPTURE(len);
    write_bytes(cut, bytes.substr(0, len));
    CHECK(read_everything(cut) == "FormatError");
    ++tried;
  }
  write_bytes(cut, bytes.substr(0, bytes.size() - 1));
  CHECK(read_everything(cut) == "FormatError");
  CHECK(tried > 10);
}

namespace {

// The string columns of a step file (u32 rows of its string table) and the table itself.
const char* const kStringColumns[] = {"/events/op",   "/events/overload", "/events/schema", "/events/scope",
                                      "/events/node", "/values/name",     "/values/text",   "/values/device"};

// The byte ranges of the file that hold strings or refer to them: HDF5 global
// heap collections ("GCOL", version 1, then the collection size as u64: the
// string attributes), the string table's offsets and the raw data of the
// string columns. The bytes of /strings themselves are not among them: any
// byte there is a valid (other) string.
std::vector<std::pair<std::size_t, std::size_t>> string_ranges(const std::string& path, const std::string& bytes) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (std::size_t pos = bytes.find("GCOL\x01"); pos != std::string::npos; pos = bytes.find("GCOL\x01", pos + 1)) {
    uint64_t size = 0;
    std::memcpy(&size, bytes.data() + pos + 8, 8);
    out.emplace_back(pos, pos + size);
  }
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  std::vector<const char*> columns(std::begin(kStringColumns), std::end(kStringColumns));
  columns.push_back("/string_offsets");
  for (const char* column : columns) {
    hid_t ds = H5Dopen2(file, column, H5P_DEFAULT);
    REQUIRE(ds >= 0);
    haddr_t offset = H5Dget_offset(ds);
    REQUIRE(offset != HADDR_UNDEF);
    out.emplace_back(offset, offset + H5Dget_storage_size(ds));
    H5Dclose(ds);
  }
  H5Fclose(file);
  return out;
}

// Flips bits at every 13th byte in [begin, end). Returns {tried, rejected}.
std::pair<std::size_t, std::size_t> corrupt_and_read(const TempDir& tmp, const std::string& bytes, std::size_t begin,
                                                     std::size_t end,
                                                     const std::vector<std::pair<std::size_t, std::size_t>>& skip) {
  const std::string bad = tmp / "bad.h5";
  std::size_t rejected = 0;
  std::size_t tried = 0;
  for (std::size_t pos = begin; pos < end; pos += 13) {
    bool skipped = false;
    for (const auto& [b, e] : skip) skipped |= pos >= b && pos < e;
    if (skipped) continue;
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      CAPTURE(pos);
      CAPTURE(int{mask});
      std::string corrupt = bytes;
      corrupt[pos] = static_cast<char>(static_cast<uint8_t>(corrupt[pos]) ^ mask);
      write_bytes(bad, corrupt);
      std::string outcome = read_everything(bad);
      CHECK((outcome == "ok" || outcome == "FormatError"));
      rejected += outcome == "FormatError";
      ++tried;
    }
  }
  return {tried, rejected};
}

}  // namespace

TEST_CASE("a step file with a corrupted byte outside its strings reads or gives FormatError, never crashes") {
  TempDir tmp;
  const std::string bytes = write_sample_step(tmp / "good.h5");
  const auto strings = string_ranges(tmp / "good.h5", bytes);
  REQUIRE(strings.size() > 8);
  auto [tried, rejected] = corrupt_and_read(tmp, bytes, 0, bytes.size(), strings);
  // HDF5 1.8+ object headers carry checksums: most metadata corruption is
  // caught. Raw tensor and column bytes have no checksum, so some flips read
  // as "ok" (with other values).
  CHECK(rejected > 0);
  CHECK(rejected < tried);
}

// Neither HDF5 1.10's global heap nor raw column data has a checksum, and its
// variable-length reader trusts both (SIGSEGV in H5HG_read seen before the
// reader checked them: formats/global_heap.h). Every flip here must be caught
// or read back harmlessly.
TEST_CASE("a step file with a corrupted byte in its strings reads or gives FormatError, never crashes") {
  TempDir tmp;
  const std::string bytes = write_sample_step(tmp / "good.h5");
  const auto ranges = string_ranges(tmp / "good.h5", bytes);
  REQUIRE(ranges.size() > std::size(kStringColumns));
  for (const auto& [begin, end] : ranges) {
    auto [tried, rejected] = corrupt_and_read(tmp, bytes, begin, end, {});
    CHECK(tried > 0);
    CHECK(rejected > 0);
  }
}

TEST_CASE("a string index past the string table gives FormatError naming the column") {
  TempDir tmp;
  const std::string good = tmp / "good.h5";
  const std::string bytes = write_sample_step(good);
  const std::string bad = tmp / "bad.h5";
  const auto strings = static_cast<uint32_t>(column_rows(good, "/string_offsets") - 1);
  for (const char* column : kStringColumns) {
    for (uint32_t index : {strings, strings + 1, uint32_t{UINT32_MAX}}) {
      CAPTURE(column);
      CAPTURE(index);
      write_bytes(bad, bytes);
      set_column_row<uint32_t>(bad, column, H5T_STD_U32LE, 1, index);
      CHECK_THROWS_WITH_AS(fmts::StepReader{bad}, doctest::Contains(column), opguard::FormatError);
      const std::string names = "string " + std::to_string(index);
      CHECK_THROWS_WITH_AS(fmts::StepReader{bad}, doctest::Contains(names.c_str()), opguard::FormatError);
    }
  }
}

TEST_CASE("string offsets that decrease, do not start at 0 or end elsewhere than the table give FormatError") {
  TempDir tmp;
  const std::string good = tmp / "good.h5";
  const std::string bytes = write_sample_step(good);
  const std::size_t rows = column_rows(good, "/string_offsets");
  const std::size_t blob = column_rows(good, "/strings");
  REQUIRE(rows >= 4);
  REQUIRE(blob > 10);
  const std::string bad = tmp / "bad.h5";
  struct Case {
    std::size_t row;
    uint64_t value;
    const char* message;
  };
  for (const Case& c : {Case{rows - 1, blob + 1, "ends at"}, Case{rows - 1, blob - 1, "ends at"},
                        Case{rows - 1, UINT64_MAX, "ends at"}, Case{0, 1, "does not start at 0"},
                        Case{rows / 2, UINT64_MAX, "decreases"}, Case{rows / 2, 0, "decreases"}}) {
    CAPTURE(c.row);
    CAPTURE(c.value);
    write_bytes(bad, bytes);
    set_column_row<uint64_t>(bad, "/string_offsets", H5T_STD_U64LE, c.row, c.value);
    CHECK_THROWS_WITH_AS(fmts::StepReader{bad}, doctest::Contains(c.message), opguard::FormatError);
  }
  // Without its string table a step file is not read at all.
  write_bytes(bad, bytes);
  hid_t file = H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  REQUIRE(H5Ldelete(file, "/strings", H5P_DEFAULT) >= 0);
  REQUIRE(H5Fclose(file) >= 0);
  CHECK_THROWS_WITH_AS(fmts::StepReader{bad}, doctest::Contains("/strings"), opguard::FormatError);
}

TEST_CASE("a step file of format version 1 is refused with one sentence naming both versions") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  write_sample_step(path);
  set_int_attribute(path, "opguard_format", 1);
  CHECK_THROWS_WITH_AS(fmts::StepReader{path},
                       doctest::Contains(("it is in opguard format version 1, and this opguard reads version " +
                                          std::to_string(fmts::kFormatVersion))
                                             .c_str()),
                       opguard::FormatError);
}

TEST_CASE("a manifest with a corrupted byte anywhere reads or gives FormatError, never crashes") {
  TempDir tmp;
  const std::string good = tmp / "manifest.h5";
  fmts::Manifest m;
  for (int i = 0; i < 40; ++i) m.info["key" + std::to_string(i)] = "value " + std::to_string(i);  // dense attribute storage
  m.env["OMP_NUM_THREADS"] = "2";
  fmts::write_manifest(good, m);
  const std::string bytes = read_file(good);
  const std::string bad = tmp / "bad.h5";
  std::size_t rejected = 0;
  for (std::size_t pos = 0; pos < bytes.size(); pos += 7) {
    CAPTURE(pos);
    std::string corrupt = bytes;
    corrupt[pos] = static_cast<char>(static_cast<uint8_t>(corrupt[pos]) ^ 0x5a);
    write_bytes(bad, corrupt);
    try {
      fmts::read_manifest(bad);
    } catch (const opguard::FormatError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
}

TEST_CASE("a corrupted superblock signature gives FormatError saying it is not HDF5") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  std::string bytes = write_sample_step(path);
  bytes[1] = 'X';  // "\x89HDF\r\n\x1a\n" -> "\x89XDF..."
  write_bytes(path, bytes);
  CHECK_THROWS_WITH_AS(fmts::StepReader{path}, doctest::Contains("not an HDF5 file"), opguard::FormatError);
}

TEST_CASE("a foreign HDF5 file gives FormatError as a step file and as a manifest") {
  TempDir tmp;
  const std::string path = tmp / "foreign.h5";
  write_foreign_hdf5(path);
  CHECK_THROWS_WITH_AS(fmts::StepReader{path}, doctest::Contains("not one opguard wrote"), opguard::FormatError);
  CHECK_THROWS_WITH_AS(fmts::read_manifest(path), doctest::Contains("not one opguard wrote"), opguard::FormatError);
}

TEST_CASE("a file of another format version gives FormatError naming both versions") {
  TempDir tmp;
  const std::string path = tmp / "future.h5";
  write_foreign_hdf5(path, fmts::kFormatVersion + 1, "opguard-step");
  CHECK_THROWS_WITH_AS(fmts::StepReader{path},
                       doctest::Contains(("version " + std::to_string(fmts::kFormatVersion + 1)).c_str()),
                       opguard::FormatError);
}

TEST_CASE("an opguard file of the wrong kind or with its tables missing gives FormatError") {
  TempDir tmp;
  const std::string manifest = tmp / "manifest.h5";
  fmts::write_manifest(manifest, fmts::Manifest{});
  CHECK_THROWS_WITH_AS(fmts::StepReader{manifest}, doctest::Contains("opguard-manifest"), opguard::FormatError);
  const std::string step = tmp / "step00000000.h5";
  write_sample_step(step);
  CHECK_THROWS_AS(fmts::read_manifest(step), opguard::FormatError);
  // Right version and kind, but nothing else in it.
  const std::string hollow = tmp / "hollow.h5";
  write_foreign_hdf5(hollow, fmts::kFormatVersion, "opguard-step");
  CHECK_THROWS_AS(fmts::StepReader{hollow}, opguard::FormatError);
}

TEST_CASE("a file that is not HDF5, an empty file and a missing file give FormatError") {
  TempDir tmp;
  const std::string text = tmp / "notes.h5";
  write_bytes(text, "this is not an HDF5 file\n");
  CHECK_THROWS_AS(fmts::StepReader{text}, opguard::FormatError);
  CHECK_THROWS_AS(fmts::read_manifest(text), opguard::FormatError);
  const std::string empty = tmp / "empty.h5";
  write_bytes(empty, "");
  CHECK_THROWS_AS(fmts::StepReader{empty}, opguard::FormatError);
  CHECK_THROWS_AS(fmts::StepReader{tmp / "missing.h5"}, opguard::FormatError);
  CHECK_THROWS_AS(fmts::StepReader{tmp.path().string()}, opguard::FormatError);  // a directory
}

TEST_CASE("a directory that is not a recording gives FormatError from scan_recording") {
  TempDir tmp;
  CHECK_THROWS_WITH_AS(fmts::scan_recording(tmp.path().string()), doctest::Contains("is not an opguard recording"),
                       opguard::FormatError);
  fs::create_directories(tmp / "rank0");  // a rank directory without a manifest
  write_bytes(tmp / "rank0/step00000000.h5", "junk");
  CHECK_THROWS_AS(fmts::scan_recording(tmp.path().string()), opguard::FormatError);
  CHECK_THROWS_AS(fmts::scan_recording(tmp / "missing"), opguard::FormatError);
  write_bytes(tmp / "plain_file", "x");
  CHECK_THROWS_AS(fmts::scan_recording(tmp / "plain_file"), opguard::FormatError);
}

TEST_CASE("a recording whose manifest is garbage scans, then gives FormatError when the manifest is read") {
  TempDir tmp;
  fs::create_directories(tmp / "run/rank0");
  write_bytes(tmp / "run/rank0/manifest.h5", std::string(4096, '\0'));
  fmts::RecordingLayout layout = fmts::scan_recording(tmp / "run");
  REQUIRE(layout.ranks.size() == 1);
  CHECK_THROWS_AS(fmts::read_manifest(layout.ranks[0].manifest_path), opguard::FormatError);
}
