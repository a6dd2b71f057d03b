// One image from a file, for `trainctl predict` and image folders: PNG through libpng, JPEG through
// libjpeg-turbo, PGM/PPM parsed here. The bytes come from users: every size is checked before it
// is used.
#include <fcntl.h>
#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "common/fs.h"
#include "data/dataset.h"
#include "data/image_header.h"

namespace trainctl::data {

namespace {

constexpr int64_t kMaxFileBytes = int64_t{256} << 20;
constexpr int64_t kMaxSide = 65536;
constexpr int64_t kMaxPixels = int64_t{1} << 26;  // 8192 x 8192

// Width and height each checked before their product is taken.
bool SizeOk(int64_t cols, int64_t rows) {
  return cols >= 1 && rows >= 1 && cols <= kMaxSide && rows <= kMaxSide && cols * rows <= kMaxPixels;
}

Status Bad(const std::string& path, const std::string& what) { return InvalidArgument(path + ": " + what); }

// One image from interleaved (H, W, C) pixels, stored planar (C, H, W).
ImageSet OneImage(int channels, int64_t rows, int64_t cols, const std::vector<uint8_t>& hwc) {
  ImageSet set;
  set.count = 1;
  set.channels = channels;
  set.rows = static_cast<int>(rows);
  set.cols = static_cast<int>(cols);
  set.labels = {0};
  set.pixels.resize(rows * cols * channels);
  for (int64_t p = 0; p < rows * cols; ++p) {
    for (int c = 0; c < channels; ++c) set.pixels[c * rows * cols + p] = hwc[p * channels + c];
  }
  return set;
}

// A PGM/PPM header field at `*at` in `bytes`: the number after whitespace and '#' comments (at
// most 10 digits); false when there is none. Moves `*at` past it.
bool PnmField(const std::string& bytes, size_t* at, int64_t* out) {
  size_t i = *at;
  while (i < bytes.size() && (bytes[i] == '#' || std::isspace(static_cast<unsigned char>(bytes[i])))) {
    if (bytes[i] == '#') {
      while (i < bytes.size() && bytes[i] != '\n') ++i;
    } else {
      ++i;
    }
  }
  int64_t v = 0;
  size_t digits = 0;
  for (; i < bytes.size() && std::isdigit(static_cast<unsigned char>(bytes[i])) && digits < 10; ++i, ++digits) {
    v = v * 10 + (bytes[i] - '0');
  }
  *at = i;
  *out = v;
  return digits > 0;
}

// PGM (P2, P5) and PPM (P3, P6): whitespace-separated header fields, '#' comments.
Result<ImageSet> ReadNetpbm(const std::string& path, const std::string& bytes) {
  const char kind = bytes[1];
  const bool plain = kind == '2' || kind == '3';
  const int channels = kind == '2' || kind == '5' ? 1 : 3;
  size_t at = 2;
  auto field = [&](int64_t* out) { return PnmField(bytes, &at, out); };
  int64_t cols = 0, rows = 0, maxval = 0;
  if (!field(&cols) || !field(&rows) || !field(&maxval)) return Bad(path, "a PGM/PPM header needs width, height and maxval");
  if (!SizeOk(cols, rows)) {
    return Bad(path, "an image of " + std::to_string(cols) + "x" + std::to_string(rows) + " pixels is not supported");
  }
  if (maxval < 1 || maxval > 255) return Bad(path, "maxval " + std::to_string(maxval) + ": only 8-bit images (1 to 255)");
  const int64_t n = rows * cols * channels;
  std::vector<uint8_t> hwc(n);
  if (plain) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = 0;
      if (!field(&v)) return Bad(path, "truncated: " + std::to_string(i) + " of " + std::to_string(n) + " samples");
      if (v > maxval) return Bad(path, "sample " + std::to_string(v) + " is larger than maxval");
      hwc[i] = static_cast<uint8_t>(v * 255 / maxval);
    }
  } else {
    ++at;  // the single whitespace after maxval
    if (at > bytes.size() || bytes.size() - at < static_cast<size_t>(n)) {
      return Bad(path, "truncated: the header promises " + std::to_string(n) + " bytes of pixels");
    }
    for (int64_t i = 0; i < n; ++i) hwc[i] = static_cast<uint8_t>(static_cast<uint8_t>(bytes[at + i]) * 255 / maxval);
  }
  return OneImage(channels, rows, cols, hwc);
}

Result<ImageSet> ReadPng(const std::string& path, const std::string& bytes) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    return Bad(path, std::string("not a PNG libpng can read: ") + image.message);
  }
  const bool grey = (image.format & PNG_FORMAT_FLAG_COLOR) == 0;
  image.format = grey ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;  // alpha dropped (composited on black)
  const int64_t cols = image.width, rows = image.height;
  if (!SizeOk(cols, rows)) {
    png_image_free(&image);
    return Bad(path, "an image of " + std::to_string(cols) + "x" + std::to_string(rows) + " pixels is not supported");
  }
  const int channels = grey ? 1 : 3;
  std::vector<uint8_t> hwc(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, hwc.data(), 0, nullptr)) {
    std::string message = image.message;
    png_image_free(&image);
    return Bad(path, "cannot decode the PNG: " + message);
  }
  png_image_free(&image);
  return OneImage(channels, rows, cols, hwc);
}

// Baseline and progressive JPEG, grey or colour (RGB out; CMYK is refused by name).
Result<ImageSet> ReadJpeg(const std::string& path, const std::string& bytes) {
  tjhandle h = tjInitDecompress();
  if (!h) return Bad(path, "cannot start the JPEG decoder");
  struct Closer {
    tjhandle h;
    ~Closer() { tjDestroy(h); }
  } closer{h};
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  int cols = 0, rows = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(h, data, size, &cols, &rows, &subsampling, &colorspace) != 0) {
    return Bad(path, std::string("not a JPEG libjpeg-turbo can read: ") + tjGetErrorStr2(h));
  }
  if (!SizeOk(cols, rows)) {
    return Bad(path, "an image of " + std::to_string(cols) + "x" + std::to_string(rows) + " pixels is not supported");
  }
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) return Bad(path, "a CMYK JPEG is not supported; expected RGB or grey");
  const bool grey = colorspace == TJCS_GRAY;
  const int channels = grey ? 1 : 3;
  std::vector<uint8_t> hwc(static_cast<size_t>(cols) * rows * channels);
  if (tjDecompress2(h, data, size, hwc.data(), cols, 0, rows, grey ? TJPF_GRAY : TJPF_RGB, 0) != 0 &&
      tjGetErrorCode(h) == TJERR_FATAL) {
    return Bad(path, std::string("cannot decode the JPEG: ") + tjGetErrorStr2(h));
  }
  return OneImage(channels, rows, cols, hwc);
}

}  // namespace

Result<ImageSet> ReadImageFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path, kMaxFileBytes));
  return DecodeImage(bytes, path);
}

Result<ImageSet> DecodeImage(const std::string& bytes, const std::string& path) {
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) return ReadPng(path, bytes);
  if (bytes.size() >= 2 && bytes[0] == 'P' && std::strchr("2356", bytes[1]) && bytes[1] != '\0') {
    return ReadNetpbm(path, bytes);
  }
  if (bytes.size() >= 3 && std::memcmp(bytes.data(), "\xff\xd8\xff", 3) == 0) return ReadJpeg(path, bytes);
  return Bad(path, "not a PNG, JPEG, PGM or PPM image (for idx files, give the images file itself)");
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
  if (head.size() >= 4 && (std::memcmp(head.data(), "\0\0\x08\x03", 4) == 0 || std::memcmp(head.data(), "\x1f\x8b", 2) == 0)) {
    gzFile gz = ::gzopen(path.c_str(), "rb");  // plain or gzipped: only the first 16 bytes inflated
    if (gz == nullptr) return NotFound(path + ": cannot open");
    std::string idx(16, '\0');
    const int got = ::gzread(gz, idx.data(), 16);
    ::gzclose(gz);
    if (got != 16 || std::memcmp(idx.data(), "\0\0\x08\x03", 4) != 0) return Bad(path, "not an idx3 image file");
    h.count = be32(idx, 4);
    h.rows = be32(idx, 8);
    h.cols = be32(idx, 12);
    return h;
  }
  if (head.size() >= 2 && head[0] == 'P' && std::strchr("2356", head[1]) && head[1] != '\0') {
    size_t at = 2;
    auto field = [&](int64_t* out) { return PnmField(head, &at, out); };
    if (!field(&h.cols) || !field(&h.rows)) return Bad(path, "a PGM/PPM header needs width and height");
    return h;
  }
  if (head.size() >= 3 && std::memcmp(head.data(), "\xff\xd8\xff", 3) == 0) {
    tjhandle t = tjInitDecompress();
    if (!t) return Bad(path, "cannot start the JPEG decoder");
    int cols = 0, rows = 0, subsampling = 0, colorspace = 0;
    int rc = tjDecompressHeader3(t, reinterpret_cast<const unsigned char*>(head.data()), head.size(), &cols, &rows,
                                 &subsampling, &colorspace);
    if (rc != 0) {  // a frame header past the first 64 KiB
      auto whole = ReadFile(path, kMaxFileBytes);
      rc = whole.ok() ? tjDecompressHeader3(t, reinterpret_cast<const unsigned char*>(whole->data()), whole->size(),
                                            &cols, &rows, &subsampling, &colorspace)
                      : -1;
    }
    tjDestroy(t);
    if (rc != 0) return Bad(path, "not a JPEG libjpeg-turbo can read");
    h.cols = cols;
    h.rows = rows;
    return h;
  }
  return Bad(path, "not a PNG, JPEG, PGM or PPM image (for idx files, give the images file itself)");
}

}  // namespace trainctl::data
