// What an image file's header declares, read without decoding its pixels: so that an image of
// the wrong size is refused before its pixels are allocated (an 8192x8192 PNG of zeros is 196 KB
// on disk and 200 MB decoded).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace trainctl::data {

struct ImageHeader {
  int64_t count = 1;  // images in the file (an idx3 file holds many)
  int64_t rows = 0, cols = 0;
};

// PNG, JPEG, PGM/PPM, or an idx3 image file (plain or gzipped): its header's sizes.
Result<ImageHeader> ReadImageHeader(const std::string& path);

}  // namespace trainctl::data
