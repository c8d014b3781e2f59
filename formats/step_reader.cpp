// StepReader: opens one step file and validates everything before trusting it.

#include <sys/stat.h>

#include <string>
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
  std::size_t u8 = 0, u32 = 0, u64 = 0, str = 0;
  std::size_t bytes = 0;  // all strings of one column together, NULs included
  explicit Caps(uint64_t file_size)
      : u8(file_size),
        u32(file_size / 4),
        u64(file_size / 8),
        str(file_size / step_layout::kMinStringRowBytes),
        bytes(file_size + str) {}
};

}  // namespace

struct StepReader::Impl {
  std::string path;
  h5::Site site;
  uint64_t file_size = 0;
  Handle file;
  Handle data_group;
  GlobalHeaps heaps;
  int rank = 0;
  int64_t step = 0;
  std::vector<Event> events;
  std::size_t data_count = 0;

  explicit Impl(const std::string& p) : path(p), site(p, h5::Blame::kFile, "opguard step file") {}
  void read_events();
};

void StepReader::Impl::read_events() {
  const Caps cap(file_size);
  hid_t root = file.get();
  using h5::read_column;
  // String columns: heap ids checked first (global_heap.h).
  auto read_string_column = [&](const h5::Site& s, hid_t loc, const char* name, std::size_t max_rows,
                                std::size_t max_bytes) {
    heaps.check_string_column(s, loc, name);
    return h5::read_string_column(s, loc, name, max_rows, max_bytes);
  };

  auto id = read_column<uint64_t>(site, root, "/events/id", H5T_STD_U64LE, cap.u64);
  const std::size_t n = id.size();
  auto stream = read_column<uint32_t>(site, root, "/events/stream", H5T_STD_U32LE, cap.u32);
  auto seq = read_column<uint64_t>(site, root, "/events/seq", H5T_STD_U64LE, cap.u64);
  auto thread = read_column<uint64_t>(site, root, "/events/thread", H5T_STD_U64LE, cap.u64);
  auto step_col = read_column<int64_t>(site, root, "/events/step", H5T_STD_I64LE, cap.u64);
  auto phase = read_column<uint8_t>(site, root, "/events/phase", H5T_STD_U8LE, cap.u8);
  auto op = read_string_column(site, root, "/events/op", cap.str, cap.bytes);
  auto overload = read_string_column(site, root, "/events/overload", cap.str, cap.bytes);
  auto schema = read_column<uint32_t>(site, root, "/events/schema", H5T_STD_U32LE, cap.u32);
  auto scope = read_string_column(site, root, "/events/scope", cap.str, cap.bytes);
  auto node = read_string_column(site, root, "/events/node", cap.str, cap.bytes);
  auto t_start = read_column<int64_t>(site, root, "/events/t_start_ns", H5T_STD_I64LE, cap.u64);
  auto t_end = read_column<int64_t>(site, root, "/events/t_end_ns", H5T_STD_I64LE, cap.u64);
  auto flags = read_column<uint32_t>(site, root, "/events/flags", H5T_STD_U32LE, cap.u32);
  auto value_begin = read_column<uint64_t>(site, root, "/events/value_begin", H5T_STD_U64LE, cap.u64);
  auto n_inputs = read_column<uint32_t>(site, root, "/events/n_inputs", H5T_STD_U32LE, cap.u32);
  auto n_outputs = read_column<uint32_t>(site, root, "/events/n_outputs", H5T_STD_U32LE, cap.u32);
  auto schemas = read_string_column(site, root, "/schemas", cap.str, cap.bytes);

  auto kind = read_column<uint8_t>(site, root, "/values/kind", H5T_STD_U8LE, cap.u8);
  const std::size_t m = kind.size();
  auto name = read_string_column(site, root, "/values/name", cap.str, cap.bytes);
  auto text = read_string_column(site, root, "/values/text", cap.str, cap.bytes);
  auto dtype = read_column<uint8_t>(site, root, "/values/dtype", H5T_STD_U8LE, cap.u8);
  auto vflags = read_column<uint8_t>(site, root, "/values/flags", H5T_STD_U8LE, cap.u8);
  auto mutated = read_column<uint8_t>(site, root, "/values/mutated", H5T_STD_U8LE, cap.u8);
  auto list_len = read_column<int32_t>(site, root, "/values/list_len", H5T_STD_I32LE, cap.u32);
  auto fingerprint = read_column<uint64_t>(site, root, "/values/fingerprint", H5T_STD_U64LE, cap.u64);
  auto storage_id = read_column<uint64_t>(site, root, "/values/storage_id", H5T_STD_U64LE, cap.u64);
  auto version = read_column<uint32_t>(site, root, "/values/version", H5T_STD_U32LE, cap.u32);
  auto storage_offset = read_column<int64_t>(site, root, "/values/storage_offset", H5T_STD_I64LE, cap.u64);
  auto device = read_string_column(site, root, "/values/device", cap.str, cap.bytes);
  auto data_index = read_column<int64_t>(site, root, "/values/data_index", H5T_STD_I64LE, cap.u64);
  auto ndim = read_column<uint8_t>(site, root, "/values/ndim", H5T_STD_U8LE, cap.u8);
  auto dims_offset = read_column<uint64_t>(site, root, "/values/dims_offset", H5T_STD_U64LE, cap.u64);
  auto dims = read_column<int64_t>(site, root, "/dims", H5T_STD_I64LE, cap.u64);

  // Every column of a group has its group's row count.
  auto same_rows = [&](std::size_t rows, std::size_t expected, const char* column) {
    if (rows != expected) {
      site.fail("its column " + std::string(column) + " has " + std::to_string(rows) + " rows where " +
                std::to_string(expected) + " were expected");
    }
  };
  same_rows(stream.size(), n, "/events/stream");
  same_rows(seq.size(), n, "/events/seq");
  same_rows(thread.size(), n, "/events/thread");
  same_rows(step_col.size(), n, "/events/step");
  same_rows(phase.size(), n, "/events/phase");
  same_rows(op.size(), n, "/events/op");
  same_rows(overload.size(), n, "/events/overload");
  same_rows(schema.size(), n, "/events/schema");
  same_rows(scope.size(), n, "/events/scope");
  same_rows(node.size(), n, "/events/node");
  same_rows(t_start.size(), n, "/events/t_start_ns");
  same_rows(t_end.size(), n, "/events/t_end_ns");
  same_rows(flags.size(), n, "/events/flags");
  same_rows(value_begin.size(), n, "/events/value_begin");
  same_rows(n_inputs.size(), n, "/events/n_inputs");
  same_rows(n_outputs.size(), n, "/events/n_outputs");
  same_rows(name.size(), m, "/values/name");
  same_rows(text.size(), m, "/values/text");
  same_rows(dtype.size(), m, "/values/dtype");
  same_rows(vflags.size(), m, "/values/flags");
  same_rows(mutated.size(), m, "/values/mutated");
  same_rows(list_len.size(), m, "/values/list_len");
  same_rows(fingerprint.size(), m, "/values/fingerprint");
  same_rows(storage_id.size(), m, "/values/storage_id");
  same_rows(version.size(), m, "/values/version");
  same_rows(storage_offset.size(), m, "/values/storage_offset");
  same_rows(device.size(), m, "/values/device");
  same_rows(data_index.size(), m, "/values/data_index");
  same_rows(ndim.size(), m, "/values/ndim");
  same_rows(dims_offset.size(), m, "/values/dims_offset");

  // Where a value sits, for error messages only: built when one is raised.
  struct Where {
    std::size_t event;
    const char* side;
    uint32_t k;
    std::string text() const { return "event " + std::to_string(event) + " " + side + " " + std::to_string(k); }
  };
  auto value_at = [&](std::size_t r, const Where& at) {
    Value v;
    if (kind[r] > static_cast<uint8_t>(ValueKind::kOther)) {
      site.fail(at.text() + " has the unknown value kind code " + std::to_string(kind[r]));
    }
    v.kind = static_cast<ValueKind>(kind[r]);
    v.name = name[r];
    v.text = text[r];
    v.mutated = mutated[r] != 0;
    if (v.kind == ValueKind::kTensorList) v.list_len = list_len[r];
    if (!carries_tensor(v.kind)) return v;
    TensorMeta& t = v.tensor;
    if (dtype[r] >= kNumDTypes) site.fail(at.text() + " has the unknown dtype code " + std::to_string(dtype[r]));
    t.dtype = static_cast<DType>(dtype[r]);
    t.flags = vflags[r];
    t.fingerprint = fingerprint[r];
    t.storage_id = storage_id[r];
    t.version = version[r];
    t.storage_offset = storage_offset[r];
    t.device = device[r];
    uint64_t off = dims_offset[r];
    uint64_t rank = ndim[r];
    if (off > dims.size() || 2 * rank > dims.size() - off) {
      site.fail(at.text() + " has its sizes and strides at /dims[" + std::to_string(off) + "] beyond the " +
                std::to_string(dims.size()) + " entries of /dims");
    }
    t.sizes.assign(dims.begin() + static_cast<std::ptrdiff_t>(off),
                   dims.begin() + static_cast<std::ptrdiff_t>(off + rank));
    t.strides.assign(dims.begin() + static_cast<std::ptrdiff_t>(off + rank),
                     dims.begin() + static_cast<std::ptrdiff_t>(off + 2 * rank));
    int64_t di = data_index[r];
    if (di != -1 && (di < 0 || static_cast<uint64_t>(di) >= data_count)) {
      site.fail(at.text() + " refers to /data/" + std::to_string(di) + ", but the file holds " +
                std::to_string(data_count) + " /data datasets");
    }
    t.data_index = di;
    return v;
  };

  // The rows [begin, begin + count) of one event side, with tensor lists checked.
  auto read_side = [&](std::size_t e, uint64_t begin, uint32_t count, const char* side) {
    std::vector<Value> out;
    out.reserve(count);
    for (uint32_t k = 0; k < count; ++k) {
      const Where at{e, side, k};
      out.push_back(value_at(begin + k, at));
      const Value& v = out.back();
      if (v.kind == ValueKind::kTensorList && (v.list_len < 0 || static_cast<uint32_t>(v.list_len) >= count - k)) {
        site.fail(at.text() + " is a tensor list of " + std::to_string(v.list_len) +
                  " elements that runs past the event's " + std::to_string(count) + " " + side + "s");
      }
    }
    for (uint32_t k = 0; k < count; ++k) {
      if (out[k].kind != ValueKind::kTensorList) continue;
      for (uint32_t j = k + 1; j <= k + static_cast<uint32_t>(out[k].list_len); ++j) {
        if (out[j].kind != ValueKind::kTensor && out[j].kind != ValueKind::kNone) {
          site.fail("event " + std::to_string(e) + " " + side + " " + std::to_string(j) +
                    " is an element of a tensor list but neither a tensor nor None");
        }
      }
    }
    return out;
  };

  events.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    Event e;
    e.id = id[i];
    e.stream = stream[i];
    e.seq = seq[i];
    e.thread = thread[i];
    e.step = step_col[i];
    if (phase[i] > static_cast<uint8_t>(Phase::kOther)) {
      site.fail("event " + std::to_string(i) + " has the unknown phase code " + std::to_string(phase[i]));
    }
    e.phase = static_cast<Phase>(phase[i]);
    e.op = std::move(op[i]);
    e.overload = std::move(overload[i]);
    if (schema[i] >= schemas.size()) {
      site.fail("event " + std::to_string(i) + " refers to schema " + std::to_string(schema[i]) + " of " +
                std::to_string(schemas.size()) + " in /schemas");
    }
    e.schema = schemas[schema[i]];
    e.scope = std::move(scope[i]);
    e.node = std::move(node[i]);
    e.t_start_ns = t_start[i];
    e.t_end_ns = t_end[i];
    e.flags = flags[i];
    uint64_t begin = value_begin[i];
    uint64_t count = uint64_t{n_inputs[i]} + n_outputs[i];
    if (begin > m || count > m - begin) {
      site.fail("event " + std::to_string(i) + " has its values at /values rows " + std::to_string(begin) + ".." +
                std::to_string(begin + count) + " beyond the " + std::to_string(m) + " rows of /values");
    }
    e.inputs = read_side(i, begin, n_inputs[i], "input");
    e.outputs = read_side(i, begin + n_inputs[i], n_outputs[i], "output");
    events.push_back(std::move(e));
  }
}

StepReader::StepReader(const std::string& path) : impl_(new Impl(path)) {
  try {
    Impl& im = *impl_;
    h5::silence_errors();
    im.file_size = open_checked_file(im.site, step_layout::kKind, im.file, &im.heaps);
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
    im.read_events();
  } catch (...) {
    delete impl_;
    throw;
  }
}

StepReader::~StepReader() { delete impl_; }

int StepReader::rank() const { return impl_->rank; }
int64_t StepReader::step() const { return impl_->step; }
const std::vector<Event>& StepReader::events() const { return impl_->events; }
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
  if (!h5::has_attr(site, ds.get(), "dtype")) site.fail(full + " has no dtype attribute");
  std::string dtype_text = h5::read_string_attr(site, ds.get(), "dtype");
  std::optional<DType> dtype = dtype_from_name(dtype_text);
  if (!dtype) site.fail(full + " has the unknown dtype \"" + dtype_text + "\"");
  Handle type = element_type(site, *dtype);
  Handle file_type = h5::datatype(site, H5Dget_type(ds.get()), "H5Dget_type(" + full + ")");
  if (!site.tri(H5Tequal(file_type.get(), type.get()), "H5Tequal(" + full + ")")) {
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
