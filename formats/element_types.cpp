#include "element_types.h"

#include "opguard/core/error.h"

namespace opguard::formats {
namespace {

// IEEE-style binary float narrower than HDF5's predefined ones, built from
// float32: sign bit 15, exponent at bit `mantissa_bits`, implied leading one.
h5::Handle narrow_float(const h5::Site& site, std::size_t exponent_bits, std::size_t mantissa_bits,
                        std::size_t exponent_bias) {
  h5::Handle t = h5::copy_type(site, H5T_IEEE_F32LE);
  site.ok(H5Tset_fields(t.get(), 15, mantissa_bits, exponent_bits, 0, mantissa_bits), "H5Tset_fields");
  site.ok(H5Tset_precision(t.get(), 16), "H5Tset_precision");
  site.ok(H5Tset_size(t.get(), 2), "H5Tset_size");
  site.ok(H5Tset_ebias(t.get(), exponent_bias), "H5Tset_ebias");
  return t;
}

// {r, i}: the member names h5py maps to numpy complex.
h5::Handle complex_type(const h5::Site& site, hid_t part, std::size_t part_size) {
  h5::Handle t = h5::datatype(site, H5Tcreate(H5T_COMPOUND, 2 * part_size), "H5Tcreate(complex)");
  site.ok(H5Tinsert(t.get(), "r", 0, part), "H5Tinsert(r)");
  site.ok(H5Tinsert(t.get(), "i", part_size, part), "H5Tinsert(i)");
  return t;
}

}  // namespace

h5::Handle element_type(const h5::Site& site, DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return h5::copy_type(site, H5T_IEEE_F64LE);
    case DType::kFloat32: return h5::copy_type(site, H5T_IEEE_F32LE);
    case DType::kFloat16: return narrow_float(site, 5, 10, 15);
    case DType::kBFloat16: return narrow_float(site, 8, 7, 127);
    case DType::kInt8: return h5::copy_type(site, H5T_STD_I8LE);
    case DType::kInt16: return h5::copy_type(site, H5T_STD_I16LE);
    case DType::kInt32: return h5::copy_type(site, H5T_STD_I32LE);
    case DType::kInt64: return h5::copy_type(site, H5T_STD_I64LE);
    case DType::kUInt8: return h5::copy_type(site, H5T_STD_U8LE);
    case DType::kUInt16: return h5::copy_type(site, H5T_STD_U16LE);
    case DType::kUInt32: return h5::copy_type(site, H5T_STD_U32LE);
    case DType::kUInt64: return h5::copy_type(site, H5T_STD_U64LE);
    // Raw bytes; the dtype attribute says how to read them.
    case DType::kBool:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return h5::copy_type(site, H5T_STD_U8LE);
    case DType::kComplex64: return complex_type(site, H5T_IEEE_F32LE, 4);
    case DType::kComplex128: return complex_type(site, H5T_IEEE_F64LE, 8);
  }
  OPGUARD_CHECK(false && "unknown DType");
  return {};
}

bool needs_dtype_attribute(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kBool:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return true;
    default: return false;
  }
}

std::optional<DType> dtype_of_element_type(const h5::Site& site, hid_t file_type) {
  for (int d = 0; d < kNumDTypes; ++d) {
    const auto dtype = static_cast<DType>(d);
    if (needs_dtype_attribute(dtype)) continue;
    const h5::Handle type = element_type(site, dtype);
    if (site.tri(H5Tequal(file_type, type.get()), "H5Tequal")) return dtype;
  }
  return std::nullopt;
}

}  // namespace opguard::formats
