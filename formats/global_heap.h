#pragma once
// The checks HDF5 1.10 does not make before it follows a variable-length
// string: neither its global heap collections ("GCOL", where the strings lie)
// nor the raw data of a string column (a heap id per row) has a checksum, and
// its reader trusts both. A flipped byte in an object size, a heap index or a
// collection address then makes H5Dread / H5Aread copy past a buffer or index
// past a table (SIGSEGV seen in H5HG_read). Readers check here first, so that
// a corrupt file gives FormatError.

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "h5.h"

namespace opguard::formats {

class GlobalHeaps {
 public:
  // Finds every global heap collection of the open `file` (outside the raw
  // data of its datasets) and checks that HDF5 can parse each within its
  // bounds. Throws FormatError through `site`.
  GlobalHeaps(const h5::Site& site, hid_t file, uint64_t file_size);
  GlobalHeaps() = default;

  // Checks every heap id of the variable-length string column `name` under
  // `loc`: in a collection found above, naming an object there whose size is
  // the string length the id claims. Call before reading the column.
  void check_string_column(const h5::Site& site, hid_t loc, const char* name) const;

 private:
  void parse_collection(const h5::Site& site, int fd, uint64_t address);

  uint64_t file_size_ = 0;
  uint64_t base_ = 0;  // the user block: heap addresses are relative to it
  // Absolute address of a collection -> object index -> object size.
  std::map<uint64_t, std::unordered_map<uint32_t, uint64_t>> collections_;
};

}  // namespace opguard::formats
