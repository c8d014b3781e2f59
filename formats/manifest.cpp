// manifest.h5: the facts about one rank of a run (docs/FORMAT.md, "Manifest").

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "files.h"
#include "h5.h"
#include "opguard/core/error.h"
#include "opguard/formats/recording.h"
#include "step_layout.h"

namespace opguard::formats {
namespace {

// A manifest holds a few hundred short strings; anything near this is not ours.
constexpr std::size_t kMaxManifestKeys = 4096;

void write_group(const h5::Site& site, hid_t root, const char* name, const std::map<std::string, std::string>& kv) {
  h5::Handle g = h5::group(site, H5Gcreate2(root, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                           std::string("H5Gcreate2(") + name + ")");
  for (const auto& [key, value] : kv) h5::write_string_attr(site, g.get(), key, value);
}

std::map<std::string, std::string> read_group(const h5::Site& site, hid_t root, const char* name) {
  if (!site.tri(H5Lexists(root, name, H5P_DEFAULT), std::string("H5Lexists(") + name + ")")) {
    site.fail(std::string("it has no ") + name + " group");
  }
  h5::Handle g = h5::group(site, H5Gopen2(root, name, H5P_DEFAULT), std::string("H5Gopen2(") + name + ")");
  std::map<std::string, std::string> out;
  for (const std::string& key : h5::attr_names(site, g.get(), kMaxManifestKeys)) {
    out[key] = h5::read_string_attr(site, g.get(), key);
  }
  return out;
}

}  // namespace

void write_manifest(const std::string& path, const Manifest& manifest) {
  h5::silence_errors();
  const std::string tmp = path + ".tmp";
  const h5::Site site(tmp, h5::Blame::kFileSystem, "manifest");
  {
    h5::Handle file = create_file(site);
    hid_t root = file.get();
    h5::write_int_attr(site, root, "opguard_format", H5T_STD_I32LE, kFormatVersion);
    h5::write_string_attr(site, root, "kind", step_layout::kManifestKind);
    h5::write_int_attr(site, root, "rank", H5T_STD_I32LE, manifest.rank);
    h5::write_int_attr(site, root, "world_size", H5T_STD_I32LE, manifest.world_size);
    write_group(site, root, "/info", manifest.info);
    write_group(site, root, "/env", manifest.env);
    h5::finish_file(site, file);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    throw IoError("could not rename " + tmp + " to " + path + ": " + std::strerror(err));
  }
}

Manifest read_manifest(const std::string& path) {
  const h5::Site site(path, h5::Blame::kFile, "opguard manifest");
  h5::Handle file;
  open_checked_file(site, step_layout::kManifestKind, file);
  hid_t root = file.get();
  Manifest m;
  m.format_version = kFormatVersion;
  int64_t rank = h5::read_int_attr(site, root, "rank");
  int64_t world = h5::read_int_attr(site, root, "world_size");
  if (rank < 0 || world < 1 || rank >= world || world > INT32_MAX) {
    site.fail("its rank " + std::to_string(rank) + " and world_size " + std::to_string(world) + " are inconsistent");
  }
  m.rank = static_cast<int>(rank);
  m.world_size = static_cast<int>(world);
  m.info = read_group(site, root, "/info");
  m.env = read_group(site, root, "/env");
  return m;
}

}  // namespace opguard::formats
