#pragma once
// The HDF5 element type of each opguard DType in /data/<n> datasets. The same
// type is used in the file and in memory, so HDF5 never converts: bytes go to
// disk and come back exactly as given (NaN payloads, signed zeros, denormals).

#include "h5.h"
#include "opguard/core/dtype.h"

namespace opguard::formats {

// A new type handle for `dtype` (docs/FORMAT.md, "Element types").
h5::Handle element_type(const h5::Site& site, DType dtype);

}  // namespace opguard::formats
