#include "h5.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <exception>

#include "opguard/core/error.h"

// Column and tensor bytes go to disk exactly as they lie in memory, described by
// little-endian HDF5 types. A big-endian host would need byte swapping here.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "opguard_formats assumes a little-endian host");

namespace opguard::formats::h5 {
namespace {

// How many stack entries a message carries: the API call's and the innermost
// ones say the most; the middle is HDF5's internal plumbing.
constexpr std::size_t kMaxStackEntries = 6;
// Attribute strings of fixed length beyond this are not ours: refuse them.
constexpr std::size_t kMaxFixedStringAttr = std::size_t{1} << 20;

herr_t collect_entry(unsigned /*n*/, const H5E_error2_t* err, void* data) noexcept {
  try {
    auto* out = static_cast<std::vector<std::string>*>(data);
    std::string entry = err->func_name != nullptr ? err->func_name : "?";
    entry += "(): ";
    entry += err->desc != nullptr ? err->desc : "";
    char minor[128];
    if (H5Eget_msg(err->min_num, nullptr, minor, sizeof(minor)) > 0) {
      entry += " (";
      entry += minor;
      entry += ")";
    }
    out->push_back(std::move(entry));
    return 0;
  } catch (...) {
    return -1;
  }
}

struct AttrNames {
  std::vector<std::string> names;
  std::size_t max_count = 0;
  bool too_many = false;
};

herr_t collect_attr_name(hid_t /*loc*/, const char* name, const H5A_info_t* /*info*/,
                         void* data) noexcept {
  auto* out = static_cast<AttrNames*>(data);
  if (out->names.size() >= out->max_count) {
    out->too_many = true;
    return 1;  // stop iterating, successfully
  }
  try {
    out->names.emplace_back(name);
    return 0;
  } catch (...) {
    return -1;
  }
}

// HDF5's own exit handler closes every open file; with a file that could not
// be closed it crashes (see created_file in h5.h). opguard's handler, installed
// in its place before HDF5 starts, shuts the library down the same way unless
// such a file exists: then the process exits with it open, which loses nothing
// (it was being abandoned). The recorder is preloaded into training programs:
// its library's initialisers run before the program's.
std::atomic<bool> g_unclosable_file{false};

void close_library_at_exit() {
  if (!g_unclosable_file.load()) H5close();
}

[[maybe_unused]] const bool g_exit_handler_installed = [] {
  if (H5dont_atexit() < 0) return false;  // another user of this HDF5 asked first
  std::atexit(close_library_at_exit);
  return true;
}();

// Dropping a written file's handle: see created_file in h5.h.
herr_t abandon_file(hid_t file) noexcept {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) >= 0 && handle != nullptr) {
    const int fd = *static_cast<int*>(handle);
    const int scratch = ::memfd_create("opguard-abandoned-file", MFD_CLOEXEC);
    if (scratch >= 0) {
      ::dup2(scratch, fd);
      ::close(scratch);
    }
  }
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) {
    // An earlier flush failed: the file cannot be closed. It stays open.
    g_unclosable_file.store(true);
    return -1;
  }
  const herr_t closed = H5Fclose(file);
  if (closed < 0) g_unclosable_file.store(true);
  return closed;
}

}  // namespace

void silence_errors() {
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

std::string error_stack_text() {
  std::vector<std::string> entries;
  if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_entry, &entries) < 0 || entries.empty()) {
    return "HDF5 gave no error text";
  }
  std::string text;
  std::size_t skip_from = entries.size();
  std::size_t skip_to = entries.size();
  if (entries.size() > kMaxStackEntries) {
    skip_from = 2;
    skip_to = entries.size() - (kMaxStackEntries - 2);
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (i >= skip_from && i < skip_to) {
      if (i == skip_from) text += "...; ";
      continue;
    }
    text += entries[i];
    if (i + 1 < entries.size()) text += "; ";
  }
  return text;
}

hid_t Site::id(hid_t result, const std::string& call) const {
  if (result < 0) fail_call(call, error_stack_text());
  return result;
}

void Site::ok(herr_t result, const std::string& call) const {
  if (result < 0) fail_call(call, error_stack_text());
}

bool Site::tri(htri_t result, const std::string& call) const {
  if (result < 0) fail_call(call, error_stack_text());
  return result > 0;
}

void Site::fail(const std::string& detail) const {
  if (blame_ == Blame::kFile) {
    throw FormatError(path_ + " is not a valid " + what_ + ": " + detail);
  }
  throw IoError("could not write " + what_ + " " + path_ + ": " + detail +
                "; check that the directory is writable and the disk has space");
}

void Site::fail_call(const std::string& call, const std::string& hdf5_text) const {
  fail(call + " failed [HDF5: " + hdf5_text + "]");
}

Handle file(const Site& site, hid_t result, const std::string& call) {
  return Handle(site.id(result, call), H5Fclose);
}
Handle created_file(const Site& site, hid_t result, const std::string& call) {
  return Handle(site.id(result, call), abandon_file);
}

void finish_file(const Site& site, Handle& file) {
  site.ok(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "H5Fflush");  // on failure the handle abandons the file
  const herr_t closed = H5Fclose(file.release());
  if (closed < 0) g_unclosable_file.store(true);  // it freed part of the file: never touch it again
  site.ok(closed, "H5Fclose");
}

Handle group(const Site& site, hid_t result, const std::string& call) {
  return Handle(site.id(result, call), H5Gclose);
}
Handle dataset(const Site& site, hid_t result, const std::string& call) {
  return Handle(site.id(result, call), H5Dclose);
}
Handle dataspace(const Site& site, hid_t result, const std::string& call) {
  return Handle(site.id(result, call), H5Sclose);
}
Handle datatype(const Site& site, hid_t result, const std::string& call) {
  return Handle(site.id(result, call), H5Tclose);
}
Handle attribute(const Site& site, hid_t result, const std::string& call) {
  return Handle(site.id(result, call), H5Aclose);
}
Handle plist(const Site& site, hid_t result, const std::string& call) {
  return Handle(site.id(result, call), H5Pclose);
}

Handle string_type(const Site& site) {
  Handle t = copy_type(site, H5T_C_S1);
  site.ok(H5Tset_size(t.get(), H5T_VARIABLE), "H5Tset_size(string)");
  site.ok(H5Tset_cset(t.get(), H5T_CSET_UTF8), "H5Tset_cset(string)");
  return t;
}

Handle copy_type(const Site& site, hid_t predefined) {
  return datatype(site, H5Tcopy(predefined), "H5Tcopy");
}

void write_int_attr(const Site& site, hid_t loc, const char* name, hid_t type, int64_t value) {
  Handle space = dataspace(site, H5Screate(H5S_SCALAR), "H5Screate");
  std::string call = std::string("H5Acreate2(") + name + ")";
  Handle attr = attribute(site, H5Acreate2(loc, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT), call);
  site.ok(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), std::string("H5Awrite(") + name + ")");
}

void write_string_attr(const Site& site, hid_t loc, const std::string& name, const std::string& value) {
  Handle type = string_type(site);
  Handle space = dataspace(site, H5Screate(H5S_SCALAR), "H5Screate");
  write_string_attr(site, loc, name, value, type.get(), space.get());
}

void write_string_attr(const Site& site, hid_t loc, const std::string& name, const std::string& value,
                       hid_t string_type, hid_t scalar_space) {
  Handle attr = attribute(site, H5Acreate2(loc, name.c_str(), string_type, scalar_space, H5P_DEFAULT, H5P_DEFAULT),
                          "H5Acreate2(" + name + ")");
  const char* text = value.c_str();
  site.ok(H5Awrite(attr.get(), string_type, &text), "H5Awrite(" + name + ")");
}

bool has_attr(const Site& site, hid_t loc, const std::string& name) {
  return site.tri(H5Aexists(loc, name.c_str()), "H5Aexists(" + name + ")");
}

namespace {

Handle open_scalar_attr(const Site& site, hid_t loc, const std::string& name) {
  Handle attr = attribute(site, H5Aopen(loc, name.c_str(), H5P_DEFAULT), "H5Aopen(" + name + ")");
  Handle space = dataspace(site, H5Aget_space(attr.get()), "H5Aget_space(" + name + ")");
  hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n != 1) site.fail("its attribute " + name + " does not hold exactly one value");
  return attr;
}

}  // namespace

int64_t read_int_attr(const Site& site, hid_t loc, const std::string& name) {
  Handle attr = open_scalar_attr(site, loc, name);
  Handle type = datatype(site, H5Aget_type(attr.get()), "H5Aget_type(" + name + ")");
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) > 8) {
    site.fail("its attribute " + name + " is not an integer");
  }
  int64_t value = 0;
  site.ok(H5Aread(attr.get(), H5T_NATIVE_INT64, &value), "H5Aread(" + name + ")");
  return value;
}

std::string read_string_attr(const Site& site, hid_t loc, const std::string& name) {
  Handle attr = open_scalar_attr(site, loc, name);
  Handle type = datatype(site, H5Aget_type(attr.get()), "H5Aget_type(" + name + ")");
  if (H5Tget_class(type.get()) != H5T_STRING) site.fail("its attribute " + name + " is not a string");
  htri_t variable = site.tri(H5Tis_variable_str(type.get()), "H5Tis_variable_str(" + name + ")");
  if (variable) {
    Handle mem = string_type(site);
    char* text = nullptr;
    site.ok(H5Aread(attr.get(), mem.get(), &text), "H5Aread(" + name + ")");
    std::string value = text != nullptr ? text : "";
    Handle space = dataspace(site, H5Screate(H5S_SCALAR), "H5Screate");
    H5Dvlen_reclaim(mem.get(), space.get(), H5P_DEFAULT, &text);
    return value;
  }
  std::size_t size = H5Tget_size(type.get());
  if (size == 0 || size > kMaxFixedStringAttr) site.fail("its attribute " + name + " has an implausible size");
  Handle mem = copy_type(site, H5T_C_S1);
  site.ok(H5Tset_size(mem.get(), size + 1), "H5Tset_size(" + name + ")");
  std::string buffer(size + 1, '\0');
  site.ok(H5Aread(attr.get(), mem.get(), buffer.data()), "H5Aread(" + name + ")");
  buffer.resize(buffer.find('\0'));
  return buffer;
}

std::vector<std::string> attr_names(const Site& site, hid_t loc, std::size_t max_count) {
  AttrNames names;
  names.max_count = max_count;
  hsize_t index = 0;
  site.ok(H5Aiterate2(loc, H5_INDEX_NAME, H5_ITER_INC, &index, collect_attr_name, &names),
          "H5Aiterate2");
  if (names.too_many) site.fail("it has more than " + std::to_string(max_count) + " attributes in one group");
  return std::move(names.names);
}

namespace {

Handle create_column(const Site& site, hid_t loc, const char* name, hid_t type, std::size_t rows) {
  hsize_t dims[1] = {rows};
  Handle space = dataspace(site, H5Screate_simple(1, dims, nullptr), std::string("H5Screate_simple(") + name + ")");
  Handle dcpl = plist(site, H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate");
  // Every row is written right after creation, so fixed-size columns skip the
  // fill. HDF5 insists on a fill for variable-length strings.
  if (H5Tis_variable_str(type) <= 0) {
    site.ok(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  }
  return dataset(site, H5Dcreate2(loc, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                 std::string("H5Dcreate2(") + name + ")");
}

}  // namespace

void write_column(const Site& site, hid_t loc, const char* name, hid_t type, const void* data,
                  std::size_t rows) {
  Handle ds = create_column(site, loc, name, type, rows);
  if (rows == 0) return;  // nothing to write, and HDF5 refuses a null buffer
  site.ok(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), std::string("H5Dwrite(") + name + ")");
}

bool has_link(const Site& site, hid_t loc, const char* path) {
  return site.tri(H5Lexists(loc, path, H5P_DEFAULT), std::string("H5Lexists(") + path + ")");
}

std::size_t open_column(const Site& site, hid_t loc, const char* name, hid_t type,
                        std::size_t max_rows, Handle& dataset_out) {
  std::string column = name;
  if (!has_link(site, loc, name)) {
    site.fail("it has no " + column + " column");
  }
  Handle ds = dataset(site, H5Dopen2(loc, name, H5P_DEFAULT), "H5Dopen2(" + column + ")");
  Handle file_type = datatype(site, H5Dget_type(ds.get()), "H5Dget_type(" + column + ")");
  if (!site.tri(H5Tequal(file_type.get(), type), "H5Tequal(" + column + ")")) {
    site.fail("its column " + column + " does not have the element type this format gives it");
  }
  Handle space = dataspace(site, H5Dget_space(ds.get()), "H5Dget_space(" + column + ")");
  if (H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE || H5Sget_simple_extent_ndims(space.get()) != 1) {
    site.fail("its column " + column + " is not one-dimensional");
  }
  hsize_t rows = 0;
  site.ok(H5Sget_simple_extent_dims(space.get(), &rows, nullptr) < 0 ? -1 : 0,
          "H5Sget_simple_extent_dims(" + column + ")");
  if (rows > max_rows) {
    site.fail("its column " + column + " claims " + std::to_string(rows) +
              " rows, more than the file could hold");
  }
  // A fixed-size column written by us occupies exactly rows * size bytes; less
  // means the header lies or the data never got written.
  if (H5Tis_variable_str(type) <= 0 && rows > 0 &&
      H5Dget_storage_size(ds.get()) < rows * H5Tget_size(type)) {
    site.fail("its column " + column + " is shorter on disk than its header says");
  }
  dataset_out = std::move(ds);
  return static_cast<std::size_t>(rows);
}

void read_all(const Site& site, hid_t dataset, hid_t type, void* out, const char* name) {
  site.ok(H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out), std::string("H5Dread(") + name + ")");
}

}  // namespace opguard::formats::h5
