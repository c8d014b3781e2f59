#include "opguard/formats/tensor_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "element_types.h"
#include "files.h"
#include "h5.h"
#include "opguard/formats/recording.h"

namespace opguard::formats {
namespace {

constexpr const char* kKind = "tensors";
constexpr int kMaxDims = 64;
constexpr std::size_t kMaxTensors = 100000;

h5::Handle file_type(const h5::Site& site, DType dtype) {
  if (dtype == DType::kBFloat16) return h5::copy_type(site, H5T_STD_U16LE);
  return element_type(site, dtype);
}

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

void write_int64_array_attr(const h5::Site& site, hid_t loc, const char* name, const std::vector<int64_t>& values) {
  const hsize_t n = values.size();
  h5::Handle space = h5::dataspace(site, H5Screate_simple(1, &n, nullptr), "H5Screate_simple(attribute)");
  h5::Handle attr = h5::attribute(
      site, H5Acreate2(loc, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), std::string("H5Acreate2(") + name + ")");
  if (n > 0) site.ok(H5Awrite(attr.get(), H5T_STD_I64LE, values.data()), std::string("H5Awrite(") + name + ")");
}

std::vector<int64_t> read_int64_array_attr(const h5::Site& site, hid_t loc, const char* name) {
  h5::Handle attr = h5::attribute(site, H5Aopen(loc, name, H5P_DEFAULT), std::string("H5Aopen(") + name + ")");
  h5::Handle space = h5::dataspace(site, H5Aget_space(attr.get()), "H5Aget_space");
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0 || n > kMaxDims) site.fail(std::string("attribute ") + name + " has a bad length");
  std::vector<int64_t> values(static_cast<std::size_t>(n));
  if (n > 0) site.ok(H5Aread(attr.get(), H5T_NATIVE_INT64, values.data()), std::string("H5Aread(") + name + ")");
  return values;
}

}  // namespace

int64_t StoredTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

void write_tensor_file(const std::string& path, const std::vector<StoredTensor>& tensors) {
  h5::silence_errors();
  for (const auto& t : tensors) {
    if (!valid_name(t.name)) throw UsageError("'" + t.name + "' is not a tensor dataset name ([A-Za-z0-9_]+)");
    if (t.bytes.size() != static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype))
      throw UsageError("tensor " + t.name + " has " + std::to_string(t.bytes.size()) + " bytes for its shape");
  }
  // Claim the name first with O_EXCL|O_NOFOLLOW: HDF5's own create would follow
  // a symlink planted there.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    throw IoError("cannot create " + path + ": " + std::strerror(err));
  }
  ::close(fd);
  const h5::Site site(path, h5::Blame::kFileSystem, "tensor file");
  h5::Handle file = create_file(site);
  hid_t root = file.get();
  h5::write_int_attr(site, root, "opguard_format", H5T_STD_I32LE, kFormatVersion);
  h5::write_string_attr(site, root, "kind", kKind);
  for (const auto& t : tensors) {
    std::vector<hsize_t> dims(t.sizes.begin(), t.sizes.end());
    h5::Handle space = dims.empty()
                           ? h5::dataspace(site, H5Screate(H5S_SCALAR), "H5Screate(scalar)")
                           : h5::dataspace(site, H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                           "H5Screate_simple(" + t.name + ")");
    h5::Handle type = file_type(site, t.dtype);
    h5::Handle ds = h5::dataset(
        site, H5Dcreate2(root, t.name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
        "H5Dcreate2(" + t.name + ")");
    if (!t.bytes.empty())
      site.ok(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.bytes.data()), "H5Dwrite(" + t.name + ")");
    h5::write_string_attr(site, ds.get(), "dtype", std::string(dtype_name(t.dtype)));
    write_int64_array_attr(site, ds.get(), "strides", t.strides);
    h5::write_int_attr(site, ds.get(), "storage_offset", H5T_STD_I64LE, t.storage_offset);
  }
  h5::finish_file(site, file);
}

void write_new_file(const std::string& path, const std::string& text, unsigned mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) {
    const int err = errno;
    throw IoError("cannot create " + path + ": " + std::strerror(err));
  }
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw IoError("cannot write " + path + ": " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    throw IoError("cannot write " + path + ": " + std::strerror(err));
  }
}

std::vector<StoredTensor> read_tensor_file(const std::string& path, uint64_t max_bytes) {
  const h5::Site site(path, h5::Blame::kFile, "tensor file");
  h5::Handle file;
  const uint64_t file_size = open_checked_file(site, kKind, file);
  hid_t root = file.get();
  H5G_info_t info{};
  site.ok(H5Gget_info(root, &info), "H5Gget_info");
  if (info.nlinks > kMaxTensors) site.fail("it holds too many datasets");
  std::vector<StoredTensor> out;
  uint64_t total = 0;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[128] = {};
    const ssize_t len = H5Lget_name_by_idx(root, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof(name), H5P_DEFAULT);
    if (len <= 0 || len >= static_cast<ssize_t>(sizeof(name)) || !valid_name(name))
      site.fail("it holds a dataset whose name is not [A-Za-z0-9_]+");
    StoredTensor t;
    t.name = name;
    h5::Handle ds = h5::dataset(site, H5Dopen2(root, name, H5P_DEFAULT), "H5Dopen2(" + t.name + ")");
    const std::string dname = h5::read_string_attr(site, ds.get(), "dtype");
    const auto dtype = dtype_from_name(dname);
    if (!dtype) site.fail("dataset " + t.name + " has the unknown dtype '" + dname + "'");
    t.dtype = *dtype;
    h5::Handle space = h5::dataspace(site, H5Dget_space(ds.get()), "H5Dget_space(" + t.name + ")");
    const int ndim = H5Sget_simple_extent_ndims(space.get());
    if (ndim < 0 || ndim > kMaxDims) site.fail("dataset " + t.name + " has a bad rank");
    std::vector<hsize_t> dims(static_cast<std::size_t>(ndim));
    if (ndim > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    t.sizes.assign(dims.begin(), dims.end());
    t.strides = read_int64_array_attr(site, ds.get(), "strides");
    t.storage_offset = h5::read_int_attr(site, ds.get(), "storage_offset");
    uint64_t nbytes = dtype_size(t.dtype);
    for (hsize_t d : dims)
      if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes)) site.fail("dataset " + t.name + " is too large");
    total += nbytes;
    if (total > max_bytes || total > file_size) site.fail("it claims more bytes than it holds");
    h5::Handle type = file_type(site, t.dtype);
    h5::Handle stored = h5::datatype(site, H5Dget_type(ds.get()), "H5Dget_type(" + t.name + ")");
    if (H5Tequal(stored.get(), type.get()) <= 0)
      site.fail("dataset " + t.name + " is not stored as " + dname + " (another element type)");
    t.bytes.resize(nbytes);
    if (nbytes > 0)
      site.ok(H5Dread(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.bytes.data()), "H5Dread(" + t.name + ")");
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace opguard::formats
