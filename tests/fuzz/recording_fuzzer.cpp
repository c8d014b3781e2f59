// libFuzzer target over the recording and bundle readers (formats/). The input
// is one file, read as a step file (every event and value, every /data tensor,
// through both read_tensor overloads, then fingerprinted), as a manifest and,
// where formats has it, as a repro bundle's tensor file (tensor_file.h). A
// crash, a sanitizer report, or any exception but FormatError is a finding.
//
//   opguard_fuzz_recording -max_total_time=60 CORPUS SEEDS   (tests/fuzz/run_fuzzer.cmake)

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "opguard/kernels/fingerprint.h"
#ifdef OPGUARD_FUZZ_TENSOR_FILE
#include "opguard/formats/tensor_file.h"
#endif

namespace fmts = opguard::formats;

namespace {

// The readers take paths (HDF5 opens the file itself), so every input goes
// through one scratch file of this process.
const std::string& scratch_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    std::atexit([] { ::unlink(scratch_path().c_str()); });
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/opguard-fuzz-" +
           std::to_string(::getpid()) + ".h5";
  }();
  return path;
}

void write_scratch(const uint8_t* data, std::size_t size) {
  FILE* f = std::fopen(scratch_path().c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror("opguard_fuzz_recording: cannot write its scratch file");
    std::abort();
  }
}

uint64_t fingerprint(const fmts::TensorData& t) {
  opguard::kernels::TensorView view;
  view.dtype = t.dtype;
  view.sizes = t.sizes.data();
  view.ndim = static_cast<int>(t.sizes.size());
  view.data = t.bytes.data();
  return opguard::kernels::fingerprint(view);
}

void read_step_file(const std::string& path) {
  fmts::StepReader reader(path);
  uint64_t sink = static_cast<uint64_t>(reader.rank()) ^ static_cast<uint64_t>(reader.step());
  // The columns as the diff reads them: every index the reader validated,
  // followed without further checks (ASan reports any it should have refused).
  const fmts::StepColumns& c = reader.columns();
  for (std::size_t i = 0; i < c.events.size(); ++i) {
    sink ^= c.string(c.events.op[i]).size() ^ c.string(c.events.scope[i]).size();
    const std::size_t begin = c.events.value_begin[i];
    for (std::size_t r = begin; r < begin + c.events.n_inputs[i] + c.events.n_outputs[i]; ++r) {
      sink ^= c.string(c.values.name[r]).size() ^ c.string(c.values.text[r]).size();
      if (!fmts::carries_tensor(static_cast<fmts::ValueKind>(c.values.kind[r]))) continue;
      sink ^= c.string(c.values.device[r]).size();
      const std::size_t dims = c.values.dims_offset[r];
      for (std::size_t d = 0; d < 2u * c.values.ndim[r]; ++d) sink ^= static_cast<uint64_t>(c.dims[dims + d]);
    }
  }
  for (const fmts::Event& e : reader.events()) {
    sink ^= e.id ^ e.schema.size() ^ fmts::event_id_string(e.id).size();
    for (const auto* side : {&e.inputs, &e.outputs}) {
      for (const fmts::Value& v : *side) {
        sink ^= v.text.size() ^ std::string(fmts::value_kind_name(v.kind)).size();
        if (!fmts::carries_tensor(v.kind)) continue;
        sink ^= static_cast<uint64_t>(v.tensor.numel());
        if (v.tensor.data_index < 0) continue;
        try {
          sink ^= fingerprint(reader.read_tensor(v.tensor));
        } catch (const opguard::FormatError&) {
        }
      }
    }
  }
  for (std::size_t i = 0; i < reader.data_count(); ++i) {
    try {
      sink ^= fingerprint(reader.read_tensor(static_cast<int64_t>(i)));
    } catch (const opguard::FormatError&) {
    }
  }
  // Keeps the reads from being optimised away.
  if (sink == 0x5eed) std::fputc('\n', stderr);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  write_scratch(data, size);
  const std::string& path = scratch_path();
  try {
    read_step_file(path);
  } catch (const opguard::FormatError&) {
  }
  try {
    fmts::Manifest m = fmts::read_manifest(path);
    if (m.info.size() == 0x5eed) std::fputc('\n', stderr);
  } catch (const opguard::FormatError&) {
  }
#ifdef OPGUARD_FUZZ_TENSOR_FILE
  try {
    // A bound far below the default: the fuzzer's memory limit is 2 GiB.
    for (const fmts::StoredTensor& t : fmts::read_tensor_file(path, uint64_t{1} << 26)) {
      if (t.bytes.size() == 0x5eed) std::fputc('\n', stderr);
    }
  } catch (const opguard::FormatError&) {
  }
#endif
  return 0;
}
