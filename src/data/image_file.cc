// One image from a file, for `trainctl predict` and image folders, through the bounded row
// decoders of image_rows.h (PNG by libpng, JPEG by libjpeg-turbo, PGM/PPM parsed there), and the
// sizes a header declares read without decoding.
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>

#include "common/fs.h"
#include "data/dataset.h"
#include "data/image_header.h"
#include "data/image_rows.h"

namespace trainctl::data {

namespace {

constexpr int64_t kMaxFileBytes = int64_t{256} << 20;

Status Bad(const std::string& path, const std::string& what) { return InvalidArgument(path + ": " + what); }

// An idx1 file (Fashion-MNIST's *-labels-idx1-ubyte) where pictures were expected.
constexpr const char* kLabelsNotImages =
    "an idx1 labels file, not images: give the images file itself (the *-images-idx3-ubyte beside it)";

}  // namespace

Result<ImageSet> ReadImageFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path, kMaxFileBytes));
  return DecodeImage(bytes, path);
}

Result<ImageSet> DecodeImage(const std::string& bytes, const std::string& path) {
  // The picture's rows, interleaved, into its planes (C, H, W).
  ImageSet set;
  int64_t plane = 0;
  RETURN_IF_ERROR(DecodeRows(
      bytes, path,
      [&](const PictureSize& size) {
        set.count = 1;
        set.channels = size.channels;
        set.rows = size.rows;
        set.cols = size.cols;
        set.labels = {0};
        plane = int64_t{size.rows} * size.cols;
        set.pixels.resize(static_cast<size_t>(plane * size.channels));
        return Status::Ok();
      },
      [&](int y, const uint8_t* row) {
        for (int x = 0; x < set.cols; ++x) {
          for (int c = 0; c < set.channels; ++c) {
            set.pixels[static_cast<size_t>(c * plane + int64_t{y} * set.cols + x)] = row[x * set.channels + c];
          }
        }
      }));
  return set;
}

Result<ImageHeader> ReadImageHeader(const std::string& path) {
  // The first 64 KiB hold every header these formats have (a JPEG's frame header after its
  // metadata segments, as a rule; one further on is read whole, within the usual cap).
  std::string head;
  {
    ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));  // a FIFO or a device hangs nothing
    head.resize(65536);
    const ssize_t n = ::pread(fd, head.data(), head.size(), 0);
    ::close(fd);
    head.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  auto be32 = [](const std::string& b, size_t at) {
    return (int64_t{static_cast<uint8_t>(b[at])} << 24) | (int64_t{static_cast<uint8_t>(b[at + 1])} << 16) |
           (int64_t{static_cast<uint8_t>(b[at + 2])} << 8) | int64_t{static_cast<uint8_t>(b[at + 3])};
  };
  ImageHeader h;
  if (head.size() >= 24 && std::memcmp(head.data(), "\x89PNG\r\n\x1a\n", 8) == 0 && head.compare(12, 4, "IHDR") == 0) {
    h.cols = be32(head, 16);
    h.rows = be32(head, 20);
    return h;
  }
  if (head.size() >= 4 &&
      (std::memcmp(head.data(), "\0\0\x08\x03", 4) == 0 || std::memcmp(head.data(), "\x1f\x8b", 2) == 0)) {
    gzFile gz = ::gzopen(path.c_str(), "rb");  // plain or gzipped: only the first 16 bytes inflated
    if (gz == nullptr) return NotFound(path + ": cannot open");
    std::string idx(16, '\0');
    const int got = ::gzread(gz, idx.data(), 16);
    ::gzclose(gz);
    if (got >= 4 && std::memcmp(idx.data(), "\0\0\x08\x01", 4) == 0) return Bad(path, kLabelsNotImages);
    if (got != 16 || std::memcmp(idx.data(), "\0\0\x08\x03", 4) != 0) return Bad(path, "not an idx3 image file");
    h.count = be32(idx, 4);
    h.rows = be32(idx, 8);
    h.cols = be32(idx, 12);
    return h;
  }
  if (head.size() >= 2 && head[0] == 'P' && std::strchr("2356", head[1]) && head[1] != '\0') {
    size_t at = 2;
    auto field = [&](int64_t* out) { return PnmField(head, &at, out); };  // (image_rows.h)
    if (!field(&h.cols) || !field(&h.rows)) return Bad(path, "a PGM/PPM header needs width and height");
    return h;
  }
  if (IsJpeg(head)) {
    // A frame header past the first 64 KiB (after large metadata): the whole file, within the cap.
    std::string whole;
    for (int attempt = 0; attempt < 2; ++attempt) {
      JpegSession s;
      if (setjmp(s.jump)) {
        if (attempt == 0 && head.size() == 65536) {
          auto all = ReadFile(path, kMaxFileBytes);
          if (all.ok()) {
            whole = std::move(*all);
            continue;
          }
        }
        return s.Failed(path);
      }
      s.Start(attempt == 0 ? std::string_view(head) : std::string_view(whole));
      jpeg_read_header(&s.cinfo, TRUE);
      h.cols = s.cinfo.image_width;
      h.rows = s.cinfo.image_height;
      return h;
    }
  }
  if (head.size() >= 4 && std::memcmp(head.data(), "\0\0\x08\x01", 4) == 0) return Bad(path, kLabelsNotImages);
  return Bad(path, "not a PNG, JPEG, PGM or PPM image");
}

}  // namespace trainctl::data
