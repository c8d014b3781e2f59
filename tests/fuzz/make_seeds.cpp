// Writes the fuzzer's seed corpus with the real writers (StepWriter,
// write_manifest): small step files whose events hold every value kind, views,
// tensor lists and full tensors of several dtypes and shapes, an empty step file
// a manifest and a bundle tensor file. Usage: opguard_fuzz_seeds DIR

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#ifdef OPGUARD_FUZZ_TENSOR_FILE
#include "opguard/formats/tensor_file.h"
#endif

namespace fmts = opguard::formats;
using opguard::DType;

namespace {

fmts::Value text(fmts::ValueKind kind, const char* name, const char* value) {
  fmts::Value v;
  v.kind = kind;
  v.name = name;
  v.text = value;
  return v;
}

fmts::Value tensor(const char* name, DType dtype, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                   int64_t data_index) {
  fmts::Value v;
  v.kind = fmts::ValueKind::kTensor;
  v.name = name;
  v.tensor.dtype = dtype;
  v.tensor.sizes = std::move(sizes);
  v.tensor.strides = std::move(strides);
  v.tensor.fingerprint = 0x0123456789abcdefULL + static_cast<uint64_t>(data_index);
  v.tensor.storage_id = 0x42 + static_cast<uint64_t>(data_index);
  v.tensor.version = 3;
  v.tensor.data_index = data_index;
  if (data_index >= 0) v.tensor.flags = fmts::kTensorHasData;
  return v;
}

template <typename T>
int64_t write_data(fmts::StepWriter& w, DType dtype, const std::vector<int64_t>& sizes, const std::vector<T>& values) {
  return w.write_tensor(dtype, sizes, values.data(), values.size() * sizeof(T));
}

void write_step(const std::string& path, int64_t step, int events) {
  fmts::StepWriter w(path, 0, step);
  const int64_t f32 = write_data<float>(w, DType::kFloat32, {2, 3}, {1.5f, -0.0f, 3.25f, 1e-40f, 7.0f, -2.0f});
  const int64_t i64 = write_data<int64_t>(w, DType::kInt64, {4}, {1, -2, 3, INT64_MIN});
  const int64_t bf16 = write_data<uint16_t>(w, DType::kBFloat16, {}, {0x3f80});
  const int64_t empty = write_data<uint8_t>(w, DType::kBool, {0, 5}, {});
  for (int i = 0; i < events; ++i) {
    fmts::Event e;
    e.stream = i % 2 == 0 ? 0 : 1;
    e.seq = static_cast<uint64_t>(i);
    e.id = fmts::make_event_id(e.stream, e.seq);
    e.thread = 1000 + static_cast<uint64_t>(e.stream);
    e.step = step;
    e.phase = static_cast<fmts::Phase>(i % 4);
    e.op = i % 3 == 0 ? "aten::addmm" : "aten::cat";
    e.overload = i % 3 == 0 ? "" : "out";
    e.schema = e.op + "(Tensor self, Tensor other) -> Tensor";
    e.scope = "blocks." + std::to_string(i) + ".attn";
    e.node = e.phase == fmts::Phase::kBackward ? "AddmmBackward0" : "";
    e.t_start_ns = 100 * i;
    e.t_end_ns = 100 * i + 50;
    e.inputs.push_back(tensor("self", DType::kFloat32, {2, 3}, {1, 2}, i == 0 ? f32 : -1));
    e.inputs.push_back(tensor("other", DType::kInt64, {4}, {1}, i64));
    fmts::Value list;
    list.kind = fmts::ValueKind::kTensorList;
    list.name = "tensors";
    list.list_len = 2;
    e.inputs.push_back(list);
    e.inputs.push_back(tensor("", DType::kBool, {0, 5}, {5, 1}, empty));
    e.inputs.push_back(fmts::Value{});
    e.inputs.push_back(text(fmts::ValueKind::kInt, "dim", "-1"));
    e.inputs.push_back(text(fmts::ValueKind::kDouble, "alpha", "0x1.8p+1"));
    e.inputs.push_back(text(fmts::ValueKind::kBool, "keepdim", "false"));
    e.inputs.push_back(text(fmts::ValueKind::kString, "reduce", "sum"));
    e.inputs.push_back(text(fmts::ValueKind::kIntList, "size", "[2,3]"));
    e.inputs.push_back(text(fmts::ValueKind::kDoubleList, "betas", "[0x1p-1,0x1p+0]"));
    e.inputs.push_back(text(fmts::ValueKind::kBoolList, "mask", "[true]"));
    e.inputs.push_back(text(fmts::ValueKind::kScalarType, "dtype", "float16"));
    e.inputs.push_back(text(fmts::ValueKind::kDevice, "device", "cpu"));
    e.inputs.push_back(text(fmts::ValueKind::kLayout, "layout", "strided"));
    e.inputs.push_back(text(fmts::ValueKind::kMemoryFormat, "memory_format", "contiguous_format"));
    e.inputs.push_back(text(fmts::ValueKind::kComplex, "c", "(0x1p+0,-0x1p+0)"));
    e.inputs.push_back(text(fmts::ValueKind::kOther, "o", "<object>"));
    fmts::Value generator = tensor("generator", DType::kUInt8, {}, {}, -1);
    generator.kind = fmts::ValueKind::kGenerator;
    generator.text = "cpu";
    e.inputs.push_back(generator);
    fmts::Value out = tensor("", DType::kBFloat16, {}, {}, bf16);
    out.mutated = true;
    e.outputs.push_back(out);
    w.add_event(std::move(e));
  }
  w.close();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: opguard_fuzz_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  try {
    std::filesystem::create_directories(dir);
    write_step((dir / "step_one_event.h5").string(), 0, 1);
    write_step((dir / "step_four_events.h5").string(), 7, 4);
    fmts::StepWriter(((dir / "step_empty.h5").string()), 1, 2).close();
    fmts::Manifest m;
    m.rank = 1;
    m.world_size = 2;
    m.info = {{"program", "train.py"}, {"argv", "[\"train.py\",\"--steps\",\"2\"]"}, {"threads", "2"}};
    m.env = {{"ATEN_CPU_CAPABILITY", "avx2"}};
    fmts::write_manifest((dir / "manifest.h5").string(), m);
#ifdef OPGUARD_FUZZ_TENSOR_FILE
    std::vector<fmts::StoredTensor> tensors(3);
    tensors[0].name = "arg0_self";
    tensors[0].sizes = {2, 2};
    tensors[0].strides = {1, 2};
    tensors[0].bytes.assign(16, 0x3f);
    tensors[1].name = "out0";
    tensors[1].dtype = DType::kBFloat16;
    tensors[1].bytes = {0x80, 0x3f};
    tensors[2].name = "empty";
    tensors[2].dtype = DType::kInt64;
    tensors[2].sizes = {0, 3};
    tensors[2].strides = {3, 1};
    std::filesystem::remove(dir / "tensors.h5");
    fmts::write_tensor_file((dir / "tensors.h5").string(), tensors);
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "opguard_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
