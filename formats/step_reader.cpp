// StepReader: opens one step file and validates everything before trusting it.

#include <sys/stat.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "element_types.h"
#include "h5.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "files.h"
#include "step_layout.h"

namespace opguard::formats {
namespace {

using h5::Handle;

// Row counts a reader trusts: a column cannot hold more rows than the file has
// bytes for.
struct Caps {
  std::size_t u8 = 0, u32 = 0, u64 = 0;
  explicit Caps(uint64_t file_size) : u8(file_size), u32(file_size / 4), u64(file_size / 8) {}
};

// The first row of `column` at or above `limit`, or column.size(). One pass
// without branches the compiler cannot fold: these checks run over every row.
template <typename T>
std::size_t first_at_or_above(const Column<T>& column, uint64_t limit) {
  T top = 0;
  for (T x : column) top = std::max(top, x);
  if (static_cast<uint64_t>(top) < limit) return column.size();
  std::size_t r = 0;
  while (static_cast<uint64_t>(column[r]) < limit) ++r;
  return r;
}

}  // namespace

struct StepReader::Impl {
  std::string path;
  h5::Site site;
  uint64_t file_size = 0;
  Handle file;
  Handle data_group;
  int rank = 0;
  int64_t step = 0;
  StepColumns columns;
  std::size_t data_count = 0;
  std::once_flag events_built;
  std::vector<Event> events;  // built from `columns` on the first events()

  explicit Impl(const std::string& p) : path(p), site(p, h5::Blame::kFile, "opguard step file") {}
  void read_columns();
  void check_strings() const;
  void check_values() const;
  void check_events() const;
  Value value(std::size_t row) const;
};

void StepReader::Impl::read_columns() {
  const Caps cap(file_size);
  hid_t root = file.get();
  using h5::read_column;
  StepColumns::Events& e = columns.events;
  StepColumns::Values& v = columns.values;
  e.id = read_column<uint64_t>(site, root, "/events/id", H5T_STD_U64LE, cap.u64);
  e.stream = read_column<uint32_t>(site, root, "/events/stream", H5T_STD_U32LE, cap.u32);
  e.seq = read_column<uint64_t>(site, root, "/events/seq", H5T_STD_U64LE, cap.u64);
  e.thread = read_column<uint64_t>(site, root, "/events/thread", H5T_STD_U64LE, cap.u64);
  e.step = read_column<int64_t>(site, root, "/events/step", H5T_STD_I64LE, cap.u64);
  e.phase = read_column<uint8_t>(site, root, "/events/phase", H5T_STD_U8LE, cap.u8);
  e.op = read_column<uint32_t>(site, root, "/events/op", H5T_STD_U32LE, cap.u32);
  e.overload = read_column<uint32_t>(site, root, "/events/overload", H5T_STD_U32LE, cap.u32);
  e.schema = read_column<uint32_t>(site, root, "/events/schema", H5T_STD_U32LE, cap.u32);
  e.scope = read_column<uint32_t>(site, root, "/events/scope", H5T_STD_U32LE, cap.u32);
  e.node = read_column<uint32_t>(site, root, "/events/node", H5T_STD_U32LE, cap.u32);
  e.t_start_ns = read_column<int64_t>(site, root, "/events/t_start_ns", H5T_STD_I64LE, cap.u64);
  e.t_end_ns = read_column<int64_t>(site, root, "/events/t_end_ns", H5T_STD_I64LE, cap.u64);
  e.flags = read_column<uint32_t>(site, root, "/events/flags", H5T_STD_U32LE, cap.u32);
  if (h5::has_link(site, root, "/events/knobs"))
    e.knobs = read_column<uint32_t>(site, root, "/events/knobs", H5T_STD_U32LE, cap.u32);
  e.value_begin = read_column<uint64_t>(site, root, "/events/value_begin", H5T_STD_U64LE, cap.u64);
  e.n_inputs = read_column<uint32_t>(site, root, "/events/n_inputs", H5T_STD_U32LE, cap.u32);
  e.n_outputs = read_column<uint32_t>(site, root, "/events/n_outputs", H5T_STD_U32LE, cap.u32);

  v.kind = read_column<uint8_t>(site, root, "/values/kind", H5T_STD_U8LE, cap.u8);
  v.name = read_column<uint32_t>(site, root, "/values/name", H5T_STD_U32LE, cap.u32);
  v.text = read_column<uint32_t>(site, root, "/values/text", H5T_STD_U32LE, cap.u32);
  v.dtype = read_column<uint8_t>(site, root, "/values/dtype", H5T_STD_U8LE, cap.u8);
  v.flags = read_column<uint8_t>(site, root, "/values/flags", H5T_STD_U8LE, cap.u8);
  v.mutated = read_column<uint8_t>(site, root, "/values/mutated", H5T_STD_U8LE, cap.u8);
  v.list_len = read_column<int32_t>(site, root, "/values/list_len", H5T_STD_I32LE, cap.u32);
  v.fingerprint = read_column<uint64_t>(site, root, "/values/fingerprint", H5T_STD_U64LE, cap.u64);
  v.storage_id = read_column<uint64_t>(site, root, "/values/storage_id", H5T_STD_U64LE, cap.u64);
  v.version = read_column<uint32_t>(site, root, "/values/version", H5T_STD_U32LE, cap.u32);
  v.storage_offset = read_column<int64_t>(site, root, "/values/storage_offset", H5T_STD_I64LE, cap.u64);
  v.device = read_column<uint32_t>(site, root, "/values/device", H5T_STD_U32LE, cap.u32);
  v.data_index = read_column<int64_t>(site, root, "/values/data_index", H5T_STD_I64LE, cap.u64);
  v.ndim = read_column<uint8_t>(site, root, "/values/ndim", H5T_STD_U8LE, cap.u8);
  v.dims_offset = read_column<uint64_t>(site, root, "/values/dims_offset", H5T_STD_U64LE, cap.u64);
  columns.dims = read_column<int64_t>(site, root, "/dims", H5T_STD_I64LE, cap.u64);
  columns.strings = read_column<char>(site, root, "/strings", H5T_STD_U8LE, cap.u8);
  columns.string_offsets = read_column<uint64_t>(site, root, "/string_offsets", H5T_STD_U64LE, cap.u64);

  // Every column of a group has its group's row count.
  auto same_rows = [&](std::size_t rows, std::size_t expected, const char* column) {
    if (rows != expected) {
      site.fail("its column " + std::string(column) + " has " + std::to_string(rows) + " rows where " +
                std::to_string(expected) + " were expected");
    }
  };
  const std::size_t n = e.id.size();
  same_rows(e.stream.size(), n, "/events/stream");
  same_rows(e.seq.size(), n, "/events/seq");
  same_rows(e.thread.size(), n, "/events/thread");
  same_rows(e.step.size(), n, "/events/step");
  same_rows(e.phase.size(), n, "/events/phase");
  same_rows(e.op.size(), n, "/events/op");
  same_rows(e.overload.size(), n, "/events/overload");
  same_rows(e.schema.size(), n, "/events/schema");
  same_rows(e.scope.size(), n, "/events/scope");
  same_rows(e.node.size(), n, "/events/node");
  same_rows(e.t_start_ns.size(), n, "/events/t_start_ns");
  same_rows(e.t_end_ns.size(), n, "/events/t_end_ns");
  same_rows(e.flags.size(), n, "/events/flags");
  if (!e.knobs.empty()) same_rows(e.knobs.size(), n, "/events/knobs");
  same_rows(e.value_begin.size(), n, "/events/value_begin");
  same_rows(e.n_inputs.size(), n, "/events/n_inputs");
  same_rows(e.n_outputs.size(), n, "/events/n_outputs");
  const std::size_t m = v.kind.size();
  same_rows(v.name.size(), m, "/values/name");
  same_rows(v.text.size(), m, "/values/text");
  same_rows(v.dtype.size(), m, "/values/dtype");
  same_rows(v.flags.size(), m, "/values/flags");
  same_rows(v.mutated.size(), m, "/values/mutated");
  same_rows(v.list_len.size(), m, "/values/list_len");
  same_rows(v.fingerprint.size(), m, "/values/fingerprint");
  same_rows(v.storage_id.size(), m, "/values/storage_id");
  same_rows(v.version.size(), m, "/values/version");
  same_rows(v.storage_offset.size(), m, "/values/storage_offset");
  same_rows(v.device.size(), m, "/values/device");
  same_rows(v.data_index.size(), m, "/values/data_index");
  same_rows(v.ndim.size(), m, "/values/ndim");
  same_rows(v.dims_offset.size(), m, "/values/dims_offset");

  check_strings();
  check_values();
  check_events();
}

// /string_offsets: K + 1 non-decreasing offsets from 0 to the size of /strings.
void StepReader::Impl::check_strings() const {
  const auto& offsets = columns.string_offsets;
  if (offsets.empty()) site.fail("its /string_offsets is empty (it needs at least the offset 0)");
  if (offsets.size() - 1 > UINT32_MAX) site.fail("its string table has more strings than a u32 index can name");
  if (offsets.front() != 0) site.fail("its /string_offsets does not start at 0");
  for (std::size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) {
      site.fail("its /string_offsets decreases at row " + std::to_string(i) + " (" + std::to_string(offsets[i - 1]) +
                " then " + std::to_string(offsets[i]) + ")");
    }
  }
  if (offsets.back() != columns.strings.size()) {
    site.fail("its /string_offsets ends at " + std::to_string(offsets.back()) + " but /strings holds " +
              std::to_string(columns.strings.size()) + " bytes");
  }
}

// Every value row on its own: string indices in range, kind codes known; for
// rows that carry a tensor, the dtype code known, /dims and /data in range.
void StepReader::Impl::check_values() const {
  const StepColumns::Values& v = columns.values;
  const std::size_t strings = columns.string_count();
  for (const auto& [column, name] : {std::pair{&v.name, "/values/name"}, {&v.text, "/values/text"},
                                     {&v.device, "/values/device"}}) {
    const std::size_t r = first_at_or_above(*column, strings);
    if (r < column->size()) {
      site.fail("row " + std::to_string(r) + " of " + name + " names string " + std::to_string((*column)[r]) +
                " of a string table of " + std::to_string(strings));
    }
  }
  if (const std::size_t r = first_at_or_above(v.kind, static_cast<uint64_t>(ValueKind::kOther) + 1); r < v.size()) {
    site.fail("row " + std::to_string(r) + " of /values has the unknown value kind code " + std::to_string(v.kind[r]));
  }
  const std::size_t n_dims = columns.dims.size();
  for (std::size_t r = 0; r < v.size(); ++r) {
    if (!carries_tensor(static_cast<ValueKind>(v.kind[r]))) continue;
    if (v.dtype[r] >= kNumDTypes) {
      site.fail("row " + std::to_string(r) + " of /values has the unknown dtype code " + std::to_string(v.dtype[r]));
    }
    const uint64_t off = v.dims_offset[r];
    const uint64_t rank = v.ndim[r];
    if (off > n_dims || 2 * rank > n_dims - off) {
      site.fail("row " + std::to_string(r) + " of /values has its sizes and strides at /dims[" + std::to_string(off) +
                "] beyond the " + std::to_string(n_dims) + " entries of /dims");
    }
    const int64_t di = v.data_index[r];
    if (di != -1 && (di < 0 || static_cast<uint64_t>(di) >= data_count)) {
      site.fail("row " + std::to_string(r) + " of /values refers to /data/" + std::to_string(di) +
                ", but the file holds " + std::to_string(data_count) + " /data datasets");
    }
  }
}

// Every event: codes known, string indices and value rows in range, tensor
// lists inside the event's side and made of tensors and Nones.
void StepReader::Impl::check_events() const {
  const StepColumns::Events& e = columns.events;
  const StepColumns::Values& v = columns.values;
  const std::size_t strings = columns.string_count();
  const std::size_t m = v.size();
  for (const auto& [column, name] : {std::pair{&e.op, "/events/op"}, {&e.overload, "/events/overload"},
                                     {&e.schema, "/events/schema"}, {&e.scope, "/events/scope"},
                                     {&e.node, "/events/node"}}) {
    const std::size_t r = first_at_or_above(*column, strings);
    if (r < column->size()) {
      site.fail("event " + std::to_string(r) + " names string " + std::to_string((*column)[r]) + " in " + name +
                " of a string table of " + std::to_string(strings));
    }
  }
  if (const std::size_t i = first_at_or_above(e.phase, static_cast<uint64_t>(Phase::kOther) + 1); i < e.size()) {
    site.fail("event " + std::to_string(i) + " has the unknown phase code " + std::to_string(e.phase[i]));
  }
  auto event = [](std::size_t i) { return "event " + std::to_string(i); };  // messages only
  for (std::size_t i = 0; i < e.size(); ++i) {
    try {
      autocast_of(e.flags[i]);  // its dtype codes are ones this opguard knows
      default_dtype_of(e.flags[i]);
    } catch (const FormatError& err) {
      site.fail(event(i) + " has " + err.what() + " in its flags");
    }
    if (!e.knobs.empty() && e.knobs[i] != 0) {
      try {
        knobs_of(e.knobs[i]);
      } catch (const FormatError& err) {
        site.fail(event(i) + " has " + err.what() + " in /events/knobs");
      }
    }
    const uint64_t begin = e.value_begin[i];
    const uint64_t count = uint64_t{e.n_inputs[i]} + e.n_outputs[i];
    if (begin > m || count > m - begin) {
      site.fail(event(i) + " has its values at /values rows " + std::to_string(begin) + ".." +
                std::to_string(begin + count) + " beyond the " + std::to_string(m) + " rows of /values");
    }
    for (const auto& [side_begin, side_count, side] :
         {std::tuple{begin, e.n_inputs[i], "input"}, {begin + e.n_inputs[i], e.n_outputs[i], "output"}}) {
      for (uint32_t k = 0; k < side_count; ++k) {
        if (v.kind[side_begin + k] != static_cast<uint8_t>(ValueKind::kTensorList)) continue;
        const int32_t len = v.list_len[side_begin + k];
        if (len < 0 || static_cast<uint32_t>(len) >= side_count - k) {
          site.fail(event(i) + " " + side + " " + std::to_string(k) + " is a tensor list of " +
                    std::to_string(len) + " elements that runs past the event's " + std::to_string(side_count) +
                    " " + side + "s");
        }
        for (uint32_t j = k + 1; j <= k + static_cast<uint32_t>(len); ++j) {
          const auto kind = static_cast<ValueKind>(v.kind[side_begin + j]);
          if (kind != ValueKind::kTensor && kind != ValueKind::kNone) {
            site.fail(event(i) + " " + side + " " + std::to_string(j) +
                      " is an element of a tensor list but neither a tensor nor None");
          }
        }
      }
    }
  }
}

// One value row of a validated table as a Value.
Value StepReader::Impl::value(std::size_t r) const {
  const StepColumns::Values& c = columns.values;
  Value v;
  v.kind = static_cast<ValueKind>(c.kind[r]);
  v.name = columns.string(c.name[r]);
  v.text = columns.string(c.text[r]);
  v.mutated = c.mutated[r] != 0;
  if (v.kind == ValueKind::kTensorList) v.list_len = c.list_len[r];
  if (!carries_tensor(v.kind)) return v;
  TensorMeta& t = v.tensor;
  t.dtype = static_cast<DType>(c.dtype[r]);
  t.flags = c.flags[r];
  t.fingerprint = c.fingerprint[r];
  t.storage_id = c.storage_id[r];
  t.version = c.version[r];
  t.storage_offset = c.storage_offset[r];
  t.device = columns.string(c.device[r]);
  const auto dims = columns.dims.begin() + static_cast<std::ptrdiff_t>(c.dims_offset[r]);
  const std::ptrdiff_t rank = c.ndim[r];
  t.sizes.assign(dims, dims + rank);
  t.strides.assign(dims + rank, dims + 2 * rank);
  t.data_index = c.data_index[r];
  return v;
}

Event StepReader::event(std::size_t i) const {
  const Impl& im = *impl_;
  const StepColumns::Events& c = im.columns.events;
  OPGUARD_CHECK(i < c.size());
  Event e;
  e.id = c.id[i];
  e.stream = c.stream[i];
  e.seq = c.seq[i];
  e.thread = c.thread[i];
  e.step = c.step[i];
  e.phase = static_cast<Phase>(c.phase[i]);
  e.op = im.columns.string(c.op[i]);
  e.overload = im.columns.string(c.overload[i]);
  e.schema = im.columns.string(c.schema[i]);
  e.scope = im.columns.string(c.scope[i]);
  e.node = im.columns.string(c.node[i]);
  e.t_start_ns = c.t_start_ns[i];
  e.t_end_ns = c.t_end_ns[i];
  e.flags = c.flags[i];
  if (!c.knobs.empty() && c.knobs[i] != 0) e.knobs = c.knobs[i];
  const std::size_t begin = c.value_begin[i];
  e.inputs.reserve(c.n_inputs[i]);
  for (std::size_t k = 0; k < c.n_inputs[i]; ++k) e.inputs.push_back(im.value(begin + k));
  e.outputs.reserve(c.n_outputs[i]);
  for (std::size_t k = 0; k < c.n_outputs[i]; ++k) e.outputs.push_back(im.value(begin + c.n_inputs[i] + k));
  return e;
}

StepReader::StepReader(const std::string& path) : impl_(new Impl(path)) {
  try {
    Impl& im = *impl_;
    h5::silence_errors();
    im.file_size = open_checked_file(im.site, step_layout::kKind, im.file);
    hid_t root = im.file.get();
    int64_t rank = h5::read_int_attr(im.site, root, "rank");
    if (rank < 0 || rank > INT32_MAX) im.site.fail("its rank attribute " + std::to_string(rank) + " is out of range");
    im.rank = static_cast<int>(rank);
    im.step = h5::read_int_attr(im.site, root, "step");
    if (!im.site.tri(H5Lexists(root, "/data", H5P_DEFAULT), "H5Lexists(/data)")) im.site.fail("it has no /data group");
    im.data_group = h5::group(im.site, H5Gopen2(root, "/data", H5P_DEFAULT), "H5Gopen2(/data)");
    H5G_info_t info;
    im.site.ok(H5Gget_info(im.data_group.get(), &info), "H5Gget_info(/data)");
    im.data_count = static_cast<std::size_t>(info.nlinks);
    im.read_columns();
  } catch (...) {
    delete impl_;
    throw;
  }
}

StepReader::~StepReader() { delete impl_; }

bool concurrent_step_reads() {
  hbool_t threadsafe = false;
  return H5is_library_threadsafe(&threadsafe) >= 0 && threadsafe;
}

int StepReader::rank() const { return impl_->rank; }
int64_t StepReader::step() const { return impl_->step; }
const StepColumns& StepReader::columns() const { return impl_->columns; }
const std::vector<Event>& StepReader::events() const {
  Impl& im = *impl_;
  std::call_once(im.events_built, [&] {
    im.events.reserve(im.columns.events.size());
    for (std::size_t i = 0; i < im.columns.events.size(); ++i) im.events.push_back(event(i));
  });
  return im.events;
}
std::size_t StepReader::data_count() const { return impl_->data_count; }
const std::string& StepReader::path() const { return impl_->path; }

TensorData StepReader::read_tensor(int64_t data_index) const {
  const Impl& im = *impl_;
  const h5::Site& site = im.site;
  std::string full = "/data/" + std::to_string(data_index);
  if (data_index < 0 || static_cast<uint64_t>(data_index) >= im.data_count) {
    site.fail("it has no " + full + " (it holds " + std::to_string(im.data_count) + " /data datasets)");
  }
  std::string name = std::to_string(data_index);
  if (!site.tri(H5Lexists(im.data_group.get(), name.c_str(), H5P_DEFAULT), "H5Lexists(" + full + ")")) {
    site.fail("it has no " + full + " although /data holds " + std::to_string(im.data_count) + " datasets");
  }
  Handle ds = h5::dataset(site, H5Dopen2(im.data_group.get(), name.c_str(), H5P_DEFAULT), "H5Dopen2(" + full + ")");
  Handle file_type = h5::datatype(site, H5Dget_type(ds.get()), "H5Dget_type(" + full + ")");
  // The dtype attribute where the HDF5 type does not tell the dtype, else the type itself.
  std::optional<DType> dtype;
  std::string dtype_text;
  const bool has_dtype_attr = h5::has_attr(site, ds.get(), "dtype");
  if (has_dtype_attr) {
    dtype_text = h5::read_string_attr(site, ds.get(), "dtype");
    dtype = dtype_from_name(dtype_text);
    if (!dtype) site.fail(full + " has the unknown dtype \"" + dtype_text + "\"");
  } else {
    dtype = dtype_of_element_type(site, file_type.get());
    if (!dtype) site.fail(full + " has no dtype attribute and an HDF5 type that names no dtype without one");
  }
  Handle type = element_type(site, *dtype);
  if (has_dtype_attr && !site.tri(H5Tequal(file_type.get(), type.get()), "H5Tequal(" + full + ")")) {
    site.fail(full + " is stored as an HDF5 type that is not the one for its dtype " + dtype_text);
  }
  Handle space = h5::dataspace(site, H5Dget_space(ds.get()), "H5Dget_space(" + full + ")");
  H5S_class_t space_class = H5Sget_simple_extent_type(space.get());
  TensorData out;
  out.dtype = *dtype;
  if (space_class == H5S_SIMPLE) {
    int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || rank > step_layout::kMaxDataRank) site.fail(full + " has an invalid rank");
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    site.ok(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0 ? -1 : 0,
            "H5Sget_simple_extent_dims(" + full + ")");
    for (hsize_t d : dims) {
      if (d > static_cast<hsize_t>(INT64_MAX)) site.fail(full + " has a dimension out of range");
      out.sizes.push_back(static_cast<int64_t>(d));
    }
  } else if (space_class != H5S_SCALAR) {
    site.fail(full + " has neither a simple nor a scalar dataspace");
  }
  TensorMeta shape;
  shape.sizes = out.sizes;
  int64_t numel = shape.numel();
  uint64_t nbytes = 0;
  if (numel < 0 || __builtin_mul_overflow(static_cast<uint64_t>(numel), dtype_size(*dtype), &nbytes) ||
      nbytes > im.file_size) {
    site.fail(full + " claims more bytes than the file holds");
  }
  if (nbytes == 0) return out;
  if (H5Dget_storage_size(ds.get()) != nbytes) {
    site.fail(full + " holds " + std::to_string(H5Dget_storage_size(ds.get())) + " bytes on disk, not the " +
              std::to_string(nbytes) + " its shape needs");
  }
  out.bytes.resize(nbytes);
  site.ok(H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.bytes.data()), "H5Dread(" + full + ")");
  return out;
}

TensorData StepReader::read_tensor(const TensorMeta& meta) const {
  TensorData data = read_tensor(meta.data_index);
  if (data.dtype != meta.dtype || data.sizes != meta.sizes) {
    auto describe = [](DType d, const std::vector<int64_t>& sizes) {
      std::string s(dtype_name(d));
      s += " [";
      for (std::size_t i = 0; i < sizes.size(); ++i) s += (i ? "," : "") + std::to_string(sizes[i]);
      return s + "]";
    };
    impl_->site.fail("/data/" + std::to_string(meta.data_index) + " holds a " + describe(data.dtype, data.sizes) +
                     " tensor where its value row says " + describe(meta.dtype, meta.sizes));
  }
  return data;
}

}  // namespace opguard::formats
