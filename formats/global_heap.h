#pragma once
// The checks HDF5 1.10 does not make before it follows a variable-length
// string (opguard's string attributes; step files keep their other strings in
// a plain string table since format 2): its global heap collections ("GCOL",
// where the strings lie) have no checksum, and its reader trusts them. A
// flipped byte in an object size or index then makes H5Aread copy past a
// buffer or index past a table (SIGSEGV seen in H5HG_read). Readers check
// here first, so that a corrupt file gives FormatError.

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

 private:
  void parse_collection(const h5::Site& site, int fd, uint64_t address);

  uint64_t file_size_ = 0;
  uint64_t base_ = 0;  // the user block: heap addresses are relative to it
  // Absolute address of a collection -> object index -> object size.
  std::map<uint64_t, std::unordered_map<uint32_t, uint64_t>> collections_;
  // [begin, end) of the objects (strings) of the collections checked: begin -> end.
  std::map<uint64_t, uint64_t> object_data_;
};

}  // namespace opguard::formats
