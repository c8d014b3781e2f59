#pragma once
// Crafted recordings for the diff tests: events written with the real
// StepWriter, so that the diff reads them exactly as it reads a recorder's
// output, but with fingerprints, storages and versions chosen by the test so
// that the right classification is known.

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "opguard/formats/recording.h"

namespace opguard::testing {

using formats::Event;
using formats::Phase;
using formats::Value;
using formats::ValueKind;

// A tensor value: storage id, version and fingerprint; float32 [4] unless said.
struct T {
  uint64_t storage = 0;
  uint32_t version = 0;
  uint64_t fp = 0;
  std::vector<int64_t> sizes = {4};
  DType dtype = DType::kFloat32;
  int64_t offset = 0;
  std::vector<int64_t> strides = {};  // row-major if empty
  uint8_t flags = 0;
  const void* data = nullptr;  // full contents to store (numel * dtype_size bytes)
};

inline Value tensor(const std::string& name, const T& t, bool mutated = false) {
  Value v;
  v.kind = ValueKind::kTensor;
  v.name = name;
  v.mutated = mutated;
  auto& m = v.tensor;
  m.dtype = t.dtype;
  m.sizes = t.sizes;
  m.strides = t.strides;
  if (m.strides.empty()) {
    m.strides.assign(m.sizes.size(), 1);
    for (int i = static_cast<int>(m.sizes.size()) - 2; i >= 0; --i) m.strides[i] = m.strides[i + 1] * m.sizes[i + 1];
  }
  m.storage_offset = t.offset;
  m.storage_id = t.storage;
  m.version = t.version;
  m.fingerprint = t.fp;
  m.flags = t.flags;
  return v;
}

inline Value arg(const std::string& name, ValueKind kind, const std::string& text) {
  Value v;
  v.kind = kind;
  v.name = name;
  v.text = text;
  return v;
}

inline Value generator(uint64_t state_fp) {
  Value v = tensor("<default_generator>", T{0, 0, state_fp, {16}, DType::kUInt8});
  v.kind = ValueKind::kGenerator;
  return v;
}

struct Op {
  std::string name{};
  std::vector<Value> inputs{};
  std::vector<Value> outputs{};
  std::string scope{};
  Phase phase = Phase::kForward;
  std::string overload{};
  std::string node{};  // autograd node of a backward op
  std::optional<uint32_t> knobs{};  // Event::knobs
};

// One run of one rank: events appended step by step, written by write().
class Run {
 public:
  explicit Run(int rank = 0, int world_size = 1) : rank_(rank), world_size_(world_size) {}

  // Appends an event to `step` on stream 0 and returns its id.
  uint64_t add(int64_t step, const Op& op, uint32_t stream = 0) {
    const int64_t start = clock_ += 1000;
    const int64_t end = clock_ += 500;
    return add_at(step, op, start, end, stream);
  }
  // The same with the event's recorded start and end times given (ns): for
  // cases where the order across ranks matters.
  uint64_t add_at(int64_t step, const Op& op, int64_t start_ns, int64_t end_ns, uint32_t stream = 0) {
    Event e;
    e.stream = stream;
    e.seq = seq_[stream]++;
    e.id = formats::make_event_id(stream, e.seq);
    e.step = step;
    e.phase = op.phase;
    e.op = op.name;
    e.overload = op.overload;
    e.schema = op.name + "(...)";
    e.scope = op.scope;
    e.node = op.node;
    e.t_start_ns = start_ns;
    e.t_end_ns = end_ns;
    e.inputs = op.inputs;
    e.outputs = op.outputs;
    e.knobs = op.knobs;
    steps_[step].push_back(e);
    return e.id;
  }
  // Full contents for value `position` of the last event of `step`.
  void attach(int64_t step, bool output, std::size_t position, const void* bytes, std::size_t nbytes) {
    data_[step].push_back({steps_[step].size() - 1, output, position, std::vector<uint8_t>(
        static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + nbytes)});
  }
  void set_info(const std::string& key, const std::string& value) { info_[key] = value; }
  void set_env(const std::string& key, const std::string& value) { env_[key] = value; }

  void write(const std::string& dir) const {
    const std::string rdir = formats::rank_dir(dir, rank_);
    std::filesystem::create_directories(rdir);
    formats::Manifest m;
    m.rank = rank_;
    m.world_size = world_size_;
    m.info = info_;
    m.env = env_;
    formats::write_manifest(rdir + "/manifest.h5", m);
    for (const auto& [step, events] : steps_) {
      formats::StepWriter w(rdir + "/" + formats::step_file_name(step), rank_, step);
      std::vector<Event> out = events;
      auto d = data_.find(step);
      if (d != data_.end()) {
        for (const auto& a : d->second) {
          Value& v = a.output ? out[a.event].outputs[a.position] : out[a.event].inputs[a.position];
          v.tensor.data_index = w.write_tensor(v.tensor.dtype, v.tensor.sizes, a.bytes.data(), a.bytes.size());
          v.tensor.flags |= formats::kTensorHasData;
        }
      }
      for (auto& e : out) w.add_event(e);
      w.close();
    }
  }

 private:
  struct Data {
    std::size_t event;
    bool output;
    std::size_t position;
    std::vector<uint8_t> bytes;
  };
  int rank_, world_size_;
  int64_t clock_ = 1'000'000;
  std::map<uint32_t, uint64_t> seq_;
  std::map<int64_t, std::vector<Event>> steps_;
  std::map<int64_t, std::vector<Data>> data_;
  std::map<std::string, std::string> info_{{"program", "crafted"}, {"record_command", "./train --steps 5"},
                                           {"cwd", "/work"}};
  std::map<std::string, std::string> env_;
};

}  // namespace opguard::testing
