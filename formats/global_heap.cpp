#include "global_heap.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace opguard::formats {
namespace {

// On-disk layout, HDF5 file format spec III.E, for files with 8-byte offsets
// and lengths (the only ones opguard writes or reads).
constexpr char kSignature[] = {'G', 'C', 'O', 'L', 1};  // magic and version 1
constexpr uint64_t kCollectionHeader = 16;  // magic, version, 3 reserved, u64 collection size
constexpr uint64_t kObjectHeader = 16;      // u16 index, u16 references, 4 reserved, u64 size
constexpr uint64_t kMinCollection = 4096;   // H5HG_MINSIZE

uint64_t le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Reads [offset, offset + n) or fails: the caller checked it is inside the file.
std::vector<uint8_t> read_at(const h5::Site& site, int fd, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> buf(n);
  uint64_t done = 0;
  while (done < n) {
    ssize_t got = ::pread(fd, buf.data() + done, n - done, static_cast<off_t>(offset + done));
    if (got <= 0) site.fail("it could not be read at byte " + std::to_string(offset + done));
    done += static_cast<uint64_t>(got);
  }
  return buf;
}

class Fd {
 public:
  Fd(const h5::Site& site) : fd_(::open(site.path().c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) site.fail("it cannot be opened for reading");
  }
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct Extents {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) of dataset raw data
};

herr_t collect_extent(hid_t obj, const char* name, const H5O_info_t* info, void* data) noexcept {
  if (info->type != H5O_TYPE_DATASET) return 0;
  hid_t ds = H5Dopen2(obj, name, H5P_DEFAULT);
  if (ds < 0) return -1;
  haddr_t offset = H5Dget_offset(ds);
  hsize_t size = H5Dget_storage_size(ds);
  H5Dclose(ds);
  if (offset != HADDR_UNDEF && size > 0) {
    try {
      static_cast<Extents*>(data)->ranges.emplace_back(offset, offset + size);
    } catch (...) {
      return -1;
    }
  }
  return 0;
}

}  // namespace

GlobalHeaps::GlobalHeaps(const h5::Site& site, hid_t file, uint64_t file_size) : file_size_(file_size) {
  h5::Handle fcpl = h5::plist(site, H5Fget_create_plist(file), "H5Fget_create_plist");
  std::size_t sizeof_addr = 0, sizeof_size = 0;
  site.ok(H5Pget_sizes(fcpl.get(), &sizeof_addr, &sizeof_size), "H5Pget_sizes");
  if (sizeof_addr != 8 || sizeof_size != 8) site.fail("it does not use 8-byte offsets and lengths");
  hsize_t userblock = 0;
  site.ok(H5Pget_userblock(fcpl.get(), &userblock), "H5Pget_userblock");
  base_ = userblock;

  Extents extents;
  site.ok(H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_NATIVE, collect_extent, &extents, H5O_INFO_BASIC), "H5Ovisit2");
  std::sort(extents.ranges.begin(), extents.ranges.end());
  // The gaps between raw data are metadata: every collection starts in one.
  Fd fd(site);
  uint64_t pos = 0;
  auto scan_gap = [&](uint64_t begin, uint64_t end) {
    if (end <= begin) return;
    const std::vector<uint8_t> gap = read_at(site, fd.get(), begin, end - begin);
    const auto* first = gap.data();
    const auto* last = gap.data() + gap.size();
    for (const auto* p = std::search(first, last, kSignature, kSignature + sizeof(kSignature)); p != last;
         p = std::search(p + 1, last, kSignature, kSignature + sizeof(kSignature))) {
      const uint64_t address = begin + static_cast<uint64_t>(p - first);
      if (collections_.count(address) > 0) continue;
      // The signature inside a string of a collection checked before is that
      // string's content. Anywhere else (a collection's header or free space
      // included) it may be a collection a string points to, and HDF5 loops
      // forever on some malformed ones (a free-space entry of size 0): it is
      // checked. Skipping whole collections instead let a forged collection
      // hide a malformed real one inside its free space (a fuzzer's input).
      const auto inside = object_data_.upper_bound(address);
      if (inside != object_data_.begin() && address < std::prev(inside)->second) continue;
      parse_collection(site, fd.get(), address);
    }
  };
  for (const auto& [begin, end] : extents.ranges) {
    scan_gap(pos, std::min(begin, file_size_));
    pos = std::max(pos, end);
  }
  scan_gap(pos, file_size_);
}

void GlobalHeaps::parse_collection(const h5::Site& site, int fd, uint64_t address) {
  const std::string where = "its string heap at byte " + std::to_string(address);
  if (address > file_size_ || file_size_ - address < kCollectionHeader) site.fail(where + " runs past the end of the file");
  const std::vector<uint8_t> head = read_at(site, fd, address, kCollectionHeader);
  const uint64_t size = le(head.data() + 8, 8);
  if (size < kMinCollection || size > file_size_ - address) {
    site.fail(where + " claims " + std::to_string(size) + " bytes, which the file cannot hold");
  }
  const std::vector<uint8_t> body = read_at(site, fd, address, size);
  std::unordered_map<uint32_t, uint64_t> objects;
  // The walk of H5HG's deserializer, with the bounds checks it leaves to asserts.
  uint64_t p = kCollectionHeader;
  while (p < size) {
    if (size - p < kObjectHeader) break;  // a tail too small for an object: free space
    const uint32_t index = static_cast<uint32_t>(le(&body[p], 2));
    const uint64_t object_size = le(&body[p + 8], 8);
    uint64_t need = 0;
    if (index == 0) {
      need = object_size;  // free space: its size includes its header
      if (need < kObjectHeader || need > size - p) site.fail(where + " has a free-space entry of the wrong size");
    } else {
      if (object_size > size - p - kObjectHeader) site.fail(where + " has an object larger than the heap");
      need = kObjectHeader + ((object_size + 7) & ~uint64_t{7});
      if (need > size - p) site.fail(where + " has an object larger than the heap");
      if (!objects.emplace(index, object_size).second) site.fail(where + " has object " + std::to_string(index) + " twice");
      if (object_size > 0) object_data_.emplace(address + p + kObjectHeader, address + p + kObjectHeader + object_size);
    }
    p += need;
  }
  collections_.emplace(address, std::move(objects));
}

}  // namespace opguard::formats
