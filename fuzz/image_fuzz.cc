// libFuzzer target: an image file's bytes, as `trainctl predict` reads them and as the streamed
// pipeline decodes them into a view, through the bounded row decoders (data/image_rows.h: PNG by
// libpng, JPEG by libjpeg-turbo with its scan, memory and time limits, PGM/PPM parsed by trainctl;
// a view at a DCT scale, cropped, resampled as rows come). A decoded image must be as large as its
// header says; a view writes exactly its bytes (AddressSanitizer watches the rest).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_view.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainctl;
  if (size < 1) return 0;
  // The first byte picks the view: channels, size, centre or random crop; the rest is the file.
  const uint8_t pick = data[0];
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  data::ViewOptions o;
  o.channels = pick & 1 ? 3 : 1;
  o.rows = 1 + (pick >> 1 & 7) * 9;
  o.cols = 1 + (pick >> 4 & 7) * 7;
  o.crop_pct = pick & 0x80 ? 0.875 : 1.0;
  o.random_resized_crop = pick & 0x40;
  std::vector<uint8_t> out(static_cast<size_t>(o.channels) * o.rows * o.cols);
  (void)data::DecodeView(bytes, "fuzz.img", o, /*draw=*/size * 0x9E3779B97F4A7C15ull, out.data());

  auto set = data::DecodeImage(bytes, "fuzz.img");
  if (!set.ok()) return 0;
  if (set->count != 1 || set->pixels.size() != static_cast<size_t>(set->image_bytes()) ||
      (set->channels != 1 && set->channels != 3)) {
    std::abort();
  }
  return 0;
}
