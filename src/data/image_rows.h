// Pictures from users decoded a row at a time, within bounds (inside data/: DecodeImage and
// DecodeView are built on it). A picture's rows go to a callback as they are decoded, so that a
// caller that resamples them as they come (a view) holds a few rows, not the picture: PNG (not
// interlaced), baseline JPEG and PGM/PPM stream in memory of the order of a row. What no picture
// may exceed, whatever its bytes say:
//   - at most kMaxJpegScans scans of a progressive JPEG (as djpeg's -maxscans: thousands of
//     repeated scans cost minutes at 8192 x 8192);
//   - at most kMaxDecodeBytes held by the decoder itself (a progressive JPEG's coefficients, an
//     interlaced PNG's pixels: both need the whole picture before its first row);
//   - at most kMaxDecodeTime of decoding; the picture is then abandoned as bad;
//   - sizes checked against the file's own length before anything is allocated (a 17-byte PPM
//     header promising 8192 x 8192 allocates nothing);
//   - libjpeg's and libpng's warnings (a truncated or corrupt stream, decoded as grey or not at
//     all) count as errors: the picture is bad, not half a picture.
// Errors are kInvalidArgument and name the file.
#pragma once

#include <chrono>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
// clang-format off: jpeglib.h needs stdio.h's FILE first.
#include <jpeglib.h>
// clang-format on

#include "common/status.h"

namespace trainctl::data {

inline constexpr int kMaxJpegScans = 256;
inline constexpr int64_t kMaxDecodeBytes = int64_t{96} << 20;
inline constexpr std::chrono::seconds kMaxDecodeTime{10};
inline constexpr int64_t kMaxPicturePixels = int64_t{1} << 26;  // 8192 x 8192
inline constexpr int64_t kMaxPictureSide = 65536;

// What a picture is before its rows come: `channels` 1 (grey) or 3 (RGB), interleaved.
struct PictureSize {
  int cols = 0, rows = 0, channels = 0;
};

// Called once with the size (an error from it ends the decode), then once per row in order, 0 to
// rows - 1, with cols * channels bytes.
using OnPictureSize = std::function<Status(const PictureSize&)>;
using OnPictureRow = std::function<void(int y, const uint8_t* row)>;

// A PNG, PGM/PPM or JPEG (grey or colour; CMYK converted as PIL converts it) row by row.
Status DecodeRows(std::string_view bytes, const std::string& path, const OnPictureSize& size, const OnPictureRow& row);

// Whether the bytes start like a JPEG (FF D8 FF).
bool IsJpeg(std::string_view bytes);

// libjpeg's decompressor with the bounds above, for a caller that drives it itself (a scaled,
// cropped view). Usage, in one function:
//   JpegSession s;                       // before setjmp, as every object with a destructor
//   if (setjmp(s.jump)) return s.Failed(path);
//   s.Start(bytes);                      // then jpeg_read_header(&s.cinfo, TRUE) and so on
// An error, a warning, too many scans, too much memory or time jump back to the setjmp.
struct JpegSession {
  JpegSession();
  ~JpegSession();
  JpegSession(const JpegSession&) = delete;
  JpegSession& operator=(const JpegSession&) = delete;

  void Start(std::string_view bytes);
  // jpeg_read_header, and its size checked (PictureSizeOk): an error naming `path` when it is not.
  Status ReadHeader(const std::string& path);
  // Whether the picture is stored as CMYK (or YCCK): decode it as JCS_CMYK, then FromCmyk.
  bool Cmyk() const { return cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK; }
  Status Failed(const std::string& path) const;
  // PIL's CMYK to RGB (or luma for one channel) of `n` pixels in place: 4 bytes each in, `channels`
  // out; Photoshop's (an Adobe marker) store them inverted.
  void FromCmyk(uint8_t* pixels, int64_t n, int channels) const;

  jpeg_decompress_struct cinfo;
  struct Error {
    jpeg_error_mgr mgr;  // first: libjpeg's pointer to it is a pointer to this
    std::jmp_buf* jump;
    char message[JMSG_LENGTH_MAX + 64];
  } err;
  struct Progress {
    jpeg_progress_mgr mgr;  // first, as above
    std::chrono::steady_clock::time_point deadline;
  } progress;
  std::jmp_buf jump;
  bool created = false;
};

// A PGM/PPM header field at `*at` in `bytes`: the number after whitespace and '#' comments (at
// most 10 digits); false when there is none. Moves `*at` past it.
bool PnmField(std::string_view bytes, size_t* at, int64_t* out);

// ITU-R BT.601 luma, as PIL's convert('L') computes it.
inline uint8_t Luma(int r, int g, int b) { return static_cast<uint8_t>((299 * r + 587 * g + 114 * b + 500) / 1000); }

// PNM and JPEG headers' sizes checked as DecodeRows checks them: both sides at least 1, each at
// most kMaxPictureSide, their product at most kMaxPicturePixels.
bool PictureSizeOk(int64_t cols, int64_t rows);

}  // namespace trainctl::data
