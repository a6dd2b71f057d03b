#include "data/image_view.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "data/dataset.h"
#include "data/image_rows.h"

namespace trainctl::data {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

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

using Taps = RowResampler::Taps;

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

RowResampler::RowResampler(int W, int H, int C, const Box& box, int rows, int cols, uint8_t* out)
    : C_(C), rows_(rows), cols_(cols), out_(out) {
  // A clipped box is a picture of its own (PIL's crop, then resize): shift to it.
  int width = W, height = H;
  double bx = box.x, by = box.y;
  if (box.clip) {
    x0_ = static_cast<int>(box.x);
    y0_ = static_cast<int>(box.y);
    width = std::max(1, std::min(W - x0_, static_cast<int>(std::lround(box.w))));
    height = std::max(1, std::min(H - y0_, static_cast<int>(std::lround(box.h))));
    bx -= x0_;
    by -= y0_;
  }
  horizontal_ = Coefficients(width, bx, bx + box.w, cols);
  vertical_ = Coefficients(height, by, by + box.h, rows);
  // PIL skips an axis whose size and box leave it as it is.
  need_h_ = cols != width || bx != 0 || box.w != width;
  need_v_ = rows != height || by != 0 || box.h != height;
  bx_ = static_cast<int>(bx);
  // The source rows the vertical pass reads (box-local), through the horizontal pass first.
  y_first_ = need_v_ ? vertical_.first[0] : static_cast<int>(by);
  y_last_ = need_v_ ? vertical_.first[rows - 1] + vertical_.count[rows - 1] : y_first_ + rows;
  int ring = 1;
  if (need_v_) {
    for (int y = 0; y < rows; ++y) ring = std::max(ring, vertical_.count[y]);
  }
  ring_ = std::min(ring, std::max(1, y_last_ - y_first_));
  middle_.resize(static_cast<size_t>(ring_) * cols * C);
  sums_.resize(static_cast<size_t>(cols) * C);
}

void RowResampler::AddRow(int y, const uint8_t* line, ptrdiff_t col_step, ptrdiff_t channel_step) {
  const int ly = y - y0_;  // box-local
  if (ly < y_first_ || ly >= y_last_ || ly <= last_) return;
  line += static_cast<ptrdiff_t>(x0_) * col_step;
  uint8_t* to = middle_.data() + static_cast<size_t>((ly - y_first_) % ring_) * cols_ * C_;
  const int C = C_, cols = cols_;
  // Horizontal: to cols wide (channel-interleaved here).
  if (!need_h_) {
    for (int x = 0; x < cols; ++x) {
      for (int c = 0; c < C; ++c) to[x * C + c] = line[(static_cast<ptrdiff_t>(bx_) + x) * col_step + c * channel_step];
    }
  } else {
    const bool interleaved3 = C == 3 && col_step == 3 && channel_step == 1;
    for (int x = 0; x < cols; ++x) {
      const int first = horizontal_.first[x], count = horizontal_.count[x];
      const int32_t* k = horizontal_.weights.data() + static_cast<size_t>(x) * horizontal_.width;
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
  last_ = ly;
  // Every output row whose source rows have all come.
  while (next_ < rows_ &&
         (need_v_ ? vertical_.first[next_] + vertical_.count[next_] : y_first_ + next_ + 1) <= ly + 1) {
    EmitRow(next_++);
  }
}

void RowResampler::EmitRow(int y) {
  // Vertical: a whole output row at a time (each tap a contiguous row of sums), into the planes;
  // a tap on a row that never came (a picture that ended early) counts nothing.
  const size_t plane = static_cast<size_t>(rows_) * cols_, row_bytes = static_cast<size_t>(cols_) * C_;
  uint8_t* const plane_row = out_ + static_cast<size_t>(y) * cols_;
  auto ring_row = [&](int ly) { return middle_.data() + static_cast<size_t>((ly - y_first_) % ring_) * row_bytes; };
  auto have = [&](int ly) { return ly >= y_first_ && ly <= last_ && ly > last_ - ring_; };
  if (!need_v_) {
    const int ly = y_first_ + y;
    for (int x = 0; x < cols_; ++x) {
      for (int c = 0; c < C_; ++c) plane_row[c * plane + x] = have(ly) ? ring_row(ly)[x * C_ + c] : 0;
    }
    return;
  }
  const int first = vertical_.first[y], count = vertical_.count[y];
  const int32_t* k = vertical_.weights.data() + static_cast<size_t>(y) * vertical_.width;
  int32_t* __restrict acc = sums_.data();
  std::fill(sums_.begin(), sums_.end(), 1 << (kPrecisionBits - 1));
  for (int t = 0; t < count; ++t) {
    if (!have(first + t)) continue;
    const uint8_t* __restrict row = ring_row(first + t);
    const int32_t w = k[t];
    for (size_t i = 0; i < row_bytes; ++i) acc[i] += row[i] * w;
  }
  for (int x = 0; x < cols_; ++x) {
    for (int c = 0; c < C_; ++c) plane_row[c * plane + x] = Clip8(acc[x * C_ + c]);
  }
}

void RowResampler::Finish() {
  while (next_ < rows_) EmitRow(next_++);
}

void ResampleBox(const uint8_t* src, int W, int H, int C, ptrdiff_t col_step, ptrdiff_t row_step,
                 ptrdiff_t channel_step, const Box& box, int rows, int cols, uint8_t* out) {
  RowResampler r(W, H, C, box, rows, cols, out);
  for (int y = r.first_row(); y < std::min(H, r.end_row()); ++y) {
    r.AddRow(y, src + static_cast<ptrdiff_t>(y) * row_step, col_step, channel_step);
  }
  r.Finish();
}

namespace {

// A JPEG decoded only as far as `o`'s box needs: at the smallest DCT scale at which the box still
// covers the output, its rows and (to the next iMCU boundary) columns only, each row resampled as
// it comes.
Status DecodeJpegView(std::string_view bytes, const std::string& path, const ViewOptions& o, uint64_t draw,
                      uint8_t* out, ViewTimes* times) {
  JpegSession s;
  std::vector<uint8_t> line;  // before setjmp: their destructors run after a jump too
  std::optional<RowResampler> resample;
  if (setjmp(s.jump)) return s.Failed(path);
  const double start = Now();
  double resized = 0;
  s.Start(bytes);
  RETURN_IF_ERROR(s.ReadHeader(path));
  jpeg_decompress_struct& cinfo = s.cinfo;
  const int W = static_cast<int>(cinfo.image_width), H = static_cast<int>(cinfo.image_height);
  const Box box = ViewBox(W, H, o, draw);
  // The smallest scale (1/8 .. 1) at which the box is still at least the output's size.
  int denom = 8;
  while (denom > 1 && (box.w / denom < o.cols || box.h / denom < o.rows)) denom /= 2;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(denom);
  const bool cmyk = s.Cmyk();
  cinfo.out_color_space = cmyk ? JCS_CMYK : o.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int sw = static_cast<int>(cinfo.output_width), sh = static_cast<int>(cinfo.output_height);
  const double fx = double(sw) / W, fy = double(sh) / H;
  // The scaled box, and the pixels around it the filter reads (unless it is clipped to the box),
  // and one more: a cropped decode's first and last columns are upsampled without their
  // neighbours' chroma, so they differ from a whole decode's.
  const Box scaled{box.x * fx, box.y * fy, box.w * fx, box.h * fy, box.clip};
  const int margin =
      (box.clip ? 0 : static_cast<int>(std::ceil(std::max(scaled.w / o.cols, scaled.h / o.rows))) + 2) + 1;
  int x0 = std::clamp(static_cast<int>(std::floor(scaled.x)) - margin, 0, sw - 1);
  const int x1 = std::clamp(static_cast<int>(std::ceil(scaled.x + scaled.w)) + margin, x0 + 1, sw);
  const int y0 = std::clamp(static_cast<int>(std::floor(scaled.y)) - margin, 0, sh - 1);
  const int y1 = std::clamp(static_cast<int>(std::ceil(scaled.y + scaled.h)) + margin, y0 + 1, sh);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), cw = static_cast<JDIMENSION>(x1 - x0);
  if (cw < static_cast<JDIMENSION>(sw)) jpeg_crop_scanline(&cinfo, &xoff, &cw);  // widened to iMCU bounds
  x0 = static_cast<int>(xoff);
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));
  const int rows_needed = y1 - y0;
  Box local = scaled;
  local.x -= x0;
  local.y -= y0;
  resample.emplace(static_cast<int>(cw), rows_needed, o.channels, local, o.rows, o.cols, out);
  line.resize(static_cast<size_t>(cw) * cinfo.output_components);
  for (int r = 0; r < rows_needed; ++r) {
    JSAMPROW row = line.data();
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) break;
    if (cmyk) s.FromCmyk(line.data(), cw, o.channels);  // to RGB (or luma) in place, as PIL
    const double at = Now();
    resample->AddRow(r, line.data(), o.channels, 1);
    resized += Now() - at;
  }
  jpeg_abort_decompress(&cinfo);
  resample->Finish();
  if (times) {
    times->decode += Now() - start - resized;
    times->resize += resized;
  }
  return Status::Ok();
}

// One row's pixels to `to_channels`: grey repeated for colour, colour to luma (ITU-R BT.601).
void ToChannelsRow(const uint8_t* in, int channels, int cols, uint8_t* out, int to_channels) {
  for (int x = 0; x < cols; ++x) {
    const uint8_t* p = in + x * channels;
    if (to_channels == 1) {
      out[x] = Luma(p[0], p[1], p[2]);
    } else {
      for (int c = 0; c < to_channels; ++c) out[x * to_channels + c] = p[0];
    }
  }
}

}  // namespace

Status DecodeView(std::string_view bytes, const std::string& path, const ViewOptions& o, uint64_t draw, uint8_t* out,
                  ViewTimes* times) {
  if (IsJpeg(bytes)) return DecodeJpegView(bytes, path, o, draw, out, times);
  const double start = Now();
  double resized = 0;
  std::optional<RowResampler> resample;
  std::vector<uint8_t> converted;
  int channels = 0, cols = 0;
  RETURN_IF_ERROR(DecodeRows(
      bytes, path,
      [&](const PictureSize& size) {
        channels = size.channels;
        cols = size.cols;
        resample.emplace(size.cols, size.rows, o.channels, ViewBox(size.cols, size.rows, o, draw), o.rows, o.cols, out);
        if (channels != o.channels) converted.resize(static_cast<size_t>(size.cols) * o.channels);
        return Status::Ok();
      },
      [&](int y, const uint8_t* row) {
        const double at = Now();
        if (channels != o.channels) {
          ToChannelsRow(row, channels, cols, converted.data(), o.channels);
          row = converted.data();
        }
        resample->AddRow(y, row, o.channels, 1);
        resized += Now() - at;
      }));
  resample->Finish();
  if (times) {
    times->decode += Now() - start - resized;
    times->resize += resized;
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
  ResampleBox(in.pixels.data(), in.cols, in.rows, in.channels, 1, in.cols, plane, CenterBox(in.cols, in.rows, o),
              o.rows, o.cols, out.pixels.data());
  return out;
}

}  // namespace trainctl::data
