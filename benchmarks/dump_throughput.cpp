// Full-dump write throughput of the recording format against plain HDF5, in
// one run: the same tensors (dtype and shape of every full tensor of a
// recording, or a synthetic set) written
//   a) through formats::StepWriter, as the recorder's writer thread does
//      (one step file per step: /data/<n> with its dtype attribute, then the
//      event tables on close, then the rename), and
//   b) as plain contiguous HDF5 datasets, one file per step, H5Dcreate2 +
//      H5Dwrite and nothing else.
// Repeats alternate a and b, each after a sync(); the figure is the median.
// Neither fsyncs: this is the rate at which the page cache takes the bytes,
// which is what a training run waits for while its recording fits in memory.
// Prints MiB/s of both and their ratio (target >= 0.8).
//
//   opguard_dump_throughput --recording DIR [--repeats 5] [--out SCRATCH]
//   opguard_dump_throughput --synthetic 256x1MiB [--repeats 5]

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "median.h"

namespace fmts = opguard::formats;
namespace fs = std::filesystem;
using opguard::DType;

namespace {

struct Tensor {
  DType dtype;
  std::vector<int64_t> sizes;
  std::size_t nbytes;
};

struct Step {
  int64_t step = 0;
  std::vector<Tensor> tensors;
  std::vector<fmts::Event> events;  // with data_index into `tensors`
};

std::vector<Step> from_recording(const std::string& dir) {
  std::vector<Step> steps;
  for (const auto& rank : fmts::scan_recording(dir).ranks) {
    for (const auto& [number, path] : rank.steps) {
      fmts::StepReader reader(path);
      Step s;
      s.step = number;
      // /data/<n> in order, so that the events' data_index stay valid; the
      // value rows that point at them give dtype and shape.
      s.tensors.resize(reader.data_count(), Tensor{DType::kUInt8, {0}, 0});
      s.events = reader.events();
      for (const fmts::Event& e : s.events) {
        for (const auto* side : {&e.inputs, &e.outputs}) {
          for (const fmts::Value& v : *side) {
            if (!fmts::carries_tensor(v.kind) || v.tensor.data_index < 0) continue;
            const std::size_t nbytes = static_cast<std::size_t>(v.tensor.numel()) * opguard::dtype_size(v.tensor.dtype);
            s.tensors[static_cast<std::size_t>(v.tensor.data_index)] = {v.tensor.dtype, v.tensor.sizes, nbytes};
          }
        }
      }
      steps.push_back(std::move(s));
    }
  }
  return steps;
}

// "COUNTxSIZE": COUNT float32 tensors of SIZE bytes (suffix KiB/MiB) in one step.
std::vector<Step> synthetic(const std::string& spec) {
  auto x = spec.find('x');
  if (x == std::string::npos) throw opguard::UsageError("--synthetic takes COUNTxSIZE, e.g. 256x1MiB");
  const long count = std::strtol(spec.substr(0, x).c_str(), nullptr, 10);
  std::string size_text = spec.substr(x + 1);
  std::size_t scale = 1;
  if (size_text.size() > 3 && size_text.compare(size_text.size() - 3, 3, "MiB") == 0) scale = 1 << 20;
  if (size_text.size() > 3 && size_text.compare(size_text.size() - 3, 3, "KiB") == 0) scale = 1 << 10;
  const std::size_t bytes = std::strtoul(size_text.c_str(), nullptr, 10) * scale / 4 * 4;
  if (count <= 0 || bytes == 0) throw opguard::UsageError("--synthetic takes COUNTxSIZE, e.g. 256x1MiB");
  Step s;
  for (long i = 0; i < count; ++i) {
    s.tensors.push_back({DType::kFloat32, {static_cast<int64_t>(bytes / 4)}, bytes});
    fmts::Event e;
    e.id = e.seq = static_cast<uint64_t>(i);
    e.op = "aten::mul";
    e.overload = "Tensor";
    fmts::Value v;
    v.kind = fmts::ValueKind::kTensor;
    v.tensor.sizes = s.tensors.back().sizes;
    v.tensor.strides = {1};
    v.tensor.data_index = i;
    v.tensor.flags = fmts::kTensorHasData;
    e.outputs.push_back(v);
    s.events.push_back(e);
  }
  return {s};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double write_with_step_writer(const std::vector<Step>& steps, const std::vector<uint8_t>& source,
                              const std::string& dir) {
  auto t0 = std::chrono::steady_clock::now();
  for (const Step& s : steps) {
    fmts::StepWriter writer(dir + "/" + fmts::step_file_name(s.step), 0, s.step, /*full_tensors=*/true);
    for (const Tensor& t : s.tensors) writer.write_tensor(t.dtype, t.sizes, source.data(), t.nbytes);
    for (const fmts::Event& e : s.events) writer.add_event(e);
    writer.close();
  }
  return seconds_since(t0);
}

// The baseline: what a hand-written HDF5 dump does. Predefined types only
// (bf16/fp16 as 2-byte integers: the bytes are the same).
hid_t plain_type(DType d) {
  switch (opguard::dtype_size(d)) {
    case 1: return H5T_STD_U8LE;
    case 2: return H5T_STD_U16LE;
    case 4: return d == DType::kFloat32 ? H5T_IEEE_F32LE : H5T_STD_U32LE;
    case 8: return d == DType::kFloat64 ? H5T_IEEE_F64LE : H5T_STD_U64LE;
    default: return H5T_STD_U8LE;  // complex128: 16-byte elements written as bytes (the shape gets x16)
  }
}

void check(bool ok, const char* call) {
  if (!ok) throw opguard::IoError(std::string(call) + " failed in the plain HDF5 baseline");
}

double write_plain_hdf5(const std::vector<Step>& steps, const std::vector<uint8_t>& source, const std::string& dir) {
  auto t0 = std::chrono::steady_clock::now();
  for (const Step& s : steps) {
    const std::string path = dir + "/plain" + std::to_string(s.step) + ".h5";
    hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    check(file >= 0, "H5Fcreate");
    for (std::size_t i = 0; i < s.tensors.size(); ++i) {
      const Tensor& t = s.tensors[i];
      hid_t type = plain_type(t.dtype);
      std::vector<hsize_t> dims(t.sizes.begin(), t.sizes.end());
      if (opguard::dtype_size(t.dtype) == 16) dims.push_back(16);
      hid_t space = dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
      check(space >= 0, "H5Screate");
      const std::string name = std::to_string(i);
      hid_t ds = H5Dcreate2(file, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      check(ds >= 0, "H5Dcreate2");
      if (t.nbytes > 0) check(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, source.data()) >= 0, "H5Dwrite");
      H5Dclose(ds);
      H5Sclose(space);
    }
    check(H5Fclose(file) >= 0, "H5Fclose");
  }
  return seconds_since(t0);
}

using opguard::bench::median;

}  // namespace

int main(int argc, char** argv) {
  std::string recording, spec, scratch_parent = fs::temp_directory_path().string();
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--recording") recording = next();
    else if (a == "--synthetic") spec = next();
    else if (a == "--repeats") repeats = std::atoi(next().c_str());
    else if (a == "--out") scratch_parent = next();
    else {
      std::fprintf(stderr, "usage: %s (--recording DIR | --synthetic COUNTxSIZE) [--repeats N] [--out DIR]\n", argv[0]);
      return 2;
    }
  }
  try {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    std::vector<Step> steps = !recording.empty() ? from_recording(recording) : synthetic(spec.empty() ? "256x1MiB" : spec);
    std::size_t total = 0, largest = 0, count = 0;
    for (const Step& s : steps) {
      for (const Tensor& t : s.tensors) {
        total += t.nbytes;
        largest = std::max(largest, t.nbytes);
        ++count;
      }
    }
    if (total == 0) throw opguard::UsageError("the recording has no full tensors: record it with --dump-all");
    // One source buffer of varied bytes, as large as the largest tensor.
    std::vector<uint8_t> source(largest);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 2654435761u >> 13);

    std::string pattern = scratch_parent + "/opguard_dump_bench_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw opguard::IoError("cannot create a directory in " + scratch_parent);
    const std::string dir = pattern;
    std::vector<double> ours, plain;
    for (int r = 0; r < std::max(1, repeats); ++r) {
      // Alternate which goes first, and start each with no dirty pages, so
      // that neither pays for the other's writeback.
      for (int k = 0; k < 2; ++k) {
        ::sync();
        if ((r + k) % 2 == 0) ours.push_back(write_with_step_writer(steps, source, dir));
        else plain.push_back(write_plain_hdf5(steps, source, dir));
      }
      for (const auto& entry : fs::directory_iterator(dir)) fs::remove(entry.path());
    }
    fs::remove_all(dir);
    const double mib = static_cast<double>(total) / (1 << 20);
    const double ours_rate = mib / median(ours);
    const double plain_rate = mib / median(plain);
    std::printf("tensors: %zu in %zu step file(s), %.1f MiB (largest %.2f MiB), median of %d, scratch %s\n", count,
                steps.size(), mib, static_cast<double>(largest) / (1 << 20), std::max(1, repeats),
                scratch_parent.c_str());
    std::printf("%-34s %10s %10s\n", "writer", "MiB/s", "ratio");
    std::printf("%-34s %10.1f %10.3f\n", "plain HDF5 contiguous (baseline)", plain_rate, 1.0);
    std::printf("%-34s %10.1f %10.3f\n", "formats::StepWriter", ours_rate, ours_rate / plain_rate);
    return 0;
  } catch (const opguard::Error& e) {
    std::fprintf(stderr, "opguard_dump_throughput: %s\n", e.what());
    return 1;
  }
}
