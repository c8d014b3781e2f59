#pragma once
// A thin RAII and error-checking layer over the HDF5 C calls opguard uses.
// Private to opguard_formats: nothing outside formats/ sees <hdf5.h>.
//
// Every call goes through a Site, which knows which file the calls are about and
// whom to blame when one fails: a reader blames the file (FormatError: it is
// corrupt, truncated or foreign), a writer blames the file system (IoError: the
// disk is full or the directory unwritable). The message names the call and
// carries HDF5's own error stack text.

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "opguard/core/error.h"
#include "opguard/formats/recording.h"

namespace opguard::formats::h5 {

// Turns off HDF5's automatic printing of its error stack to stderr (no library
// prints to the terminal). The setting is per thread in a thread-safe HDF5
// build, so every entry point calls this; it is a no-op after the first call on
// a thread.
void silence_errors();

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(other.closer_) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = std::exchange(other.id_, H5I_INVALID_HID);
      closer_ = other.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes and ignores failure: for destructors and error paths.
  void reset() noexcept {
    if (id_ >= 0 && closer_ != nullptr) closer_(id_);
    id_ = H5I_INVALID_HID;
  }
  // Gives up ownership (the caller closes, checking the result).
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

enum class Blame {
  kFile,        // reading: throw FormatError
  kFileSystem,  // writing: throw IoError
};

class Site {
 public:
  // `what` names the kind of file in messages: "opguard step file".
  Site(std::string path, Blame blame, std::string what)
      : path_(std::move(path)), blame_(blame), what_(std::move(what)) {}

  const std::string& path() const { return path_; }

  // Each throws if the HDF5 call it wraps failed (negative result); `call` names
  // the call and its object, e.g. "H5Dopen2(/events/op)".
  hid_t id(hid_t result, const std::string& call) const;
  void ok(herr_t result, const std::string& call) const;
  bool tri(htri_t result, const std::string& call) const;

  // Throws the blamed error type with "PATH ...: detail". Used for our own
  // validation failures as well as HDF5's.
  [[noreturn]] void fail(const std::string& detail) const;

 private:
  [[noreturn]] void fail_call(const std::string& call, const std::string& hdf5_text) const;

  std::string path_;
  Blame blame_;
  std::string what_;
};

// HDF5's current error stack of this thread as one line, innermost cause last.
std::string error_stack_text();

// Owned handles for what Site::id returns.
Handle file(const Site& site, hid_t result, const std::string& call);

// Files opguard writes. HDF5 1.10 cannot close a file whose flush failed (a
// full disk): its metadata cache stays half-flushed, every later flush or
// close fails, and each failed close frees part of the file, so HDF5's exit
// handler, which closes every open file, then crashes the process. A written
// file is therefore closed in one of two ways:
// - finish_file flushes and closes it, throwing the blamed error on failure;
// - dropping the handle without finish_file (an error path) abandons it: its
//   descriptor is pointed at an empty memory file first, so that the flush and
//   close cannot fail; the caller removes what reached the disk.
// A file that still cannot be closed is left open, and HDF5 is then not shut
// down at exit (see close_library_at_exit in h5.cpp).
Handle created_file(const Site& site, hid_t result, const std::string& call);
void finish_file(const Site& site, Handle& file);
Handle group(const Site& site, hid_t result, const std::string& call);
Handle dataset(const Site& site, hid_t result, const std::string& call);
Handle dataspace(const Site& site, hid_t result, const std::string& call);
Handle datatype(const Site& site, hid_t result, const std::string& call);
Handle attribute(const Site& site, hid_t result, const std::string& call);
Handle plist(const Site& site, hid_t result, const std::string& call);

// A variable-length UTF-8 string type (how every opguard string is stored).
Handle string_type(const Site& site);
// A copy of a predefined type (H5T_STD_U64LE, ...) that the handle may close.
Handle copy_type(const Site& site, hid_t predefined);

// Attributes on `loc` (a file or group). Integers are stored as `type`
// (H5T_STD_I32LE / H5T_STD_I64LE); strings as variable-length UTF-8.
void write_int_attr(const Site& site, hid_t loc, const char* name, hid_t type, int64_t value);
void write_string_attr(const Site& site, hid_t loc, const std::string& name, const std::string& value);
// The same with the string type and a scalar dataspace given (a writer that
// adds one attribute per dataset keeps them instead of building them each time).
void write_string_attr(const Site& site, hid_t loc, const std::string& name, const std::string& value,
                       hid_t string_type, hid_t scalar_space);
bool has_attr(const Site& site, hid_t loc, const std::string& name);
// Whether `path` (a dataset or group below loc) exists.
bool has_link(const Site& site, hid_t loc, const char* path);
// Reads an integer attribute stored as any HDF5 integer type of at most 8 bytes
// (validating that its class is integer and its dataspace holds one element).
int64_t read_int_attr(const Site& site, hid_t loc, const std::string& name);
std::string read_string_attr(const Site& site, hid_t loc, const std::string& name);
// Names of all attributes of `loc`, in name order; at most `max_count`.
std::vector<std::string> attr_names(const Site& site, hid_t loc, std::size_t max_count);

// One-dimensional columns. `type` is both the file type and the memory type
// (little-endian standard types: this is an x86-64 / aarch64 little-endian
// library, see the static_assert in h5.cpp).
void write_column(const Site& site, hid_t loc, const char* name, hid_t type, const void* data,
                  std::size_t rows);

// Reads a 1-D column whose file type must equal `type` exactly, refusing more
// than `max_rows` rows (a lying header must not make us allocate).
template <typename T>
Column<T> read_column(const Site& site, hid_t loc, const char* name, hid_t type, std::size_t max_rows);

// Implementation detail of read_column: checks the column and returns its row count.
std::size_t open_column(const Site& site, hid_t loc, const char* name, hid_t type,
                        std::size_t max_rows, Handle& dataset_out);
void read_all(const Site& site, hid_t dataset, hid_t type, void* out, const char* name);

template <typename T>
Column<T> read_column(const Site& site, hid_t loc, const char* name, hid_t type, std::size_t max_rows) {
  OPGUARD_CHECK(H5Tget_size(type) == sizeof(T));
  Handle ds;
  std::size_t rows = open_column(site, loc, name, type, max_rows, ds);
  Column<T> out(rows);
  if (rows > 0) read_all(site, ds.get(), type, out.data(), name);
  return out;
}

}  // namespace opguard::formats::h5
