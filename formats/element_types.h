#pragma once
// The HDF5 element type of each opguard DType in /data/<n> datasets. The same
// type is used in the file and in memory, so HDF5 never converts: bytes go to
// disk and come back exactly as given (NaN payloads, signed zeros, denormals).

#include <optional>

#include "h5.h"
#include "opguard/core/dtype.h"

namespace opguard::formats {

// A new type handle for `dtype` (docs/FORMAT.md, "Element types").
h5::Handle element_type(const h5::Site& site, DType dtype);

// Whether a step file's /data/<n> carries the `dtype` attribute (format 3):
// where the HDF5 type does not name the dtype by itself (bool and the float8s
// are stored as u8 bytes) and for the 16-bit floats, whose HDF5 types other
// tools do not name. Every other dtype is told by its HDF5 type alone, and a
// per-dataset attribute cost the writer about as much as the dataset.
bool needs_dtype_attribute(DType dtype);

// The dtype, among those stored without the attribute, whose element type is
// `file_type`; nullopt if none is.
std::optional<DType> dtype_of_element_type(const h5::Site& site, hid_t file_type);

}  // namespace opguard::formats
