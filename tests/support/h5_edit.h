#pragma once
// In-place edits of HDF5 files for tests that corrupt recordings on purpose
// (a lying attribute, one wrong row of a column). Include after doctest.

#include <hdf5.h>

#include <cstddef>
#include <string>
#include <vector>

namespace opguard::testing {

inline void set_int_attribute(const std::string& path, const char* name, int value) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  REQUIRE(a >= 0);
  REQUIRE(H5Awrite(a, H5T_NATIVE_INT, &value) >= 0);
  H5Aclose(a);
  H5Fclose(f);
}

// Rows of the 1-D dataset `name`.
inline std::size_t column_rows(const std::string& path, const char* name) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
  REQUIRE(ds >= 0);
  hid_t space = H5Dget_space(ds);
  hsize_t rows = 0;
  H5Sget_simple_extent_dims(space, &rows, nullptr);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(f);
  return static_cast<std::size_t>(rows);
}

// Rewrites row `row` of the 1-D column `name`, whose elements are T stored as `type`.
template <typename T>
void set_column_row(const std::string& path, const char* name, hid_t type, std::size_t row, T value) {
  const std::size_t rows = column_rows(path, name);
  REQUIRE(row < rows);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
  REQUIRE(ds >= 0);
  std::vector<T> values(rows);
  REQUIRE(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  values[row] = value;
  REQUIRE(H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
  H5Dclose(ds);
  REQUIRE(H5Fclose(f) >= 0);
}

}  // namespace opguard::testing
