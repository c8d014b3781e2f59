#pragma once
// Names and limits shared by the step writer and reader (docs/FORMAT.md, "Step
// files", is the specification of each).

#include <cstddef>
#include <cstdint>

namespace opguard::formats::step_layout {

inline constexpr const char* kKind = "opguard-step";
inline constexpr const char* kManifestKind = "opguard-manifest";

// The tensor dimensions a /data dataset can have (HDF5's H5S_MAX_RANK).
inline constexpr int kMaxDataRank = 32;
// ndim is stored as u8.
inline constexpr std::size_t kMaxValueRank = 255;

}  // namespace opguard::formats::step_layout
