#include "data/image_rows.h"

#include <jerror.h>
#include <png.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

#include "common/duration.h"

namespace trainctl::data {
namespace {

Status Bad(const std::string& path, const std::string& what) { return InvalidArgument(path + ": " + what); }

std::string Mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// libjpeg's errors, and the warnings that mean pixels were lost, end the decode by a jump back.
[[noreturn]] void JumpBack(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegSession::Error*>(c->err);
  std::longjmp(*e->jump, 1);
}

void OnJpegError(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegSession::Error*>(c->err);
  if (c->err->msg_code == JERR_NO_BACKING_STORE || c->err->msg_code == JERR_OUT_OF_MEMORY) {
    std::snprintf(e->message, sizeof e->message,
                  "decoding it needs more than %s (a progressive JPEG holds the whole "
                  "picture's coefficients); at most %s a picture",
                  Mib(kMaxDecodeBytes).c_str(), Mib(kMaxDecodeBytes).c_str());
  } else {
    (*c->err->format_message)(c, e->message);
  }
  JumpBack(c);
}

void OnJpegMessage(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace messages
  switch (c->err->msg_code) {
    case JWRN_JPEG_EOF:           // truncated: the rest decoded as grey
    case JWRN_HIT_MARKER:         // a segment cut short
    case JWRN_HUFF_BAD_CODE:      // corrupt entropy-coded data
    case JWRN_MUST_RESYNC:        // a restart marker lost
    case JWRN_BOGUS_PROGRESSION:  // scans that do not refine what came before (a repeated scan)
    case JWRN_NOT_SEQUENTIAL: {
      auto* e = reinterpret_cast<JpegSession::Error*>(c->err);
      char what[JMSG_LENGTH_MAX];
      (*c->err->format_message)(c, what);
      std::snprintf(e->message, sizeof e->message, "%s (a damaged picture)", what);
      JumpBack(c);
    }
    default:
      return;  // metadata it could not read: the pixels are whole
  }
}

void OnJpegProgress(j_common_ptr c) {
  auto* p = reinterpret_cast<JpegSession::Progress*>(c->progress);
  auto* e = reinterpret_cast<JpegSession::Error*>(c->err);
  const int scans = reinterpret_cast<j_decompress_ptr>(c)->input_scan_number;
  if (scans > kMaxJpegScans) {
    std::snprintf(e->message, sizeof e->message, "more than %d scans (a progressive JPEG has about ten); not decoded",
                  kMaxJpegScans);
    JumpBack(c);
  }
  if (Clock::now() > p->deadline) {
    std::snprintf(e->message, sizeof e->message, "still decoding after %lld s; abandoned",
                  static_cast<long long>(kMaxDecodeTime.count()));
    JumpBack(c);
  }
}

inline uint8_t MulDiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<uint8_t>((t + (t >> 8)) >> 8);
}

Status DecodeJpegRows(std::string_view bytes, const std::string& path, const OnPictureSize& size,
                      const OnPictureRow& row) {
  JpegSession s;
  std::vector<uint8_t> line;  // before setjmp: its destructor runs after a jump too
  Status refused;
  if (setjmp(s.jump)) return refused.ok() ? s.Failed(path) : refused;
  s.Start(bytes);
  RETURN_IF_ERROR(s.ReadHeader(path));
  const bool cmyk = s.Cmyk();
  const bool grey = s.cinfo.num_components == 1;
  s.cinfo.out_color_space = cmyk ? JCS_CMYK : grey ? JCS_GRAYSCALE : JCS_RGB;
  const PictureSize ps{static_cast<int>(s.cinfo.image_width), static_cast<int>(s.cinfo.image_height), grey ? 1 : 3};
  // Started first: a progressive JPEG's scans, their cap and the decoder's budget are past before
  // the caller allocates anything for its pixels.
  jpeg_start_decompress(&s.cinfo);
  if (Status st = size(ps); !st.ok()) {
    jpeg_abort_decompress(&s.cinfo);
    return st;
  }
  line.resize(static_cast<size_t>(s.cinfo.output_width) * s.cinfo.output_components);
  for (int y = 0; y < ps.rows; ++y) {
    JSAMPROW r = line.data();
    if (jpeg_read_scanlines(&s.cinfo, &r, 1) != 1) {
      refused = Bad(path, "the JPEG ends before its last row");
      JumpBack(reinterpret_cast<j_common_ptr>(&s.cinfo));
    }
    if (cmyk) s.FromCmyk(line.data(), ps.cols, ps.channels);
    row(y, line.data());
  }
  jpeg_finish_decompress(&s.cinfo);
  return Status::Ok();
}

// libpng's errors end the decode by a jump back; its warnings (about metadata chunks: a colour
// profile, a checksum of a text chunk) leave the pixels whole.
struct PngInput {
  std::string_view bytes;
  size_t at = 0;
  Clock::time_point deadline;
  char message[256] = {0};
};

void OnPngRead(png_structp p, png_bytep out, png_size_t n) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(p));
  if (in->bytes.size() - in->at < n) png_error(p, "truncated: the file ends inside a chunk");
  std::memcpy(out, in->bytes.data() + in->at, n);
  in->at += n;
}

void OnPngError(png_structp p, png_const_charp message) {
  auto* in = static_cast<PngInput*>(png_get_error_ptr(p));
  std::snprintf(in->message, sizeof in->message, "%s", message);
  png_longjmp(p, 1);
}

void OnPngWarning(png_structp, png_const_charp) {}

void OnPngRow(png_structp p, png_uint_32, int) {
  auto* in = static_cast<PngInput*>(png_get_io_ptr(p));
  if (Clock::now() > in->deadline) png_error(p, "still decoding after the time a picture may take; abandoned");
}

Status DecodePngRows(std::string_view bytes, const std::string& path, const OnPictureSize& size,
                     const OnPictureRow& row) {
  PngInput in;
  in.bytes = bytes;
  in.deadline = Clock::now() + kMaxDecodeTime;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &in, OnPngError, OnPngWarning);
  if (!png) return Bad(path, "cannot start the PNG decoder");
  png_infop info = png_create_info_struct(png);
  std::vector<uint8_t> pixels;  // before setjmp, as above: one row, or an interlaced picture
  Status refused;
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    if (!refused.ok()) return refused;
    return Bad(path, std::string("not a PNG libpng can read: ") + in.message);
  }
  png_set_read_fn(png, &in, OnPngRead);
  png_set_read_status_fn(png, OnPngRow);
  png_set_user_limits(png, kMaxPictureSide, kMaxPictureSide);
  png_set_chunk_malloc_max(png, 8 << 20);
  png_read_info(png, info);
  const png_uint_32 cols = png_get_image_width(png, info), rows = png_get_image_height(png, info);
  const int type = png_get_color_type(png, info);
  if (!PictureSizeOk(cols, rows)) {
    refused =
        Bad(path, "an image of " + std::to_string(cols) + "x" + std::to_string(rows) + " pixels is not supported");
    png_longjmp(png, 1);
  }
  // As PIL reads it: 8 bits a sample (the high byte of 16), palette and low bit depths expanded,
  // alpha dropped, no gamma applied.
  png_set_strip_16(png);
  png_set_packing(png);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  const bool grey = (type & PNG_COLOR_MASK_COLOR) == 0 && !png_get_valid(png, info, PNG_INFO_tRNS);
  if (!grey && (type & PNG_COLOR_MASK_COLOR) == 0) png_set_gray_to_rgb(png);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  const PictureSize ps{static_cast<int>(cols), static_cast<int>(rows), grey ? 1 : 3};
  if (row_bytes != static_cast<size_t>(ps.cols) * ps.channels) {
    refused = Bad(path, "an unexpected PNG layout (" + std::to_string(row_bytes) + " bytes a row)");
    png_longjmp(png, 1);
  }
  // An interlaced picture's rows are whole only after its last pass: it is decoded whole, within
  // the decoder's budget.
  const int64_t whole = passes > 1 ? static_cast<int64_t>(row_bytes) * rows : static_cast<int64_t>(row_bytes);
  if (whole > kMaxDecodeBytes) {
    refused =
        Bad(path, "an interlaced PNG of " + std::to_string(cols) + "x" + std::to_string(rows) + " needs " + Mib(whole) +
                      " to decode; at most " + Mib(kMaxDecodeBytes) + " a picture (save it without interlacing)");
    png_longjmp(png, 1);
  }
  if (Status st = size(ps); !st.ok()) {
    refused = st;
    png_longjmp(png, 1);
  }
  pixels.resize(static_cast<size_t>(whole));
  if (passes > 1) {
    std::vector<png_bytep> pointers(rows);
    for (png_uint_32 y = 0; y < rows; ++y) pointers[y] = pixels.data() + static_cast<size_t>(y) * row_bytes;
    png_read_image(png, pointers.data());
    for (png_uint_32 y = 0; y < rows; ++y) row(static_cast<int>(y), pointers[y]);
  } else {
    for (png_uint_32 y = 0; y < rows; ++y) {
      png_read_row(png, pixels.data(), nullptr);
      row(static_cast<int>(y), pixels.data());
    }
  }
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return Status::Ok();
}

}  // namespace

bool PnmField(std::string_view bytes, size_t* at, int64_t* out) {
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

namespace {

// PGM (P2, P5) and PPM (P3, P6): whitespace-separated header fields, '#' comments; the samples
// the header promises checked against what the file holds before a row is allocated.
Status DecodePnmRows(std::string_view bytes, const std::string& path, const OnPictureSize& size,
                     const OnPictureRow& row) {
  const char kind = bytes[1];
  const bool plain = kind == '2' || kind == '3';
  const int channels = kind == '2' || kind == '5' ? 1 : 3;
  size_t at = 2;
  int64_t cols = 0, rows = 0, maxval = 0;
  if (!PnmField(bytes, &at, &cols) || !PnmField(bytes, &at, &rows) || !PnmField(bytes, &at, &maxval)) {
    return Bad(path, "a PGM/PPM header needs width, height and maxval");
  }
  if (!PictureSizeOk(cols, rows)) {
    return Bad(path, "an image of " + std::to_string(cols) + "x" + std::to_string(rows) + " pixels is not supported");
  }
  if (maxval < 1 || maxval > 255)
    return Bad(path, "maxval " + std::to_string(maxval) + ": only 8-bit images (1 to 255)");
  const int64_t n = rows * cols * channels;
  ++at;  // the single whitespace after maxval
  const int64_t left = at > bytes.size() ? 0 : static_cast<int64_t>(bytes.size() - at);
  // A raw sample is a byte; a plain one at least a digit and a space (the last one may end the file).
  if ((plain ? 2 * n - 1 : n) > left) {
    return Bad(path, "truncated: the header promises " + std::to_string(n) + " samples and the file holds " +
                         (plain ? "fewer" : std::to_string(left) + " bytes of them"));
  }
  RETURN_IF_ERROR(size({static_cast<int>(cols), static_cast<int>(rows), channels}));
  std::vector<uint8_t> line(static_cast<size_t>(cols * channels));
  const uint8_t* raw = reinterpret_cast<const uint8_t*>(bytes.data()) + at;
  --at;  // plain samples are read from the whitespace on
  for (int64_t y = 0; y < rows; ++y) {
    for (int64_t i = 0; i < cols * channels; ++i) {
      int64_t v = 0;
      if (!plain) {
        v = raw[y * cols * channels + i];
      } else if (!PnmField(bytes, &at, &v)) {
        return Bad(path,
                   "truncated: " + std::to_string(y * cols * channels + i) + " of " + std::to_string(n) + " samples");
      } else if (v > maxval) {
        return Bad(path, "sample " + std::to_string(v) + " is larger than maxval");
      }
      line[static_cast<size_t>(i)] = static_cast<uint8_t>(v * 255 / maxval);
    }
    row(static_cast<int>(y), line.data());
  }
  return Status::Ok();
}

}  // namespace

bool PictureSizeOk(int64_t cols, int64_t rows) {
  return cols >= 1 && rows >= 1 && cols <= kMaxPictureSide && rows <= kMaxPictureSide &&
         cols * rows <= kMaxPicturePixels;
}

bool IsJpeg(std::string_view bytes) { return bytes.size() >= 3 && std::memcmp(bytes.data(), "\xff\xd8\xff", 3) == 0; }

JpegSession::JpegSession() {
  std::memset(&cinfo, 0, sizeof cinfo);
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = OnJpegError;
  err.mgr.emit_message = OnJpegMessage;
  err.jump = &jump;
  err.message[0] = '\0';
  progress.mgr.progress_monitor = OnJpegProgress;
}

JpegSession::~JpegSession() {
  if (created) jpeg_destroy_decompress(&cinfo);
}

void JpegSession::Start(std::string_view bytes) {
  jpeg_create_decompress(&cinfo);
  created = true;
  cinfo.mem->max_memory_to_use = static_cast<long>(kMaxDecodeBytes);
  cinfo.progress = &progress.mgr;
  progress.deadline = Clock::now() + kMaxDecodeTime;
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
}

Status JpegSession::ReadHeader(const std::string& path) {
  jpeg_read_header(&cinfo, TRUE);
  if (!PictureSizeOk(cinfo.image_width, cinfo.image_height)) {
    return Bad(path, "its header declares " + std::to_string(cinfo.image_width) + "x" +
                         std::to_string(cinfo.image_height) + " pixels; at most 2^26 are decoded");
  }
  return Status::Ok();
}

Status JpegSession::Failed(const std::string& path) const {
  return Bad(path, std::string("not a JPEG libjpeg-turbo can read: ") + err.message);
}

void JpegSession::FromCmyk(uint8_t* pixels, int64_t n, int channels) const {
  const bool adobe = cinfo.saw_Adobe_marker;
  for (int64_t p = 0; p < n; ++p) {
    const uint8_t* q = pixels + p * 4;
    const int c = adobe ? q[0] : 255 - q[0], m = adobe ? q[1] : 255 - q[1], y = adobe ? q[2] : 255 - q[2],
              k = adobe ? q[3] : 255 - q[3];
    const uint8_t r = MulDiv255(c, k), g = MulDiv255(m, k), b = MulDiv255(y, k);
    uint8_t* to = pixels + p * channels;
    if (channels == 1) {
      to[0] = Luma(r, g, b);
    } else {
      to[0] = r, to[1] = g, to[2] = b;
    }
  }
}

Status DecodeRows(std::string_view bytes, const std::string& path, const OnPictureSize& size, const OnPictureRow& row) {
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    return DecodePngRows(bytes, path, size, row);
  }
  if (bytes.size() >= 2 && bytes[0] == 'P' && bytes[1] != '\0' && std::strchr("2356", bytes[1])) {
    return DecodePnmRows(bytes, path, size, row);
  }
  if (IsJpeg(bytes)) return DecodeJpegRows(bytes, path, size, row);
  return Bad(path, "not a PNG, JPEG, PGM or PPM image");
}

}  // namespace trainctl::data
