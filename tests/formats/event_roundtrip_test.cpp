// Events through StepWriter::add_event and StepReader::events(): every field of
// every value kind comes back as written, strides and storage offsets of
// non-contiguous views included. Also the manifest and the event-id encoding.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../support/process.h"
#include "values.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"

using opguard::DType;
using opguard::testing::TempDir;
namespace fmts = opguard::formats;

namespace {

fmts::Value tensor_value(const std::string& name, DType dtype, std::vector<int64_t> sizes,
                         std::vector<int64_t> strides, int64_t storage_offset, uint64_t fingerprint) {
  fmts::Value v = opguard::testing::tensor_value(name, dtype, std::move(sizes), std::move(strides), fingerprint);
  v.tensor.storage_offset = storage_offset;
  v.tensor.storage_id = 0x1234'5678'9abc'def0ULL ^ fingerprint;
  v.tensor.version = 7;
  return v;
}

fmts::Value text_value(fmts::ValueKind kind, const std::string& name, const std::string& text) {
  fmts::Value v;
  v.kind = kind;
  v.name = name;
  v.text = text;
  return v;
}

// One event whose inputs cover every ValueKind, with non-contiguous tensors.
fmts::Event event_with_every_kind(int64_t generator_data_index) {
  fmts::Event e;
  e.stream = 0;
  e.seq = 41;
  e.id = fmts::make_event_id(e.stream, e.seq);
  e.thread = 0xfeedbeefULL;
  e.step = 3;
  e.phase = fmts::Phase::kBackward;
  e.op = "aten::as_strided";
  e.overload = "";
  e.schema = "aten::as_strided(Tensor(a) self, SymInt[] size, SymInt[] stride, SymInt? storage_offset=None) -> Tensor(a)";
  e.scope = "blocks.1.attn.proj";
  e.node = "AsStridedBackward0";
  e.t_start_ns = 1'000'000'123;
  e.t_end_ns = 1'000'004'567;
  // A transposed view, a sliced view with a storage offset, an expanded
  // (stride 0) view and a 0-d tensor.
  e.inputs.push_back(tensor_value("self", DType::kFloat32, {4, 3}, {1, 4}, 0, 0x1111));
  e.inputs.push_back(tensor_value("other", DType::kBFloat16, {2, 5}, {10, 2}, 17, 0x2222));
  e.inputs.push_back(tensor_value("expanded", DType::kInt64, {8, 3}, {0, 1}, 3, 0x3333));
  e.inputs.push_back(tensor_value("scalar", DType::kComplex128, {}, {}, 5, 0x4444));
  // A tensor list of three: two tensors and a None.
  fmts::Value list;
  list.kind = fmts::ValueKind::kTensorList;
  list.name = "tensors";
  list.list_len = 3;
  e.inputs.push_back(list);
  e.inputs.push_back(tensor_value("", DType::kFloat16, {6}, {2}, 1, 0x5555));
  e.inputs.push_back(fmts::Value{});  // kNone element
  e.inputs.push_back(tensor_value("", DType::kBool, {0, 4}, {4, 1}, 0, 0x6666));
  e.inputs.push_back(text_value(fmts::ValueKind::kInt, "dim", "-9223372036854775808"));
  e.inputs.push_back(text_value(fmts::ValueKind::kDouble, "alpha", "-0x0p+0"));
  e.inputs.push_back(text_value(fmts::ValueKind::kBool, "keepdim", "true"));
  e.inputs.push_back(text_value(fmts::ValueKind::kString, "reduce", "mean, with \"quotes\" and \xc3\xa9"));
  e.inputs.push_back(text_value(fmts::ValueKind::kIntList, "size", "[4,3]"));
  e.inputs.push_back(text_value(fmts::ValueKind::kDoubleList, "betas", "[0x1.ccccccccccccdp-1,0x1.ff7ced916872bp-1]"));
  e.inputs.push_back(text_value(fmts::ValueKind::kBoolList, "mask", "[true,false]"));
  e.inputs.push_back(text_value(fmts::ValueKind::kScalarType, "dtype", "bfloat16"));
  e.inputs.push_back(text_value(fmts::ValueKind::kDevice, "device", "cuda:1"));
  e.inputs.push_back(text_value(fmts::ValueKind::kLayout, "layout", "strided"));
  e.inputs.push_back(text_value(fmts::ValueKind::kMemoryFormat, "memory_format", "channels_last"));
  fmts::Value generator = text_value(fmts::ValueKind::kGenerator, "generator", "cpu");
  generator.tensor.dtype = DType::kUInt8;
  generator.tensor.sizes = {5056};
  generator.tensor.strides = {1};
  generator.tensor.fingerprint = 0x7777;
  generator.tensor.data_index = generator_data_index;
  generator.tensor.flags = fmts::kTensorHasData;
  e.inputs.push_back(generator);
  e.inputs.push_back(text_value(fmts::ValueKind::kComplex, "value", "(0x1p+0,-0x1.8p+1)"));
  e.inputs.push_back(text_value(fmts::ValueKind::kOther, "opaque", "<torch.ScriptObject object>"));
  e.inputs.push_back(text_value(fmts::ValueKind::kNone, "storage_offset", ""));
  // The output: an uninitialised tensor (no fingerprint) marked as mutated,
  // and one whose contents were wanted but dropped.
  fmts::Value out = tensor_value("", DType::kFloat32, {4, 3}, {1, 4}, 0, 0);
  out.tensor.flags = fmts::kTensorUninitialized;
  out.mutated = true;
  e.outputs.push_back(out);
  fmts::Value dropped = tensor_value("result", DType::kFloat64, {2}, {1}, 0, 0x8888);
  dropped.tensor.flags = fmts::kTensorDropped | fmts::kTensorNotFingerprinted;
  dropped.tensor.device = "meta";
  e.outputs.push_back(dropped);
  return e;
}

void check_value_equal(const fmts::Value& a, const fmts::Value& b) {
  CHECK(a.kind == b.kind);
  CHECK(a.name == b.name);
  CHECK(a.text == b.text);
  CHECK(a.mutated == b.mutated);
  CHECK(a.list_len == b.list_len);
  if (!fmts::carries_tensor(a.kind)) return;
  const fmts::TensorMeta& x = a.tensor;
  const fmts::TensorMeta& y = b.tensor;
  CHECK(x.dtype == y.dtype);
  CHECK(x.sizes == y.sizes);
  CHECK(x.strides == y.strides);
  CHECK(x.storage_offset == y.storage_offset);
  CHECK(x.device == y.device);
  CHECK(x.fingerprint == y.fingerprint);
  CHECK(x.flags == y.flags);
  CHECK(x.storage_id == y.storage_id);
  CHECK(x.version == y.version);
  CHECK(x.data_index == y.data_index);
}

void check_event_equal(const fmts::Event& a, const fmts::Event& b) {
  CHECK(a.id == b.id);
  CHECK(a.stream == b.stream);
  CHECK(a.seq == b.seq);
  CHECK(a.thread == b.thread);
  CHECK(a.step == b.step);
  CHECK(a.phase == b.phase);
  CHECK(a.op == b.op);
  CHECK(a.overload == b.overload);
  CHECK(a.schema == b.schema);
  CHECK(a.scope == b.scope);
  CHECK(a.node == b.node);
  CHECK(a.t_start_ns == b.t_start_ns);
  CHECK(a.t_end_ns == b.t_end_ns);
  CHECK(a.flags == b.flags);
  REQUIRE(a.inputs.size() == b.inputs.size());
  REQUIRE(a.outputs.size() == b.outputs.size());
  for (std::size_t i = 0; i < a.inputs.size(); ++i) {
    CAPTURE(i);
    check_value_equal(a.inputs[i], b.inputs[i]);
  }
  for (std::size_t i = 0; i < a.outputs.size(); ++i) {
    CAPTURE(i);
    check_value_equal(a.outputs[i], b.outputs[i]);
  }
}

}  // namespace

TEST_CASE("an event with every value kind and non-contiguous tensors reads back field for field") {
  TempDir tmp;
  const std::string path = tmp / "step00000003.h5";
  std::vector<uint8_t> state(5056);
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = static_cast<uint8_t>(i * 37);
  std::vector<fmts::Event> written;
  {
    fmts::StepWriter writer(path, 0, 3);
    int64_t index = writer.write_tensor(DType::kUInt8, {5056}, state.data(), state.size());
    fmts::Event e = event_with_every_kind(index);
    // Every kind is present once (the test covers the whole enum).
    std::vector<bool> seen(static_cast<std::size_t>(fmts::ValueKind::kOther) + 1, false);
    for (const auto& v : e.inputs) seen[static_cast<std::size_t>(v.kind)] = true;
    for (std::size_t k = 0; k < seen.size(); ++k) {
      CAPTURE(fmts::value_kind_name(static_cast<fmts::ValueKind>(k)));
      REQUIRE(seen[k]);
    }
    written.push_back(e);
    writer.add_event(e);
    // A second event of another thread's stream sharing the schema, and one
    // with no values at all.
    fmts::Event f = e;
    f.stream = 2;
    f.seq = 57;
    f.id = fmts::make_event_id(2, 57);
    f.phase = fmts::Phase::kOptimizer;
    f.scope = "";
    f.node = "";
    written.push_back(f);
    writer.add_event(f);
    fmts::Event g;
    g.id = fmts::make_event_id(0, 42);
    g.seq = 42;
    g.op = "aten::zero_";
    g.phase = fmts::Phase::kForward;
    written.push_back(g);
    writer.add_event(g);
    writer.close();
  }
  fmts::StepReader reader(path);
  CHECK(reader.step() == 3);
  REQUIRE(reader.events().size() == written.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    CAPTURE(i);
    check_event_equal(reader.events()[i], written[i]);
  }
  fmts::TensorData data = reader.read_tensor(reader.events()[0].inputs[19].tensor);
  CHECK(data.bytes == state);
}

TEST_CASE("an event's autocast state, grad mode, default dtype and attention backends and a wrapped number "
          "round-trip; an unknown "
          "autocast or default dtype code is refused") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  fmts::Autocast both{DType::kBFloat16, DType::kFloat16}, cpu{DType::kBFloat16, std::nullopt};
  {
    fmts::StepWriter writer(path, 0, 0);
    fmts::Event e;
    e.op = "aten::linear";
    e.flags = fmts::autocast_flags(both) | fmts::kEventGradMode | fmts::default_dtype_flags(DType::kFloat64) |
              fmts::sdp_flags({true, false, false, true});
    e.inputs.push_back(tensor_value("other", DType::kFloat64, {}, {}, 0, 1));
    e.inputs.back().tensor.flags = fmts::kTensorWrappedNumber;
    writer.add_event(e);
    e.id = fmts::make_event_id(0, 1);
    e.seq = 1;
    e.flags = fmts::autocast_flags(cpu);
    writer.add_event(e);
    writer.close();
  }
  fmts::StepReader reader(path);
  REQUIRE(reader.events().size() == 2);
  CHECK(fmts::autocast_of(reader.events()[0].flags) == both);
  CHECK(fmts::autocast_text(fmts::autocast_of(reader.events()[0].flags)) == "cpu=bfloat16,cuda=float16");
  CHECK(fmts::autocast_text(fmts::autocast_of(reader.events()[1].flags)) == "cpu=bfloat16");
  CHECK(fmts::autocast_text(fmts::autocast_of(0)) == "");
  CHECK((reader.events()[0].flags & fmts::kEventGradMode));
  CHECK(fmts::default_dtype_of(reader.events()[0].flags) == std::optional<DType>(DType::kFloat64));
  CHECK_FALSE((reader.events()[1].flags & fmts::kEventGradMode));
  CHECK_FALSE(fmts::default_dtype_of(reader.events()[1].flags).has_value());  // not recorded
  CHECK(fmts::sdp_text(fmts::sdp_backends_of(reader.events()[0].flags)) == "math+cudnn");
  CHECK(fmts::sdp_text(fmts::sdp_backends_of(reader.events()[1].flags)) == "all");  // torch's default
  // Every set of backends has one spelling, which parses back to it.
  for (uint32_t off = 0; off < 16; ++off) {
    const auto b = fmts::sdp_backends_of(off << 4);
    CHECK(fmts::sdp_flags(b) == off << 4);
    CHECK(fmts::parse_sdp(fmts::sdp_text(b)) == std::optional<fmts::SdpBackends>(b));
  }
  CHECK(fmts::sdp_text(fmts::sdp_backends_of(0xF0)) == "none");
  CHECK(fmts::parse_sdp("cudnn+math") == fmts::parse_sdp("math+cudnn"));
  for (const char* bad_text : {"", "+", "math+", "+math", "math++flash", "math+math", "all+math", "MATH"})
    CHECK_FALSE(fmts::parse_sdp(bad_text).has_value());
  CHECK(reader.events()[0].inputs[0].tensor.flags == fmts::kTensorWrappedNumber);
  CHECK(reader.events()[0].inputs[0].tensor.has_fingerprint());

  const std::string bad = tmp / "step00000001.h5";
  {
    fmts::StepWriter writer(bad, 0, 1);
    fmts::Event e;
    e.op = "aten::linear";
    e.flags = 1u | (200u << 8);  // autocast on, dtype code 200
    writer.add_event(e);
    writer.close();
  }
  CHECK_THROWS_AS(fmts::StepReader{bad}, opguard::FormatError);
  CHECK_THROWS_AS(fmts::autocast_of(1u | (200u << 8)), opguard::FormatError);
  CHECK_THROWS_AS(fmts::default_dtype_of(fmts::kEventDefaultDtype | (200u << 24)), opguard::FormatError);
}

TEST_CASE("an event's in-process knobs round-trip in the optional /events/knobs column; a file without it reads as "
          "not recorded; an unknown value is refused") {
  TempDir tmp;
  fmts::EventKnobs k;
  k.threads = 3;
  k.mkldnn = false;
  k.deterministic = true;
  k.flush_denormal = true;
  k.matmul_precision = "medium";
  const uint32_t bits = fmts::knob_bits(k);
  const auto back = fmts::knobs_of(bits);
  CHECK(back.threads == 3);
  CHECK_FALSE(back.mkldnn);
  CHECK(back.deterministic);
  CHECK(back.flush_denormal);
  CHECK(back.matmul_precision == "medium");
  CHECK(fmts::knobs_of(fmts::knob_bits(1000, true, false, false, 0)).threads == 255);
  CHECK_THROWS_AS(fmts::knobs_of(1u << 8), opguard::FormatError);          // no thread count
  CHECK_THROWS_AS(fmts::knobs_of(1u | (3u << 11)), opguard::FormatError);  // precision 3
  CHECK_FALSE(back.gpu.has_value());  // bit 13 clear: as every file recorded before the CUDA knobs
  // The CUDA knobs (bits 13-19): every one of them round-trips, alone.
  for (int flip = 0; flip < 6; ++flip) {
    fmts::GpuKnobs g;
    bool* fields[] = {&g.tf32_cublas, &g.tf32_cudnn, &g.cudnn_benchmark, &g.cudnn_deterministic, &g.fp16_reduction,
                      &g.bf16_reduction};
    *fields[flip] = !*fields[flip];
    k.gpu = g;
    const auto again = fmts::knobs_of(fmts::knob_bits(k));
    INFO("flipped field " << flip);
    REQUIRE(again.gpu.has_value());
    CHECK(*again.gpu == g);
    CHECK(*again.gpu != fmts::GpuKnobs{});
    CHECK(again.matmul_precision == "medium");
    CHECK(again.threads == 3);
  }
  // torch's defaults: TF32 in cuDNN only, reduced-precision reductions allowed.
  const auto defaults = fmts::knobs_of(fmts::knob_bits(1, true, false, false, 0) | fmts::gpu_knob_bits({}));
  CHECK(defaults.gpu == std::optional<fmts::GpuKnobs>(fmts::GpuKnobs{}));
  CHECK_FALSE(defaults.gpu->tf32_cublas);
  CHECK(defaults.gpu->tf32_cudnn);
  CHECK(fmts::reduction_text(true, true) == "on");
  CHECK(fmts::reduction_text(false, false) == "off");
  CHECK(fmts::reduction_text(true, false) == "fp16");
  CHECK(fmts::reduction_text(false, true) == "bf16");
  // As replay's knobs name them (the manifest's keys too): torch's defaults.
  using Values = std::vector<std::pair<std::string, std::string>>;
  CHECK(fmts::gpu_knob_values({}) == Values{{"tf32_cublas", "off"}, {"tf32_cudnn", "on"}, {"cudnn_benchmark", "off"},
                                            {"cudnn_deterministic", "off"}, {"reduced_precision_reduction", "on"}});
  k.gpu.reset();
  k.matmul_precision = "low";
  CHECK_THROWS_AS(fmts::knob_bits(k), opguard::FormatError);

  auto write = [&](const std::string& path, std::vector<std::optional<uint32_t>> knobs) {
    fmts::StepWriter writer(path, 0, 0);
    for (std::size_t i = 0; i < knobs.size(); ++i) {
      fmts::Event e;
      e.op = "aten::sum";
      e.id = fmts::make_event_id(0, i);
      e.seq = i;
      e.knobs = knobs[i];
      writer.add_event(e);
    }
    writer.close();
  };
  const std::string with = tmp / "step00000000.h5";
  write(with, {bits, std::nullopt});
  fmts::StepReader reader(with);
  REQUIRE(reader.events().size() == 2);
  CHECK(reader.events()[0].knobs == std::optional<uint32_t>(bits));
  CHECK_FALSE(reader.events()[1].knobs.has_value());
  CHECK(reader.columns().events.knobs.size() == 2);
  const std::string without = tmp / "step00000001.h5";
  write(without, {std::nullopt, std::nullopt});
  fmts::StepReader old(without);
  CHECK(old.columns().events.knobs.empty());  // no column, as in files recorded before it
  CHECK_FALSE(old.events()[0].knobs.has_value());
  const std::string bad = tmp / "step00000002.h5";
  write(bad, {1u << 8});
  CHECK_THROWS_AS(fmts::StepReader{bad}, opguard::FormatError);
}

TEST_CASE("a step file with no events and no data is valid") {
  TempDir tmp;
  const std::string path = tmp / "step00000000.h5";
  {
    fmts::StepWriter writer(path, 2, 0);
    writer.close();
  }
  fmts::StepReader reader(path);
  CHECK(reader.rank() == 2);
  CHECK(reader.events().empty());
  CHECK(reader.data_count() == 0);
}

TEST_CASE("the writer refuses an event its reader would reject, as an internal error") {
  TempDir tmp;
  fmts::StepWriter writer(tmp / "step00000000.h5", 0, 0);
  fmts::Event e;
  e.op = "aten::add";
  e.inputs.push_back(tensor_value("self", DType::kFloat32, {2}, {1}, 0, 1));
  e.inputs.back().tensor.data_index = 0;  // no /data/0 written
  CHECK_THROWS_AS(writer.add_event(e), opguard::InternalError);
  e.inputs.back().tensor.data_index = -1;
  e.inputs.back().tensor.strides = {};  // sizes and strides disagree
  CHECK_THROWS_AS(writer.add_event(e), opguard::InternalError);
  fmts::Event list_event;
  fmts::Value list;
  list.kind = fmts::ValueKind::kTensorList;
  list.list_len = 2;  // only one element follows
  list_event.inputs = {list, fmts::Value{}};
  CHECK_THROWS_AS(writer.add_event(list_event), opguard::InternalError);
}

TEST_CASE("a step writer that is not closed leaves a torn .tmp file and no step file") {
  TempDir tmp;
  const std::string path = tmp / "step00000005.h5";
  {
    fmts::StepWriter writer(path, 0, 5);
    std::vector<float> x = {1.0f, 2.0f};
    writer.write_tensor(DType::kFloat32, {2}, x.data(), 8);
  }
  CHECK(std::filesystem::exists(path + ".tmp"));
  CHECK_FALSE(std::filesystem::exists(path));
}

TEST_CASE("a manifest round-trips its rank, world size, info and environment") {
  TempDir tmp;
  const std::string path = tmp / "manifest.h5";
  fmts::Manifest m;
  m.rank = 1;
  m.world_size = 4;
  m.info["program"] = "tiny_gpt";
  m.info["argv"] = "tiny_gpt --steps 3";
  m.info["clean_exit"] = "1";
  m.info["sampling_policy"] = "steps=2:3;ops=softmax";
  m.info["empty"] = "";
  m.info["multi_line"] = "line one\nline two\n\xc3\xa9";
  m.env["OMP_NUM_THREADS"] = "2";
  m.env["ATEN_CPU_CAPABILITY"] = "avx2";
  fmts::write_manifest(path, m);
  CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  fmts::Manifest r = fmts::read_manifest(path);
  CHECK(r.format_version == fmts::kFormatVersion);
  CHECK(r.rank == 1);
  CHECK(r.world_size == 4);
  CHECK(r.info == m.info);
  CHECK(r.env == m.env);
}

TEST_CASE("a manifest rewritten at a clean end replaces the one written at start") {
  TempDir tmp;
  const std::string path = tmp / "manifest.h5";
  fmts::Manifest m;
  m.info["clean_exit"] = "0";
  fmts::write_manifest(path, m);
  m.info["clean_exit"] = "1";
  m.info["end_time"] = "2026-12-03T09:00:00Z";
  fmts::write_manifest(path, m);
  fmts::Manifest r = fmts::read_manifest(path);
  CHECK(r.info.at("clean_exit") == "1");
  CHECK(r.info.at("end_time") == "2026-12-03T09:00:00Z");
}

TEST_CASE("event ids put the stream in the top 16 bits and print main-thread ids as plain numbers") {
  CHECK(fmts::make_event_id(0, 1234) == 1234);
  CHECK(fmts::make_event_id(2, 57) == ((uint64_t{2} << 48) | 57));
  CHECK(fmts::event_id_string(1234) == "1234");
  CHECK(fmts::event_id_string(fmts::make_event_id(2, 57)) == "2.57");
  CHECK(fmts::parse_event_id("1234") == fmts::make_event_id(0, 1234));
  CHECK(fmts::parse_event_id("2.57") == fmts::make_event_id(2, 57));
  CHECK(fmts::parse_event_id("65535.281474976710655") == ~uint64_t{0});
  CHECK_FALSE(fmts::parse_event_id("65536.1").has_value());
  CHECK_FALSE(fmts::parse_event_id("281474976710656").has_value());
  CHECK_FALSE(fmts::parse_event_id("-1").has_value());
  CHECK_FALSE(fmts::parse_event_id("").has_value());
  CHECK_FALSE(fmts::parse_event_id("1.").has_value());
  CHECK_FALSE(fmts::parse_event_id(" 12").has_value());
}

TEST_CASE("scan_recording lists ranks, complete steps in order and torn steps") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  for (int rank : {1, 0}) {
    std::filesystem::create_directories(fmts::rank_dir(dir, rank));
    fmts::Manifest m;
    m.rank = rank;
    m.world_size = 2;
    fmts::write_manifest(fmts::rank_dir(dir, rank) + "/manifest.h5", m);
  }
  for (int64_t step : {10, 2}) {
    fmts::StepWriter w(fmts::rank_dir(dir, 0) + "/" + fmts::step_file_name(step), 0, step);
    w.close();
  }
  { fmts::StepWriter torn(fmts::rank_dir(dir, 0) + "/" + fmts::step_file_name(11), 0, 11); }
  CHECK(fmts::step_file_name(12) == "step00000012.h5");
  fmts::RecordingLayout layout = fmts::scan_recording(dir);
  REQUIRE(layout.ranks.size() == 2);
  CHECK(layout.ranks[0].rank == 0);
  CHECK(layout.ranks[1].rank == 1);
  REQUIRE(layout.ranks[0].steps.size() == 2);
  CHECK(layout.ranks[0].steps[0].first == 2);
  CHECK(layout.ranks[0].steps[1].first == 10);
  REQUIRE(layout.ranks[0].torn.size() == 1);
  CHECK(layout.ranks[0].torn[0].first == 11);
  CHECK(layout.ranks[1].steps.empty());
}
