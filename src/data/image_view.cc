#include "data/image_view.h"

#include "data/dataset.h"

#include <csetjmp>
#include <cstdio>
// clang-format off: jpeglib.h needs stdio.h's FILE first.
#include <jpeglib.h>
// clang-format on

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

namespace trainctl::data {
namespace {

constexpr int64_t kMaxPixels = int64_t{1} << 26;  // as image_file.cc: 8192 x 8192

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// splitmix64's step: a stream of 64-bit numbers from one.
uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Uniform(uint64_t* state) { return double(SplitMix(state) >> 11) * 0x1.0p-53; }

// PIL's filter weights for one axis (Resample.c, precompute_coeffs, with the bilinear filter),
// in its fixed point: for output pixel i, `count[i]` weights from source pixel `first[i]` on.
constexpr int kPrecisionBits = 32 - 8 - 2;

struct Taps {
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // count.size() x `width`
  int width = 0;
};

Taps Coefficients(int in_size, double in0, double in1, int out_size) {
  Taps t;
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;
  t.width = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.weights.assign(static_cast<size_t>(out_size) * t.width, 0);
  std::vector<double> k(t.width);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0;
    for (int x = 0; x < xmax; ++x) {
      double d = (x + xmin - center + 0.5) * ss;
      if (d < 0) d = -d;
      k[x] = d < 1 ? 1 - d : 0;
      ww += k[x];
    }
    for (int x = 0; x < xmax; ++x) {
      const double w = ww != 0 ? k[x] / ww : k[x];
      t.weights[static_cast<size_t>(xx) * t.width + x] =
          static_cast<int32_t>(w < 0 ? w * (1 << kPrecisionBits) - 0.5 : w * (1 << kPrecisionBits) + 0.5);
    }
    t.first[xx] = xmin;
    t.count[xx] = xmax;
  }
  return t;
}

inline uint8_t Clip8(int32_t v) {
  v >>= kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// libjpeg's errors end the decode by a jump back, not the process.
struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void OnJpegError(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

void QuietJpegWarning(j_common_ptr, int) {}

// PIL's CMYK to RGB (Convert.c, cmyk2rgb), from the bytes as stored: Photoshop's (an Adobe
// marker) store them inverted.
inline uint8_t MulDiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<uint8_t>((t + (t >> 8)) >> 8);
}

}  // namespace

uint64_t ImageDraw(uint64_t seed, int64_t epoch, int64_t index) {
  uint64_t state = seed * 0xD1B54A32D192ED03ull ^ static_cast<uint64_t>(epoch) * 0x8CB92BA72F3D8DD7ull ^
                   static_cast<uint64_t>(index) * 0xABC98388FB8FAC03ull ^ 0x5DEECE66Dull;
  return SplitMix(&state);
}

Box CenterBox(int W, int H, const ViewOptions& o) {
  Box b;
  if (o.rows == o.cols) {
    // torchvision: Resize(S) makes the shorter side S and the longer int(S * long / short);
    // CenterCrop(size) starts at int(round((new - size) / 2)).
    const int S = static_cast<int>(std::floor(o.rows / o.crop_pct + 1e-9));
    int64_t new_w, new_h;
    if (W <= H) {
      new_w = S;
      new_h = static_cast<int64_t>(double(S) * H / W);
    } else {
      new_h = S;
      new_w = static_cast<int64_t>(double(S) * W / H);
    }
    // Python's round: halves to even.
    const double top = std::nearbyint((new_h - o.rows) / 2.0), left = std::nearbyint((new_w - o.cols) / 2.0);
    const double sx = double(W) / new_w, sy = double(H) / new_h;
    b = {left * sx, top * sy, o.cols * sx, o.rows * sy, false};
  } else {
    // A resize that covers rows / crop_pct x cols / crop_pct, then the centre.
    const double s = std::max(double(o.rows) / H, double(o.cols) / W) / o.crop_pct;
    b = {(W - o.cols / s) / 2, (H - o.rows / s) / 2, o.cols / s, o.rows / s, false};
  }
  return b;
}

Box RandomResizedBox(int W, int H, const ViewOptions& o, uint64_t draw) {
  uint64_t state = draw;
  const double area = double(W) * H;
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (o.scale_min + (o.scale_max - o.scale_min) * Uniform(&state));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * Uniform(&state));
    const int w = static_cast<int>(std::lround(std::sqrt(target * aspect)));
    const int h = static_cast<int>(std::lround(std::sqrt(target / aspect)));
    if (w > 0 && w <= W && h > 0 && h <= H) {
      const int i = static_cast<int>(SplitMix(&state) % static_cast<uint64_t>(H - h + 1));
      const int j = static_cast<int>(SplitMix(&state) % static_cast<uint64_t>(W - w + 1));
      return {double(j), double(i), double(w), double(h), true};
    }
  }
  // The central crop of the nearest allowed ratio.
  const double in_ratio = double(W) / H;
  int w = W, h = H;
  if (in_ratio < std::min(o.ratio_min, o.ratio_max)) {
    h = static_cast<int>(std::lround(w / std::min(o.ratio_min, o.ratio_max)));
  } else if (in_ratio > std::max(o.ratio_min, o.ratio_max)) {
    w = static_cast<int>(std::lround(h * std::max(o.ratio_min, o.ratio_max)));
  }
  return {double((W - w) / 2), double((H - h) / 2), double(w), double(h), true};
}

Box ViewBox(int W, int H, const ViewOptions& o, uint64_t draw) {
  return o.random_resized_crop ? RandomResizedBox(W, H, o, draw) : CenterBox(W, H, o);
}

void ResampleBox(const uint8_t* src, int W, int H, int C, ptrdiff_t col_step, ptrdiff_t row_step,
                 ptrdiff_t channel_step, const Box& box, int rows, int cols, uint8_t* out) {
  // A clipped box is a picture of its own (PIL's crop, then resize): shift to it.
  int width = W, height = H;
  double bx = box.x, by = box.y;
  if (box.clip) {
    const int x0 = static_cast<int>(box.x), y0 = static_cast<int>(box.y);
    src += static_cast<ptrdiff_t>(y0) * row_step + static_cast<ptrdiff_t>(x0) * col_step;
    width = std::max(1, std::min(W - x0, static_cast<int>(std::lround(box.w))));
    height = std::max(1, std::min(H - y0, static_cast<int>(std::lround(box.h))));
    bx -= x0;
    by -= y0;
  }
  const Taps horizontal = Coefficients(width, bx, bx + box.w, cols);
  const Taps vertical = Coefficients(height, by, by + box.h, rows);
  // PIL skips an axis whose size and box leave it as it is.
  const bool need_h = cols != width || bx != 0 || box.w != width;
  const bool need_v = rows != height || by != 0 || box.h != height;
  // The source rows the vertical pass reads, through the horizontal pass first.
  const int y_first = need_v ? vertical.first[0] : static_cast<int>(by);
  const int y_last = need_v ? vertical.first[rows - 1] + vertical.count[rows - 1] : y_first + rows;
  const int span = y_last - y_first;
  thread_local std::vector<uint8_t> middle;
  middle.resize(static_cast<size_t>(span) * cols * C);
  // Horizontal: rows y_first..y_last of the source, to cols wide (channel-interleaved here).
  const bool interleaved3 = C == 3 && col_step == 3 && channel_step == 1;
  for (int y = 0; y < span; ++y) {
    const uint8_t* line = src + static_cast<ptrdiff_t>(y_first + y) * row_step;
    uint8_t* to = middle.data() + static_cast<size_t>(y) * cols * C;
    if (!need_h) {
      for (int x = 0; x < cols; ++x) {
        for (int c = 0; c < C; ++c) to[x * C + c] = line[(static_cast<ptrdiff_t>(bx) + x) * col_step + c * channel_step];
      }
      continue;
    }
    for (int x = 0; x < cols; ++x) {
      const int first = horizontal.first[x], count = horizontal.count[x];
      const int32_t* k = horizontal.weights.data() + static_cast<size_t>(x) * horizontal.width;
      if (interleaved3) {  // the three channels of a tap at once (a JPEG's RGB)
        int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
        const uint8_t* p = line + static_cast<ptrdiff_t>(first) * 3;
        for (int t = 0; t < count; ++t) {
          s0 += p[3 * t] * k[t];
          s1 += p[3 * t + 1] * k[t];
          s2 += p[3 * t + 2] * k[t];
        }
        to[x * 3] = Clip8(s0);
        to[x * 3 + 1] = Clip8(s1);
        to[x * 3 + 2] = Clip8(s2);
        continue;
      }
      for (int c = 0; c < C; ++c) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        const uint8_t* p = line + static_cast<ptrdiff_t>(first) * col_step + c * channel_step;
        for (int t = 0; t < count; ++t) ss += p[t * col_step] * k[t];
        to[x * C + c] = Clip8(ss);
      }
    }
  }
  // Vertical: a whole output row at a time (each tap a contiguous row of sums), into the planes.
  const size_t plane = static_cast<size_t>(rows) * cols, row_bytes = static_cast<size_t>(cols) * C;
  thread_local std::vector<int32_t> sums;
  sums.resize(row_bytes);
  for (int y = 0; y < rows; ++y) {
    uint8_t* const plane_row = out + static_cast<size_t>(y) * cols;
    if (!need_v) {
      const uint8_t* from = middle.data() + static_cast<size_t>(y) * row_bytes;
      for (int x = 0; x < cols; ++x) {
        for (int c = 0; c < C; ++c) plane_row[c * plane + x] = from[x * C + c];
      }
      continue;
    }
    const int first = vertical.first[y] - y_first, count = vertical.count[y];
    const int32_t* k = vertical.weights.data() + static_cast<size_t>(y) * vertical.width;
    int32_t* __restrict acc = sums.data();
    std::fill(sums.begin(), sums.end(), 1 << (kPrecisionBits - 1));
    for (int t = 0; t < count; ++t) {
      const uint8_t* __restrict row = middle.data() + static_cast<size_t>(first + t) * row_bytes;
      const int32_t w = k[t];
      for (size_t i = 0; i < row_bytes; ++i) acc[i] += row[i] * w;
    }
    for (int x = 0; x < cols; ++x) {
      for (int c = 0; c < C; ++c) plane_row[c * plane + x] = Clip8(acc[x * C + c]);
    }
  }
}

namespace {

// A JPEG decoded only as far as `o`'s box needs: at the smallest DCT scale at which the box still
// covers the output, its rows and (to the next iMCU boundary) columns only.
Status DecodeJpegView(std::string_view bytes, const std::string& path, const ViewOptions& o, uint64_t draw,
                      uint8_t* out, ViewTimes* times) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = OnJpegError;
  err.mgr.emit_message = QuietJpegWarning;
  std::vector<uint8_t> region;  // before setjmp: its destructor runs after a jump too
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return InvalidArgument(path + ": not a JPEG libjpeg-turbo can read: " + err.message);
  }
  const double start = Now();
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  const int W = static_cast<int>(cinfo.image_width), H = static_cast<int>(cinfo.image_height);
  if (W < 1 || H < 1 || int64_t{W} * H > kMaxPixels) {
    jpeg_destroy_decompress(&cinfo);
    return InvalidArgument(path + ": its header declares " + std::to_string(W) + "x" + std::to_string(H) +
                           " pixels; at most 2^26 are decoded");
  }
  const Box box = ViewBox(W, H, o, draw);
  // The smallest scale (1/8 .. 1) at which the box is still at least the output's size.
  int denom = 8;
  while (denom > 1 && (box.w / denom < o.cols || box.h / denom < o.rows)) denom /= 2;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(denom);
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : o.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int sw = static_cast<int>(cinfo.output_width), sh = static_cast<int>(cinfo.output_height);
  const int comps = cinfo.output_components;
  const double fx = double(sw) / W, fy = double(sh) / H;
  // The scaled box, and the pixels around it the filter reads (unless it is clipped to the box),
  // and one more: a cropped decode's first and last columns are upsampled without their
  // neighbours' chroma, so they differ from a whole decode's.
  Box scaled{box.x * fx, box.y * fy, box.w * fx, box.h * fy, box.clip};
  const int margin = (box.clip ? 0 : static_cast<int>(std::ceil(std::max(scaled.w / o.cols, scaled.h / o.rows))) + 2) + 1;
  int x0 = std::clamp(static_cast<int>(std::floor(scaled.x)) - margin, 0, sw - 1);
  const int x1 = std::clamp(static_cast<int>(std::ceil(scaled.x + scaled.w)) + margin, x0 + 1, sw);
  const int y0 = std::clamp(static_cast<int>(std::floor(scaled.y)) - margin, 0, sh - 1);
  const int y1 = std::clamp(static_cast<int>(std::ceil(scaled.y + scaled.h)) + margin, y0 + 1, sh);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), cw = static_cast<JDIMENSION>(x1 - x0);
  if (cw < static_cast<JDIMENSION>(sw)) jpeg_crop_scanline(&cinfo, &xoff, &cw);  // widened to iMCU bounds
  x0 = static_cast<int>(xoff);
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));
  const int rows_needed = y1 - y0;
  region.resize(static_cast<size_t>(rows_needed) * cw * comps);
  for (int r = 0; r < rows_needed;) {
    JSAMPROW row = region.data() + static_cast<size_t>(r) * cw * comps;
    const JDIMENSION got = jpeg_read_scanlines(&cinfo, &row, 1);
    if (got == 0) break;
    r += static_cast<int>(got);
  }
  jpeg_abort_decompress(&cinfo);
  const bool adobe = cinfo.saw_Adobe_marker;
  jpeg_destroy_decompress(&cinfo);
  int C = comps;
  if (cmyk) {  // to RGB (or luma) in place, as PIL
    const size_t n = static_cast<size_t>(rows_needed) * cw;
    for (size_t p = 0; p < n; ++p) {
      uint8_t* q = region.data() + p * 4;
      const int c = adobe ? q[0] : 255 - q[0], m = adobe ? q[1] : 255 - q[1], y = adobe ? q[2] : 255 - q[2],
                k = adobe ? q[3] : 255 - q[3];
      const uint8_t r = MulDiv255(c, k), g = MulDiv255(m, k), b = MulDiv255(y, k);
      uint8_t* to = region.data() + p * o.channels;
      if (o.channels == 1) {
        to[0] = static_cast<uint8_t>((299 * r + 587 * g + 114 * b + 500) / 1000);
      } else {
        to[0] = r, to[1] = g, to[2] = b;
      }
    }
    C = o.channels;
  }
  const double decoded = Now();
  Box local = scaled;
  local.x -= x0;
  local.y -= y0;
  ResampleBox(region.data(), static_cast<int>(cw), rows_needed, C, C, static_cast<ptrdiff_t>(cw) * C, 1, local, o.rows,
              o.cols, out);
  if (times) {
    times->decode += decoded - start;
    times->resize += Now() - decoded;
  }
  return Status::Ok();
}

}  // namespace

Status DecodeView(std::string_view bytes, const std::string& path, const ViewOptions& o, uint64_t draw, uint8_t* out,
                  ViewTimes* times) {
  if (bytes.size() >= 3 && std::memcmp(bytes.data(), "\xff\xd8\xff", 3) == 0) {
    return DecodeJpegView(bytes, path, o, draw, out, times);
  }
  const double start = Now();
  ASSIGN_OR_RETURN(ImageSet one, DecodeImage(std::string(bytes), path));
  one = ToChannels(one, o.channels);
  const double decoded = Now();
  const Box box = ViewBox(one.cols, one.rows, o, draw);
  const ptrdiff_t plane = static_cast<ptrdiff_t>(one.rows) * one.cols;
  ResampleBox(one.pixels.data(), one.cols, one.rows, one.channels, 1, one.cols, plane, box, o.rows, o.cols, out);
  if (times) {
    times->decode += decoded - start;
    times->resize += Now() - decoded;
  }
  return Status::Ok();
}

Result<ImageSet> ApplyView(const ImageSet& one, const ViewOptions& o) {
  const ImageSet in = ToChannels(one, o.channels);
  ImageSet out;
  out.count = 1;
  out.channels = o.channels;
  out.rows = o.rows;
  out.cols = o.cols;
  out.labels = in.labels;
  out.pixels.resize(out.image_bytes());
  const ptrdiff_t plane = static_cast<ptrdiff_t>(in.rows) * in.cols;
  ResampleBox(in.pixels.data(), in.cols, in.rows, in.channels, 1, in.cols, plane, CenterBox(in.cols, in.rows, o), o.rows,
              o.cols, out.pixels.data());
  return out;
}

}  // namespace trainctl::data
