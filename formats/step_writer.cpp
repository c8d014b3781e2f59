// StepWriter: one step file, written to PATH.tmp and renamed to PATH on close().

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "element_types.h"
#include "files.h"
#include "h5.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "step_layout.h"

namespace opguard::formats {
namespace {

using h5::Handle;

[[noreturn]] void bad_event(const Event& e, const std::string& why) {
  throw InternalError("opguard tried to record event " + event_id_string(e.id) + " (" + e.op +
                      ") that the recording format cannot hold: " + why +
                      "; this is a bug in opguard, please report it");
}

// Checks what the reader will check, so a writer never produces a file its own
// reader rejects.
void check_values(const Event& e, const std::vector<Value>& values, int64_t data_count) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    const Value& v = values[i];
    if (static_cast<std::size_t>(v.kind) > static_cast<std::size_t>(ValueKind::kOther)) {
      bad_event(e, "value " + std::to_string(i) + " has an unknown kind");
    }
    if (carries_tensor(v.kind)) {
      const TensorMeta& t = v.tensor;
      if (static_cast<int>(t.dtype) >= kNumDTypes) bad_event(e, "a tensor has an unknown dtype");
      if (t.sizes.size() != t.strides.size()) {
        bad_event(e, "a tensor has " + std::to_string(t.sizes.size()) + " sizes but " +
                         std::to_string(t.strides.size()) + " strides");
      }
      if (t.sizes.size() > step_layout::kMaxValueRank) bad_event(e, "a tensor has more than 255 dimensions");
      if (t.data_index < -1 || t.data_index >= data_count) {
        bad_event(e, "a tensor refers to /data/" + std::to_string(t.data_index) +
                         ", which this step file does not hold");
      }
    }
    if (v.kind == ValueKind::kTensorList) {
      if (v.list_len < 0 || static_cast<std::size_t>(v.list_len) >= values.size() - i) {
        bad_event(e, "a tensor list of " + std::to_string(v.list_len) + " elements runs past the event's values");
      }
      for (std::size_t j = i + 1; j <= i + static_cast<std::size_t>(v.list_len); ++j) {
        if (values[j].kind != ValueKind::kTensor && values[j].kind != ValueKind::kNone) {
          bad_event(e, "a tensor list element is neither a tensor nor None");
        }
      }
    }
  }
}

// The step file's string table (/strings, /string_offsets): each distinct
// string once, in order of first use, the empty string first. It keeps its
// own copy of each (the index's keys view them), so that the events it was
// given need not outlive it.
class StringTable {
 public:
  static constexpr uint32_t kEmpty = 0;  // the row of "", added first
  StringTable() { add(""); }
  uint32_t add(std::string_view s) {
    // find before emplace: emplace builds a node even for a string it has.
    if (auto it = index_.find(s); it != index_.end()) return it->second;
    OPGUARD_CHECK(offsets_.size() <= UINT32_MAX);
    const auto row = static_cast<uint32_t>(offsets_.size() - 1);
    index_.emplace(owned_.emplace_back(s), row);
    blob_.append(s);
    offsets_.push_back(blob_.size());
    return row;
  }
  void write(const h5::Site& site, hid_t root) const {
    h5::write_column(site, root, "/strings", H5T_STD_U8LE, blob_.data(), blob_.size());
    h5::write_column(site, root, "/string_offsets", H5T_STD_U64LE, offsets_.data(), offsets_.size());
  }

 private:
  std::deque<std::string> owned_;  // never moves its strings
  std::unordered_map<std::string_view, uint32_t> index_;
  std::string blob_;
  std::vector<uint64_t> offsets_{0};
};

}  // namespace

struct StepWriter::Impl {
  std::string path;
  std::string tmp_path;
  h5::Site site;
  Handle file;
  Handle data_group;
  int64_t data_count = 0;
  // The event and value tables, a row per event and value as add_event
  // takes them (the events themselves are not kept: the recorder reuses them).
  StepColumns columns;
  StringTable strings;
  bool any_knobs = false;
  // What every /data/<n> is created with, built once per file: building them
  // per tensor cost about half of the writer's time on small tensors.
  Handle data_dcpl;
  Handle string_type;
  Handle scalar_space;
  std::vector<Handle> element_types;  // by DType, built on first use
  bool closed = false;

  Impl(const std::string& final_path)
      : path(final_path), tmp_path(final_path + ".tmp"), site(tmp_path, h5::Blame::kFileSystem, "step file") {}

  void add_values(const std::vector<Value>& values);
  void write_columns();
};

StepWriter::StepWriter(const std::string& path, int rank, int64_t step, bool full_tensors) : impl_(new Impl(path)) {
  try {
    h5::silence_errors();
    const h5::Site& site = impl_->site;
    // 64 KiB metadata blocks for full dumps, a dataset per tensor: 8192 x 16
    // KiB tensors 0.66 -> 0.70 of a plain HDF5 write, tiny_gpt --dump-all end
    // to end 0.72 -> 0.75-0.83. Not for fingerprints only: a step file of
    // tiny_gpt --width 32 grew from 176 to 227 KB.
    impl_->file = create_file(site, full_tensors ? 64 << 10 : 0);
    hid_t root = impl_->file.get();
    // Written first, so that even a torn .tmp says what it is.
    h5::write_int_attr(site, root, "opguard_format", H5T_STD_I32LE, kFormatVersion);
    h5::write_string_attr(site, root, "kind", step_layout::kKind);
    h5::write_int_attr(site, root, "rank", H5T_STD_I32LE, rank);
    h5::write_int_attr(site, root, "step", H5T_STD_I64LE, step);
    impl_->data_group = h5::group(site, H5Gcreate2(root, "/data", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                  "H5Gcreate2(/data)");
    // Contiguous and never pre-filled: the bytes are written once, straight from
    // the caller's buffer (HDF5 skips its sieve buffer for large contiguous writes).
    impl_->data_dcpl = h5::plist(site, H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate(dataset create)");
    site.ok(H5Pset_layout(impl_->data_dcpl.get(), H5D_CONTIGUOUS), "H5Pset_layout");
    site.ok(H5Pset_fill_time(impl_->data_dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
    impl_->string_type = h5::string_type(site);
    impl_->scalar_space = h5::dataspace(site, H5Screate(H5S_SCALAR), "H5Screate");
    impl_->element_types.resize(kNumDTypes);
  } catch (...) {
    delete impl_;
    throw;
  }
}

StepWriter::~StepWriter() {
  // Never throws: Handle::reset ignores failures. Without close() the .tmp stays.
  delete impl_;
}

int64_t StepWriter::write_tensor(DType dtype, const std::vector<int64_t>& sizes, const void* bytes,
                                 std::size_t nbytes) {
  Impl& im = *impl_;
  OPGUARD_CHECK(!im.closed);
  OPGUARD_CHECK(static_cast<int>(dtype) < kNumDTypes);
  const h5::Site& site = im.site;
  if (sizes.size() > static_cast<std::size_t>(step_layout::kMaxDataRank)) {
    throw FormatError("cannot store a tensor of " + std::to_string(sizes.size()) +
                      " dimensions in " + im.tmp_path + ": HDF5 datasets have at most 32");
  }
  TensorMeta shape;
  shape.sizes = sizes;
  int64_t numel = shape.numel();
  uint64_t expected = 0;
  OPGUARD_CHECK(numel >= 0);
  OPGUARD_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(numel), dtype_size(dtype), &expected));
  OPGUARD_CHECK(expected == nbytes);
  OPGUARD_CHECK(bytes != nullptr || nbytes == 0);

  int64_t index = im.data_count;
  std::string name = std::to_string(index);
  std::string full = "/data/" + name;
  std::vector<hsize_t> dims(sizes.begin(), sizes.end());
  Handle space = sizes.empty()
                     ? h5::dataspace(site, H5Screate(H5S_SCALAR), "H5Screate(" + full + ")")
                     : h5::dataspace(site, H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                     "H5Screate_simple(" + full + ")");
  Handle& type = im.element_types[static_cast<std::size_t>(dtype)];
  if (!type.valid()) type = element_type(site, dtype);
  Handle ds = h5::dataset(site,
                          H5Dcreate2(im.data_group.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT,
                                     im.data_dcpl.get(), H5P_DEFAULT),
                          "H5Dcreate2(" + full + ")");
  if (needs_dtype_attribute(dtype)) {
    h5::write_string_attr(site, ds.get(), "dtype", std::string(dtype_name(dtype)), im.string_type.get(),
                          im.scalar_space.get());
  }
  if (nbytes > 0) {
    site.ok(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes), "H5Dwrite(" + full + ")");
  }
  site.ok(H5Dclose(ds.release()), "H5Dclose(" + full + ")");
  ++im.data_count;
  bytes_written_ += nbytes;
  return index;
}

void StepWriter::add_event(const Event& event) {
  Impl& im = *impl_;
  OPGUARD_CHECK(!im.closed);
  if (static_cast<int>(event.phase) > static_cast<int>(Phase::kOther)) bad_event(event, "its phase is unknown");
  if (event.inputs.size() > UINT32_MAX || event.outputs.size() > UINT32_MAX) bad_event(event, "too many values");
  check_values(event, event.inputs, im.data_count);
  check_values(event, event.outputs, im.data_count);
  StepColumns::Events& c = im.columns.events;
  StringTable& strings = im.strings;
  c.id.push_back(event.id);
  c.stream.push_back(event.stream);
  c.seq.push_back(event.seq);
  c.thread.push_back(event.thread);
  c.step.push_back(event.step);
  c.phase.push_back(static_cast<uint8_t>(event.phase));
  c.op.push_back(strings.add(event.op));
  c.overload.push_back(strings.add(event.overload));
  c.schema.push_back(strings.add(event.schema));
  c.scope.push_back(strings.add(event.scope));
  c.node.push_back(strings.add(event.node));
  c.t_start_ns.push_back(event.t_start_ns);
  c.t_end_ns.push_back(event.t_end_ns);
  c.flags.push_back(event.flags);
  c.knobs.push_back(event.knobs.value_or(0));
  im.any_knobs = im.any_knobs || event.knobs.has_value();
  c.value_begin.push_back(im.columns.values.size());
  c.n_inputs.push_back(static_cast<uint32_t>(event.inputs.size()));
  c.n_outputs.push_back(static_cast<uint32_t>(event.outputs.size()));
  im.add_values(event.inputs);
  im.add_values(event.outputs);
}

void StepWriter::Impl::add_values(const std::vector<Value>& values) {
  StepColumns::Values& c = columns.values;
  for (const Value& v : values) {
    c.kind.push_back(static_cast<uint8_t>(v.kind));
    c.name.push_back(strings.add(v.name));
    c.text.push_back(strings.add(v.text));
    c.list_len.push_back(v.kind == ValueKind::kTensorList ? v.list_len : 0);
    c.mutated.push_back(v.mutated ? 1 : 0);
    if (carries_tensor(v.kind)) {
      const TensorMeta& t = v.tensor;
      c.dtype.push_back(static_cast<uint8_t>(t.dtype));
      c.flags.push_back(t.flags);
      c.fingerprint.push_back(t.fingerprint);
      c.storage_id.push_back(t.storage_id);
      c.version.push_back(t.version);
      c.storage_offset.push_back(t.storage_offset);
      c.device.push_back(strings.add(t.device));
      c.data_index.push_back(t.data_index);
      c.ndim.push_back(static_cast<uint8_t>(t.sizes.size()));
      c.dims_offset.push_back(columns.dims.size());
      columns.dims.insert(columns.dims.end(), t.sizes.begin(), t.sizes.end());
      columns.dims.insert(columns.dims.end(), t.strides.begin(), t.strides.end());
    } else {
      // Tensor columns of non-tensor rows hold these fixed values.
      c.dtype.push_back(0);
      c.flags.push_back(0);
      c.fingerprint.push_back(0);
      c.storage_id.push_back(0);
      c.version.push_back(0);
      c.storage_offset.push_back(0);
      c.device.push_back(StringTable::kEmpty);
      c.data_index.push_back(-1);
      c.ndim.push_back(0);
      c.dims_offset.push_back(0);
    }
  }
}

void StepWriter::Impl::write_columns() {
  const StepColumns::Events& e = columns.events;
  const StepColumns::Values& v = columns.values;
  const std::size_t n = e.size();
  const std::size_t m = v.size();
  hid_t root = file.get();
  Handle events_group = h5::group(site, H5Gcreate2(root, "/events", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                  "H5Gcreate2(/events)");
  Handle values_group = h5::group(site, H5Gcreate2(root, "/values", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                  "H5Gcreate2(/values)");
  using h5::write_column;
  write_column(site, root, "/events/id", H5T_STD_U64LE, e.id.data(), n);
  write_column(site, root, "/events/stream", H5T_STD_U32LE, e.stream.data(), n);
  write_column(site, root, "/events/seq", H5T_STD_U64LE, e.seq.data(), n);
  write_column(site, root, "/events/thread", H5T_STD_U64LE, e.thread.data(), n);
  write_column(site, root, "/events/step", H5T_STD_I64LE, e.step.data(), n);
  write_column(site, root, "/events/phase", H5T_STD_U8LE, e.phase.data(), n);
  write_column(site, root, "/events/op", H5T_STD_U32LE, e.op.data(), n);
  write_column(site, root, "/events/overload", H5T_STD_U32LE, e.overload.data(), n);
  write_column(site, root, "/events/schema", H5T_STD_U32LE, e.schema.data(), n);
  write_column(site, root, "/events/scope", H5T_STD_U32LE, e.scope.data(), n);
  write_column(site, root, "/events/node", H5T_STD_U32LE, e.node.data(), n);
  write_column(site, root, "/events/t_start_ns", H5T_STD_I64LE, e.t_start_ns.data(), n);
  write_column(site, root, "/events/t_end_ns", H5T_STD_I64LE, e.t_end_ns.data(), n);
  write_column(site, root, "/events/flags", H5T_STD_U32LE, e.flags.data(), n);
  // Optional: a file of events without knobs (written by tests, or converted)
  // has no column, as files recorded before it existed.
  if (any_knobs) write_column(site, root, "/events/knobs", H5T_STD_U32LE, e.knobs.data(), n);
  write_column(site, root, "/events/value_begin", H5T_STD_U64LE, e.value_begin.data(), n);
  write_column(site, root, "/events/n_inputs", H5T_STD_U32LE, e.n_inputs.data(), n);
  write_column(site, root, "/events/n_outputs", H5T_STD_U32LE, e.n_outputs.data(), n);

  write_column(site, root, "/values/kind", H5T_STD_U8LE, v.kind.data(), m);
  write_column(site, root, "/values/name", H5T_STD_U32LE, v.name.data(), m);
  write_column(site, root, "/values/text", H5T_STD_U32LE, v.text.data(), m);
  write_column(site, root, "/values/dtype", H5T_STD_U8LE, v.dtype.data(), m);
  write_column(site, root, "/values/flags", H5T_STD_U8LE, v.flags.data(), m);
  write_column(site, root, "/values/mutated", H5T_STD_U8LE, v.mutated.data(), m);
  write_column(site, root, "/values/list_len", H5T_STD_I32LE, v.list_len.data(), m);
  write_column(site, root, "/values/fingerprint", H5T_STD_U64LE, v.fingerprint.data(), m);
  write_column(site, root, "/values/storage_id", H5T_STD_U64LE, v.storage_id.data(), m);
  write_column(site, root, "/values/version", H5T_STD_U32LE, v.version.data(), m);
  write_column(site, root, "/values/storage_offset", H5T_STD_I64LE, v.storage_offset.data(), m);
  write_column(site, root, "/values/device", H5T_STD_U32LE, v.device.data(), m);
  write_column(site, root, "/values/data_index", H5T_STD_I64LE, v.data_index.data(), m);
  write_column(site, root, "/values/ndim", H5T_STD_U8LE, v.ndim.data(), m);
  write_column(site, root, "/values/dims_offset", H5T_STD_U64LE, v.dims_offset.data(), m);
  write_column(site, root, "/dims", H5T_STD_I64LE, columns.dims.data(), columns.dims.size());
  strings.write(site, root);
}

void StepWriter::abandon() {
  Impl& im = *impl_;
  if (im.closed) return;
  im.data_group.reset();
  im.file.reset();  // abandons the file (h5::created_file)
  im.closed = true;
}

void StepWriter::close() {
  Impl& im = *impl_;
  OPGUARD_CHECK(!im.closed);
  im.write_columns();
  const h5::Site& site = im.site;
  im.data_group.reset();
  h5::finish_file(site, im.file);
  im.closed = true;
  if (std::rename(im.tmp_path.c_str(), im.path.c_str()) != 0) {
    int err = errno;
    throw IoError("could not rename " + im.tmp_path + " to " + im.path + ": " + std::strerror(err));
  }
}

}  // namespace opguard::formats
