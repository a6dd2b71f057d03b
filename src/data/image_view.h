// How a picture of any size becomes a model's input of channels x rows x cols, as torchvision's
// transforms make it, fast: which box of the picture (a centre crop after a resize, or
// RandomResizedCrop's random box), decoded only as far as that box needs (a JPEG at 1/2, 1/4 or
// 1/8 of its size by libjpeg-turbo's DCT scaling when the box still covers the output there, and
// only the box's rows and columns), then resampled to the output in one pass per axis with PIL's
// bilinear filter (antialiased: every source pixel under the output pixel counts), which
// torchvision's PIL-based transforms use. The result is uint8, planar (C, H, W).
//
// The box's randomness comes from a 64-bit draw (a hash of seed, epoch and the image's index), so
// an image's crop is the same whichever worker, restart or world size decodes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace trainctl::data {

struct ImageSet;

struct ViewOptions {
  int channels = 3, rows = 224, cols = 224;
  // The centre view (evaluation; training without random_resized_crop): the picture resized so
  // that it covers rows / crop_pct x cols / crop_pct, then the centre rows x cols cropped:
  // torchvision's Resize(int(224 / 0.875) = 256) and CenterCrop(224) at 0.875, a resize that just
  // covers the output at 1.
  double crop_pct = 1.0;
  // Training: torchvision's RandomResizedCrop(scale, ratio) instead: a box of a random share of
  // the picture's area (scale) and aspect ratio (ratio, log-uniform), resized to the output.
  bool random_resized_crop = false;
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4, ratio_max = 4.0 / 3;
};

// A box of a picture, in its pixels. `clip`: the resampling filter reads only inside the box
// (RandomResizedCrop crops, then resizes); else it may read the pixels around it (Resize, then
// CenterCrop).
struct Box {
  double x = 0, y = 0, w = 0, h = 0;
  bool clip = false;
};

// torchvision's Resize + CenterCrop geometry for a cols x rows... picture of width `W`, height `H`.
Box CenterBox(int W, int H, const ViewOptions& o);
// torchvision's RandomResizedCrop.get_params (ten tries, then the central crop of the nearest
// ratio), its uniform numbers drawn from `draw` instead of torch's generator.
Box RandomResizedBox(int W, int H, const ViewOptions& o, uint64_t draw);
// The box for this view: RandomResizedBox when o.random_resized_crop, else CenterBox.
Box ViewBox(int W, int H, const ViewOptions& o, uint64_t draw);

// Resamples `box` of a picture of W x H pixels with C channels (pixel (x, y) channel c at
// src[y * row_step + x * col_step + c * channel_step]) to `cols` x `rows` with PIL's bilinear
// filter, as Image.resize((cols, rows), BILINEAR, box) does (its fixed-point arithmetic included:
// the same bytes), into `out`: C planes of rows x cols. With box.clip the picture is taken to end
// at the box.
void ResampleBox(const uint8_t* src, int W, int H, int C, ptrdiff_t col_step, ptrdiff_t row_step,
                 ptrdiff_t channel_step, const Box& box, int rows, int cols, uint8_t* out);

// ResampleBox fed a row at a time, in order, as a decoder makes them: it holds only the rows the
// filter's taps span (for 8192 source rows to 224, some 75), and writes each output row as soon
// as the source rows under it have come. Rows outside first_row()..end_row() are ignored.
class RowResampler {
 public:
  RowResampler(int W, int H, int C, const Box& box, int rows, int cols, uint8_t* out);
  int first_row() const { return y0_ + y_first_; }
  int end_row() const { return y0_ + y_last_; }
  // Source row `y` (pixel x channel c at line[x * col_step + c * channel_step]).
  void AddRow(int y, const uint8_t* line, ptrdiff_t col_step, ptrdiff_t channel_step);
  // Writes the output rows still to come (from the rows that came: none for a row that did not).
  void Finish();

  // One axis's filter: for output pixel i, count[i] weights from source pixel first[i] on.
  struct Taps {
    std::vector<int> first, count;
    std::vector<int32_t> weights;  // count.size() x `width`
    int width = 0;
  };

 private:
  void EmitRow(int y);
  int C_, rows_, cols_;
  uint8_t* out_;
  int x0_ = 0, y0_ = 0, bx_ = 0;
  bool need_h_ = true, need_v_ = true;
  Taps horizontal_, vertical_;
  int y_first_ = 0, y_last_ = 0, ring_ = 1, last_ = -1, next_ = 0;
  std::vector<uint8_t> middle_;  // ring_ rows of the horizontal pass
  std::vector<int32_t> sums_;
};

// Time spent in each stage of DecodeView, in seconds (added to).
struct ViewTimes {
  double decode = 0, resize = 0;
};

// Decodes the picture in `bytes` (JPEG, PNG, PGM, PPM) into the view `o` with draw `draw`: `out`
// receives o.channels x o.rows x o.cols bytes. Grey pictures are repeated for 3 channels, colour
// ones taken to luma (ITU-R BT.601) for 1; CMYK JPEGs (Photoshop's, inverted or not) are
// converted as PIL converts them. A picture whose header declares more than 2^26 pixels is
// refused before any is decoded. Errors name `path`.
Status DecodeView(std::string_view bytes, const std::string& path, const ViewOptions& o, uint64_t draw, uint8_t* out,
                  ViewTimes* times = nullptr);

// An ImageSet of one picture (any size) brought to the view: for predict, as the images were.
Result<ImageSet> ApplyView(const ImageSet& one, const ViewOptions& o);

// The 64-bit draw of image `index` in `epoch` for a run seeded `seed` (splitmix64 of the three).
uint64_t ImageDraw(uint64_t seed, int64_t epoch, int64_t index);

}  // namespace trainctl::data
