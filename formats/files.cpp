#include "files.h"

#include <sys/stat.h>

#include <string>
#include <utility>

#include "opguard/formats/recording.h"

namespace opguard::formats {

h5::Handle create_file(const h5::Site& site, std::size_t metadata_block) {
  h5::Handle fapl = h5::plist(site, H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate(file access)");
  site.ok(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18), "H5Pset_libver_bounds");
  site.ok(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), "H5Pset_fclose_degree");
  if (metadata_block > 0)
    site.ok(H5Pset_meta_block_size(fapl.get(), metadata_block), "H5Pset_meta_block_size");
  return h5::created_file(site, H5Fcreate(site.path().c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), "H5Fcreate");
}

uint64_t open_checked_file(const h5::Site& site, const char* kind, h5::Handle& file) {
  h5::silence_errors();
  struct stat st {};
  if (::stat(site.path().c_str(), &st) != 0) site.fail("it does not exist or cannot be read");
  if (!S_ISREG(st.st_mode)) site.fail("it is not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  htri_t is_hdf5 = H5Fis_hdf5(site.path().c_str());
  if (is_hdf5 <= 0) site.fail("it is not an HDF5 file (truncated, corrupt or of another kind)");
  h5::Handle fapl = h5::plist(site, H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate(file access)");
  site.ok(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG), "H5Pset_fclose_degree");
  file = h5::file(site, H5Fopen(site.path().c_str(), H5F_ACC_RDONLY, fapl.get()), "H5Fopen");
  hid_t root = file.get();
  if (!h5::has_attr(site, root, "opguard_format")) {
    site.fail("it is an HDF5 file but not one opguard wrote (no opguard_format attribute)");
  }
  int64_t version = h5::read_int_attr(site, root, "opguard_format");
  if (version != kFormatVersion) {
    site.fail("it is in opguard format version " + std::to_string(version) + ", and this opguard reads version " +
              std::to_string(kFormatVersion));
  }
  // Before the first string is read (kind is one).
  const GlobalHeaps checked(site, root, size);  // throws where HDF5 would misread a heap
  if (!h5::has_attr(site, root, "kind")) site.fail("it has no kind attribute");
  std::string actual = h5::read_string_attr(site, root, "kind");
  if (actual != kind) site.fail("it is an \"" + actual + "\" file where an \"" + kind + "\" file was expected");
  return size;
}

}  // namespace opguard::formats
