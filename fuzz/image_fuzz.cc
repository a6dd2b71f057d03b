// libFuzzer target: an image file's bytes, as `trainctl predict` reads them (PNG through libpng,
// PGM/PPM parsed by trainctl). A decoded image must be as large as its header says.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl;
  auto set = data::DecodeImage(std::string(reinterpret_cast<const char*>(data), size), "fuzz.img");
  if (!set.ok()) return 0;
  if (set->count != 1 || set->pixels.size() != static_cast<size_t>(set->image_bytes()) ||
      (set->channels != 1 && set->channels != 3)) {
    std::abort();
  }
  return 0;
}
