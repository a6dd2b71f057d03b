// The image pipeline's parts: the views (against what torchvision's transforms make of the same
// pictures, by Debian's python3-torchvision), the decoding of JPEGs (DCT-scaled, cropped, CMYK),
// the streamed folder (the same crops whatever the threads, prefetching or order; bad files;
// memory), and the file list's cache.
#include "data/image_view.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>

#include "data/dataset.h"
#include "data/file_list.h"
#include "data/image_stream.h"
#include "tests/test_util.h"

namespace trainctl::data {
namespace {

namespace fs = std::filesystem;

// A picture as photographs go: gradients, hard edges (a checkerboard of 17 x 23 pixel cells), and
// a little sensor noise. Interleaved RGB.
std::vector<uint8_t> Picture(int rows, int cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> rgb(static_cast<size_t>(rows) * cols * 3);
  for (int y = 0; y < rows; ++y) {
    for (int x = 0; x < cols; ++x) {
      const bool edge = ((x / 17) + (y / 23)) % 2 == 0;
      for (int c = 0; c < 3; ++c) {
        const int v = x * 150 / cols + y * 40 / rows + c * 20 + (edge ? 30 : 0) + static_cast<int>(rng() % 9) - 4;
        rgb[(static_cast<size_t>(y) * cols + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
    }
  }
  return rgb;
}

std::string Ppm(const std::vector<uint8_t>& rgb, int rows, int cols) {
  return "P6\n" + std::to_string(cols) + " " + std::to_string(rows) + "\n255\n" +
         std::string(reinterpret_cast<const char*>(rgb.data()), rgb.size());
}

std::string Jpeg420(const std::vector<uint8_t>& rgb, int rows, int cols, int quality) {
  tjhandle h = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(h, rgb.data(), cols, 0, rows, TJPF_RGB, &out, &size, TJSAMP_420, quality, 0), 0);
  std::string bytes(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(h);
  return bytes;
}

struct Diff {
  int max = 0;
  double mean = 0;
};
Diff Compare(const std::vector<uint8_t>& a, const std::string& b) {
  Diff d;
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const int e = std::abs(int(a[i]) - int(static_cast<uint8_t>(b[i])));
    d.max = std::max(d.max, e);
    d.mean += e;
  }
  d.mean /= std::max<size_t>(1, a.size());
  return d;
}

// Pictures of several sizes, each as a lossless PPM and a JPEG, through the centre view (224 at
// 0.875: Resize(256), CenterCrop(224); 64 at 1) and RandomResizedCrop's boxes: within one level
// of torchvision's bytes (the PPMs: PIL's resampling, in its fixed point; the JPEGs decoded as PIL
// decodes them, where no DCT scaling applies), and close where it does (a picture 4x the output).
TEST(ImageView, TheViewsAreTorchvisionsWithinOneLevel) {
  testing::Scratch s;
  struct Pic {
    int cols, rows;
  };
  const std::vector<Pic> pics = {{333, 500}, {500, 375}, {224, 224}, {97, 61}, {640, 427}, {1600, 1200}};
  nlohmann::json cases = nlohmann::json::array();
  struct Want {
    std::string file;
    ViewOptions view;
    uint64_t draw;
    bool scaled;  // DCT scaling applies
  };
  std::vector<Want> wants;
  for (size_t p = 0; p < pics.size(); ++p) {
    const auto rgb = Picture(pics[p].rows, pics[p].cols, static_cast<uint32_t>(p));
    for (const char* ext : {"ppm", "jpg"}) {
      const std::string name = "pic" + std::to_string(p) + "." + ext;
      s.Write(name, std::string(ext) == "ppm" ? Ppm(rgb, pics[p].rows, pics[p].cols)
                                              : Jpeg420(rgb, pics[p].rows, pics[p].cols, 90));
      for (const auto& [size, pct] : std::vector<std::pair<int, double>>{{224, 0.875}, {64, 1.0}}) {
        ViewOptions v;
        v.rows = v.cols = size;
        v.crop_pct = pct;
        cases.push_back({{"file", name}, {"size", {size, size}}, {"crop_pct", pct}});
        const Box b = CenterBox(pics[p].cols, pics[p].rows, v);
        wants.push_back({name, v, 0, std::string(ext) == "jpg" && (b.w / 2 >= size && b.h / 2 >= size)});
      }
      for (uint64_t draw = 1; draw <= 3; ++draw) {
        ViewOptions v;
        v.random_resized_crop = true;
        v.rows = v.cols = 96;
        const Box b = RandomResizedBox(pics[p].cols, pics[p].rows, v, draw * 7919);
        cases.push_back({{"file", name},
                         {"size", {96, 96}},
                         {"box", {int(b.y), int(b.x), int(std::lround(b.h)), int(std::lround(b.w))}}});
        wants.push_back({name, v, draw * 7919, std::string(ext) == "jpg" && (b.w / 2 >= 96 && b.h / 2 >= 96)});
      }
    }
  }
  s.Write("cases.json", cases.dump());
  auto r = testing::RunProgram(
      {TRAINCTL_TEST_PYTHON, std::string(TRAINCTL_SOURCE_DIR) + "/tests/python/view_reference.py", s.path("")},
      s.path(""));
  ASSERT_EQ(r.exit.code, 0) << r.output;
  int scaled = 0;
  for (size_t k = 0; k < wants.size(); ++k) {
    const Want& w = wants[k];
    SCOPED_TRACE(cases[k].dump());
    std::vector<uint8_t> ours(static_cast<size_t>(3 * w.view.rows * w.view.cols));
    ViewTimes times;
    ASSERT_TRUE(DecodeView(s.Read(w.file), w.file, w.view, w.draw, ours.data(), &times).ok());
    const Diff d = Compare(ours, s.Read(w.file + "." + std::to_string(k) + ".raw"));
    if (w.scaled) {
      ++scaled;
      EXPECT_LE(d.mean, 3.0);  // decoded at 1/2 or less by the DCT, then resampled
    } else {
      EXPECT_LE(d.max, 1);
    }
  }
  EXPECT_GT(scaled, 0) << "no case was DCT-scaled";
}

// RandomResizedCrop's boxes: inside the picture, of an area share in scale and a ratio in ratio
// (else the central crop of the nearest ratio, as torchvision falls back), the same for the same
// draw; their areas spread over the range.
TEST(ImageView, RandomResizedBoxesKeepTheirScaleAndRatio) {
  ViewOptions v;
  v.random_resized_crop = true;
  double mean = 0;
  std::set<std::pair<int, int>> corners;
  for (uint64_t draw = 0; draw < 5000; ++draw) {
    const Box b = RandomResizedBox(500, 375, v, ImageDraw(1, 0, static_cast<int64_t>(draw)));
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.y, 0);
    ASSERT_LE(b.x + b.w, 500);
    ASSERT_LE(b.y + b.h, 375);
    const double share = b.w * b.h / (500.0 * 375);
    EXPECT_GE(share, 0.075);
    EXPECT_LE(b.w / b.h, 4.0 / 3 + 0.02);
    EXPECT_GE(b.w / b.h, 3.0 / 4 - 0.02);
    mean += share / 5000;
    corners.insert({int(b.x), int(b.y)});
    const Box again = RandomResizedBox(500, 375, v, ImageDraw(1, 0, static_cast<int64_t>(draw)));
    EXPECT_EQ(again.x, b.x);
    EXPECT_EQ(again.w, b.w);
  }
  EXPECT_GT(mean, 0.35);
  EXPECT_LT(mean, 0.6);
  EXPECT_GT(corners.size(), 2000u);
  // A panorama no box of ratio 4/3 or less fits ten times: the central crop of ratio 4/3.
  const Box wide = RandomResizedBox(1000, 100, v, 12345);
  if (wide.w == 133) {
    EXPECT_EQ(wide.h, 100);
    EXPECT_EQ(wide.x, (1000 - 133) / 2);
  }
  // Different epochs draw differently.
  EXPECT_NE(ImageDraw(1, 0, 5), ImageDraw(1, 1, 5));
  EXPECT_NE(ImageDraw(1, 0, 5), ImageDraw(2, 0, 5));
}

// A CMYK JPEG (Photoshop's, inverted, with its Adobe marker) decodes to the RGB PIL makes of it;
// a header that declares 30000 x 30000 pixels is refused before anything is decoded.
TEST(ImageView, CmykJpegsAsPilAndHugeHeadersRefused) {
  testing::Scratch s;
  auto made = testing::RunProgram(
      {TRAINCTL_TEST_PYTHON, "-c",
       "import sys, numpy as np\nfrom PIL import Image\n"
       "a = (np.arange(48 * 64 * 4) * 7 % 256).astype(np.uint8).reshape(48, 64, 4)\n"
       "Image.fromarray(a, 'CMYK').save(sys.argv[1] + '/cmyk.jpg', quality=95)\n"
       "rgb = np.asarray(Image.open(sys.argv[1] + '/cmyk.jpg').convert('RGB')).transpose(2, 0, 1).copy()\n"
       "rgb.tofile(sys.argv[1] + '/cmyk.raw')\n",
       s.path("")},
      s.path(""));
  ASSERT_EQ(made.exit.code, 0) << made.output;
  ViewOptions v;
  v.rows = 48, v.cols = 64, v.crop_pct = 1;
  std::vector<uint8_t> ours(3 * 48 * 64);
  ASSERT_TRUE(DecodeView(s.Read("cmyk.jpg"), "cmyk.jpg", v, 0, ours.data()).ok());
  EXPECT_LE(Compare(ours, s.Read("cmyk.raw")).max, 1);
  // The frame header's size set to 30000 x 30000.
  std::string huge = Jpeg420(Picture(16, 16, 1), 16, 16, 90);
  const size_t sof = huge.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  huge[sof + 5] = huge[sof + 7] = static_cast<char>(30000 >> 8);
  huge[sof + 6] = huge[sof + 8] = static_cast<char>(30000 & 0xff);
  auto refused = DecodeView(huge, "huge.jpg", v, 0, ours.data());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.message(), "huge.jpg: its header declares 30000x30000 pixels; at most 2^26 are decoded");
  EXPECT_FALSE(DecodeView(std::string("\xff\xd8\xff\xe0 not really", 15), "bad.jpg", v, 0, ours.data()).ok());
}

// A folder of `classes` x `per_class` JPEGs of varied sizes, class c's pictures tinted by c.
void MakeFolder(const testing::Scratch& s, const std::string& dir, int classes, int per_class) {
  for (int c = 0; c < classes; ++c) {
    fs::create_directories(s.path(dir + "/class" + std::to_string(c)));
    for (int i = 0; i < per_class; ++i) {
      const int rows = 40 + (i * 7) % 50, cols = 40 + (i * 13) % 60;
      auto rgb = Picture(rows, cols, static_cast<uint32_t>(c * 1000 + i));
      for (size_t k = 0; k < rgb.size(); k += 3) rgb[k] = static_cast<uint8_t>(c * 40);
      s.Write(dir + "/class" + std::to_string(c) + "/" + std::to_string(i) + ".jpg", Jpeg420(rgb, rows, cols, 90));
    }
  }
}

std::shared_ptr<ImageStream> Stream(const std::string& dir, int threads, const std::string& skipped = "",
                                    bool fail = false) {
  auto list = ListImageFolder(dir, ListOptions{});
  EXPECT_TRUE(list.ok()) << list.status().message();
  StreamOptions o;
  o.view.rows = o.view.cols = 32;
  o.view.random_resized_crop = true;
  o.threads = threads;
  o.seed = 42;
  o.skipped_file = skipped;
  o.fail_on_bad = fail;
  return std::make_shared<ImageStream>(std::make_shared<const FileList>(std::move(*list)), o);
}

// The same images of the same epoch decode to the same bytes with one thread or four, asked
// ahead (Prefetch) or not, in another order; another epoch draws other crops.
TEST(ImageStream, AnImagesCropIsItsOwnWhateverTheThreadsAndOrder) {
  testing::Scratch s;
  MakeFolder(s, "pics", 3, 12);
  auto one = Stream(s.path("pics"), 1), four = Stream(s.path("pics"), 4);
  const int64_t bytes = one->image_bytes();
  std::vector<int64_t> idx(16);
  std::iota(idx.begin(), idx.end(), 10);
  std::vector<uint8_t> a(16 * bytes), b(16 * bytes), c(16 * bytes), e(16 * bytes);
  std::vector<uint16_t> la(16), lb(16), lc(16), le(16);
  ASSERT_TRUE(one->Get(idx.data(), 16, 3, a.data(), la.data()).ok());
  four->Prefetch(idx.data(), 16, 3);
  ASSERT_TRUE(four->Get(idx.data(), 16, 3, b.data(), lb.data()).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
  std::vector<int64_t> reversed(idx.rbegin(), idx.rend());
  ASSERT_TRUE(four->Get(reversed.data(), 16, 3, c.data(), lc.data()).ok());
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(std::equal(a.begin() + i * bytes, a.begin() + (i + 1) * bytes, c.begin() + (15 - i) * bytes)) << i;
    EXPECT_EQ(la[i], lc[15 - i]);
    EXPECT_EQ(la[i], one->list().Label(idx[i]));
  }
  ASSERT_TRUE(one->Get(idx.data(), 16, 4, e.data(), le.data()).ok());
  EXPECT_NE(a, e) << "another epoch, the same crops";
  EXPECT_EQ(one->Stats().images, 32);
}

// A file that does not decode is replaced by the next that does (its label with it), named once
// in the skipped file; with fail_on_bad the batch fails naming it.
TEST(ImageStream, BadFilesAreReplacedAndNamedOrFailTheBatch) {
  testing::Scratch s;
  MakeFolder(s, "pics", 2, 6);
  s.Write("pics/class0/broken.jpg", "\xff\xd8\xff\xe0 and nothing");
  s.Write("pics/class1/empty.png", "");
  auto stream = Stream(s.path("pics"), 2, s.path("skipped.txt"));
  const FileList& list = stream->list();
  std::vector<int64_t> all(static_cast<size_t>(list.size()));
  std::iota(all.begin(), all.end(), 0);
  std::vector<uint8_t> px(all.size() * stream->image_bytes());
  std::vector<uint16_t> labels(all.size());
  for (int epoch = 0; epoch < 2; ++epoch) {
    ASSERT_TRUE(stream->Get(all.data(), list.size(), epoch, px.data(), labels.data()).ok());
  }
  const auto skipped = stream->TakeSkipped();
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(testing::CountLines(s.Read("skipped.txt"), "broken.jpg"), 1);
  EXPECT_EQ(testing::CountLines(s.Read("skipped.txt"), "empty.png"), 1);
  for (int64_t i = 0; i < list.size(); ++i) {
    const std::string name(list.Name(i));
    const bool bad = name.find("broken") != std::string::npos || name.find("empty") != std::string::npos;
    if (bad) {
      EXPECT_EQ(labels[i], list.Label((i + 1) % list.size())) << "the replacement's label";
    } else {
      EXPECT_EQ(labels[i], list.Label(i));
      EXPECT_NEAR(px[i * stream->image_bytes() + 100], list.Label(i) * 40, 8) << "the red plane holds the class";
    }
  }
  auto strict = Stream(s.path("pics"), 2, "", true);
  auto failed = strict->Get(all.data(), list.size(), 0, px.data(), labels.data());
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("(data.bad_images: fail)"), std::string::npos) << failed.message();
}

// Streaming an epoch of 10x as many files (the same pictures linked again) takes no more memory:
// nothing of a picture is kept past its batch.
TEST(ImageStream, MemoryDoesNotGrowWithTheNumberOfImages) {
  testing::Scratch s;
  MakeFolder(s, "pics", 2, 50);
  for (int copy = 1; copy < 40; ++copy) {
    for (int c = 0; c < 2; ++c) {
      for (int i = 0; i < 50; ++i) {
        const std::string from = s.path("pics/class" + std::to_string(c) + "/" + std::to_string(i) + ".jpg");
        fs::create_hard_link(from, s.path("pics/class" + std::to_string(c) + "/" + std::to_string(copy) + "-" +
                                          std::to_string(i) + ".jpg"));
      }
    }
  }
  auto peak_mb = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;
  };
  const long before = peak_mb();
  auto stream = Stream(s.path("pics"), 2);
  ASSERT_EQ(stream->list().size(), 4000);
  std::vector<int64_t> idx(64);
  std::vector<uint8_t> px(64 * stream->image_bytes());
  std::vector<uint16_t> labels(64);
  for (int64_t first = 0; first + 64 <= 4000; first += 64) {
    std::iota(idx.begin(), idx.end(), first);
    ASSERT_TRUE(stream->Get(idx.data(), 64, 0, px.data(), labels.data()).ok());
  }
  // Kept, 4000 pictures of 32x32x3 would be 12 MiB; the list is some 100 KiB.
  EXPECT_LT(peak_mb() - before, 8) << "MiB grown streaming 4000 pictures";
}

// The list is kept in the cache and read from it while no class folder changes; a file added to
// one folder has that folder listed again, and is in the list.
TEST(FileList, TheListIsCachedAndFollowsItsFolders) {
  testing::Scratch s;
  MakeFolder(s, "pics", 3, 4);
  ListOptions o;
  o.cache_dir = s.path("cache");
  ListReport first, second, third;
  auto a = ListImageFolder(s.path("pics"), o, &first);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->size(), 12);
  EXPECT_EQ(first.listed, 3);
  EXPECT_FALSE(first.from_cache);
  ASSERT_EQ(std::distance(fs::directory_iterator(s.path("cache")), fs::directory_iterator()), 1);
  auto b = ListImageFolder(s.path("pics"), o, &second);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(second.from_cache);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(a->Name(i), b->Name(i));
  s.Write("pics/class1/new.jpg", s.Read("pics/class1/0.jpg"));
  auto c = ListImageFolder(s.path("pics"), o, &third);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(third.listed, 1);
  EXPECT_EQ(c->size(), 13);
  // An empty class folder is refused, as torchvision's ImageFolder refuses it.
  fs::create_directories(s.path("pics/class9"));
  auto empty = ListImageFolder(s.path("pics"), o);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("pics/class9: an empty class folder"), std::string::npos)
      << empty.status().message();
}

}  // namespace
}  // namespace trainctl::data
