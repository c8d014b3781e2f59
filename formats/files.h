#pragma once
// Opening and creating opguard's HDF5 files, shared by every reader and writer
// in formats/ (docs/FORMAT.md, "Common root attributes").

#include <cstddef>
#include <cstdint>

#include "global_heap.h"
#include "h5.h"

namespace opguard::formats {

// Creates (truncates) site.path() as every file opguard writes is created: the
// HDF5 1.8 object format (checksummed object headers, readable by HDF5 >= 1.8
// and h5py) and a close that releases everything still open. Close it with
// h5::finish_file; dropping the handle abandons it (h5::created_file).
// `metadata_block` > 0: HDF5 allocates metadata in blocks of that many bytes
// (H5Pset_meta_block_size) instead of 2 KiB, for files of thousands of objects
// (a step file's /data): fewer, larger metadata writes, at the price of up to
// one block of slack in the file.
h5::Handle create_file(const h5::Site& site, std::size_t metadata_block = 0);

// Opens site.path() read-only after checking, in this order, that it is a
// regular file, an HDF5 file, an opguard file (root attribute opguard_format),
// of the version this build reads, with intact string heaps (global_heap.h),
// and of `kind` (root attribute kind). Each failure is one FormatError
// sentence. Returns the file's size in bytes, the bound every reader puts on
// what it will allocate.
uint64_t open_checked_file(const h5::Site& site, const char* kind, h5::Handle& file);

}  // namespace opguard::formats
