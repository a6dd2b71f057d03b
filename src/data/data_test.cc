#include <gtest/gtest.h>
#include <turbojpeg.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "data/dataset.h"
#include "data/sampler.h"
#include "tests/test_util.h"

namespace trainctl::data {
namespace {

std::string BigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// An idx3 image file and idx1 label file of `n` images of 2x3 pixels, pixel value = image index.
std::pair<std::string, std::string> IdxFiles(uint32_t n, uint32_t labels_n) {
  std::string images = BigEndian(0x803) + BigEndian(n) + BigEndian(2) + BigEndian(3);
  for (uint32_t i = 0; i < n; ++i) images += std::string(6, static_cast<char>(i));
  std::string labels = BigEndian(0x801) + BigEndian(labels_n);
  for (uint32_t i = 0; i < labels_n; ++i) labels += static_cast<char>(i % 10);
  return {images, labels};
}

void WriteGzip(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, data.data(), static_cast<unsigned>(data.size())), static_cast<int>(data.size()));
  gzclose(f);
}

TEST(Idx, RealFashionMnistFromTheDebianPackage) {
  auto train = LoadMnistDir(kFashionMnistDir, true);
  ASSERT_TRUE(train.ok()) << train.status().message() << " (apt-get install dataset-fashion-mnist)";
  EXPECT_EQ(train->count, 60000);
  EXPECT_EQ(train->rows, 28);
  EXPECT_EQ(train->cols, 28);
  EXPECT_EQ(train->num_classes, 10);
  EXPECT_EQ(train->pixels.size(), 60000u * 784);
  // Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
  std::vector<int> per_class(10);
  for (uint8_t l : train->labels) ++per_class[l];
  EXPECT_EQ(per_class, std::vector<int>(10, 6000));
  auto test = LoadMnistDir(kFashionMnistDir, false);
  ASSERT_TRUE(test.ok()) << test.status().message();
  EXPECT_EQ(test->count, 10000);
  std::fill(per_class.begin(), per_class.end(), 0);
  for (uint8_t l : test->labels) ++per_class[l];
  EXPECT_EQ(per_class, std::vector<int>(10, 1000));
  EXPECT_EQ(FashionMnistClasses()[7], "Sneaker");
}

TEST(Idx, RawAndGzipReadTheSame) {
  testing::Scratch s;
  auto [images, labels] = IdxFiles(5, 5);
  s.Write("raw-images", images);
  s.Write("raw-labels", labels);
  WriteGzip(s.path("gz-images.gz"), images);
  WriteGzip(s.path("gz-labels.gz"), labels);
  auto raw = LoadIdx(s.path("raw-images"), s.path("raw-labels"));
  auto gz = LoadIdx(s.path("gz-images.gz"), s.path("gz-labels.gz"));
  ASSERT_TRUE(raw.ok()) << raw.status().message();
  ASSERT_TRUE(gz.ok()) << gz.status().message();
  EXPECT_EQ(raw->pixels, gz->pixels);
  EXPECT_EQ(raw->labels, gz->labels);
  EXPECT_EQ(raw->count, 5);
  EXPECT_EQ(raw->image(3)[5], 3);
  EXPECT_EQ(raw->labels[4], 4);
}

TEST(Idx, AGzipFileOfTwoMembersIsReadWhole) {
  // Read into a buffer sized from the gzip trailer: here the last member's size only, so the
  // buffer must grow.
  testing::Scratch s;
  auto [images, labels] = IdxFiles(500, 500);
  WriteGzip(s.path("a.gz"), images.substr(0, images.size() - 7));
  WriteGzip(s.path("b.gz"), images.substr(images.size() - 7));
  s.Write("i.gz", s.Read("a.gz") + s.Read("b.gz"));
  s.Write("l", labels);
  auto set = LoadIdx(s.path("i.gz"), s.path("l"));
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->count, 500);
  EXPECT_EQ(std::string(set->pixels.begin(), set->pixels.end()), images.substr(16));
}

TEST(Idx, BadFilesAreNamedWithWhatIsWrong) {
  testing::Scratch s;
  auto [images, labels] = IdxFiles(5, 5);
  auto expect_error = [&](const std::string& img, const std::string& lab, const std::string& want) {
    s.Write("i", img);
    s.Write("l", lab);
    auto r = LoadIdx(s.path("i"), s.path("l"));
    ASSERT_FALSE(r.ok()) << want;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  };
  expect_error(images.substr(0, images.size() - 7), labels,
               s.path("i") + ": truncated: the header promises 46 bytes, the file has 39");
  expect_error(images + "x", labels, "trailing data");
  expect_error(IdxFiles(5, 20).second, labels, "not an idx3 image file (magic 0x00000801, expected 0x00000803)");
  expect_error(images, IdxFiles(5, 4).second, "has 5 images but " + s.path("l") + " has 4 labels");
  expect_error("abc", labels, "shorter than an idx header");
  // Images of 0 rows: the count (4179886336) would pass every size check (found by dataset_fuzz).
  expect_error(BigEndian(0x803) + BigEndian(0xf9240100) + BigEndian(0) + BigEndian(0x1800), labels,
               s.path("i") + ": the header gives dimension 2 of 3 a size of 0");
  expect_error(images, BigEndian(0x801) + BigEndian(0),
               s.path("l") + ": the header gives dimension 1 of 1 a size of 0");
  auto missing = LoadIdx(s.path("nope"), s.path("l"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(s.path("nope")), std::string::npos);
  // A gzip file cut short.
  WriteGzip(s.path("full.gz"), images);
  std::string gz = s.Read("full.gz");
  s.Write("cut.gz", gz.substr(0, gz.size() / 2));
  auto cut = LoadIdx(s.path("cut.gz"), s.path("l"));
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find(s.path("cut.gz")), std::string::npos) << cut.status().message();
  // A few gzipped bytes whose header declares 100000 images of 28x28 (78 MB): refused by the
  // header, before anything is inflated (issue 49, finding 5).
  WriteGzip(s.path("liar.gz"), BigEndian(0x803) + BigEndian(100000) + BigEndian(28) + BigEndian(28) + "xyz");
  auto liar = LoadIdx(s.path("liar.gz"), s.path("l"));
  ASSERT_FALSE(liar.ok());
  EXPECT_NE(liar.status().message().find(s.path("liar.gz") + ": its header declares 78400016 bytes, more than"),
            std::string::npos)
      << liar.status().message();
}

TEST(Cifar10, ReadsBatchesAndRejectsBrokenOnes) {
  testing::Scratch s;
  auto batch = [](int records, int first_label) {
    std::string out;
    for (int r = 0; r < records; ++r) {
      out += static_cast<char>((first_label + r) % 10);
      out += std::string(3072, static_cast<char>(r));
    }
    return out;
  };
  s.Write("data_batch_1.bin", batch(3, 0));
  s.Write("data_batch_2.bin", batch(2, 7));
  auto set = LoadCifar10({s.path("data_batch_1.bin"), s.path("data_batch_2.bin")});
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->count, 5);
  EXPECT_EQ(set->channels, 3);
  EXPECT_EQ(set->image_bytes(), 3072);
  EXPECT_EQ(set->labels, (std::vector<uint16_t>{0, 1, 2, 7, 8}));
  EXPECT_EQ(set->image(4)[0], 1);
  s.Write("short.bin", batch(2, 0).substr(0, 5000));
  auto shortened = LoadCifar10({s.path("short.bin")});
  ASSERT_FALSE(shortened.ok());
  EXPECT_NE(shortened.status().message().find("not a whole number of CIFAR-10 records"), std::string::npos);
  std::string bad = batch(1, 0);
  bad[0] = 42;
  s.Write("bad.bin", bad);
  auto bad_label = LoadCifar10({s.path("bad.bin")});
  ASSERT_FALSE(bad_label.ok());
  EXPECT_NE(bad_label.status().message().find("record 0 has label 42"), std::string::npos);
}

TEST(Synthetic, AnyShapeReproducibleFromTheSeed) {
  auto a = Synthetic(10, 3, 8, 8, 5, 7), b = Synthetic(10, 3, 8, 8, 5, 7), c = Synthetic(10, 3, 8, 8, 5, 8);
  EXPECT_EQ(a.pixels.size(), 10u * 3 * 8 * 8);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_NE(a.pixels, c.pixels);
  EXPECT_TRUE(std::all_of(a.labels.begin(), a.labels.end(), [](uint8_t l) { return l < 5; }));
}

TEST(Sampler, ShardsAreDisjointEqualAndCoverEverything) {
  for (int world : {1, 2, 3, 7}) {
    std::multiset<int64_t> seen;
    for (int rank = 0; rank < world; ++rank) {
      auto mine = ShardIndices(100, 0, {rank, world, 5});
      EXPECT_EQ(static_cast<int64_t>(mine.size()), ShardSize(100, {rank, world}));
      seen.insert(mine.begin(), mine.end());
    }
    for (int64_t i = 0; i < 100; ++i) EXPECT_GE(seen.count(i), 1u) << "world " << world;
    // Padding repeats at most world-1 items.
    EXPECT_LT(seen.size(), 100u + world);
  }
}

TEST(Sampler, NewShuffleEachEpochSameOnEveryRank) {
  SamplerOptions o{0, 1, 42};
  auto e0 = ShardIndices(1000, 0, o), e0_again = ShardIndices(1000, 0, o), e1 = ShardIndices(1000, 1, o);
  EXPECT_EQ(e0, e0_again);
  EXPECT_NE(e0, e1);
  std::vector<int64_t> sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) EXPECT_EQ(sorted[i], i);
  SamplerOptions plain{0, 1, 42, false};
  EXPECT_EQ(ShardIndices(5, 3, plain), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  SamplerOptions drop{1, 3, 0, false, true};
  EXPECT_EQ(ShardIndices(10, 0, drop), (std::vector<int64_t>{1, 4, 7}));
}

// A step's global batch is the same items whichever rank reads which: the even shards' step s
// is the epoch order's block s.
TEST(Sampler, TheEvenShardsStepsAreTheEpochOrdersBlocks) {
  const int64_t n = 1000, batch = 8;
  for (int world : {2, 3}) {
    std::vector<int64_t> order = EpochOrder(n, 4, {0, world, 9, true, true});
    for (int64_t step = 0; step < 5; ++step) {
      std::multiset<int64_t> shards,
          block(order.begin() + step * batch * world, order.begin() + (step + 1) * batch * world);
      for (int rank = 0; rank < world; ++rank) {
        auto mine = ShardIndices(n, 4, {rank, world, 9, true, true});
        shards.insert(mine.begin() + step * batch, mine.begin() + (step + 1) * batch);
      }
      EXPECT_EQ(shards, block) << "world " << world << ", step " << step;
    }
  }
}

TEST(Sampler, SplitBatchFollowsTheWeightsAndKeepsTheLeastShare) {
  EXPECT_EQ(SplitBatch({1, 1}, 128, 8), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(SplitBatch({2, 1}, 128, 8), (std::vector<int64_t>{85, 43}));            // 85.33, 42.67
  EXPECT_EQ(SplitBatch({1, 1, 1}, 128, 8), (std::vector<int64_t>{43, 43, 42}));     // ties: lower rank
  EXPECT_EQ(SplitBatch({100, 1, 100}, 128, 8), (std::vector<int64_t>{60, 8, 60}));  // at least 8
  EXPECT_EQ(SplitBatch({0, 0}, 10, 1), (std::vector<int64_t>{5, 5}));               // nothing known: even
  EXPECT_EQ(SplitBatch({5, 0}, 10, 3), (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(SplitBatch({}, 10, 1), (std::vector<int64_t>{}));
  // Any rates: the shares sum to the batch, none under the least, the faster never gets fewer.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> rates(1 + rng() % 16);
    for (double& r : rates) r = std::uniform_real_distribution<double>(0.01, 10)(rng);
    const int64_t batch = 16 + rng() % 1000, least = rng() % 8;
    auto shares = SplitBatch(rates, batch, least);
    int64_t sum = 0;
    for (size_t r = 0; r < rates.size(); ++r) {
      sum += shares[r];
      EXPECT_GE(shares[r], std::min<int64_t>(least, batch / int64_t(rates.size())));
      for (size_t q = 0; q < rates.size(); ++q) {
        if (rates[r] > rates[q]) {
          EXPECT_GE(shares[r], shares[q]);
        }
      }
    }
    EXPECT_EQ(sum, batch);
  }
}

}  // namespace
}  // namespace trainctl::data

namespace trainctl::data {
namespace {

std::string Pgm(int rows, int cols, uint8_t value) {
  return "P5\n" + std::to_string(cols) + " " + std::to_string(rows) + "\n255\n" + std::string(rows * cols, char(value));
}

// tjCompress2's JPEG of `pixels` (H x W x channels, interleaved).
std::string Jpeg(const std::vector<uint8_t>& pixels, int rows, int cols, int channels) {
  tjhandle h = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(h, pixels.data(), cols, 0, rows, channels == 1 ? TJPF_GRAY : TJPF_RGB, &out, &size,
                             channels == 1 ? TJSAMP_GRAY : TJSAMP_444, 100, 0);
  std::string bytes = rc == 0 ? std::string(reinterpret_cast<char*>(out), size) : "";
  tjFree(out);
  tjDestroy(h);
  return bytes;
}

TEST(ImageFile, JpegGreyAndColourDecodeToTheirPixels) {
  std::vector<uint8_t> grey(12 * 16);
  for (int i = 0; i < 12 * 16; ++i) grey[i] = static_cast<uint8_t>(i % 16 * 16);
  auto g = DecodeImage(Jpeg(grey, 12, 16, 1), "g.jpg");
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ(g->channels, 1);
  EXPECT_EQ(g->rows, 12);
  EXPECT_EQ(g->cols, 16);
  for (int i = 0; i < 12 * 16; ++i) EXPECT_NEAR(g->pixels[i], grey[i], 3) << i;
  std::vector<uint8_t> rgb(8 * 8 * 3);
  for (int p = 0; p < 64; ++p) rgb[p * 3] = 200, rgb[p * 3 + 1] = 40, rgb[p * 3 + 2] = 90;
  auto c = DecodeImage(Jpeg(rgb, 8, 8, 3), "c.jpg");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->channels, 3);
  EXPECT_NEAR(c->pixels[0], 200, 3);        // red plane
  EXPECT_NEAR(c->pixels[64 + 5], 40, 3);    // green
  EXPECT_NEAR(c->pixels[128 + 63], 90, 3);  // blue
  auto bad = DecodeImage(std::string("\xff\xd8\xff\xe0 not really", 15), "bad.jpg");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("bad.jpg: ", 0), 0u) << bad.status().message();  // its header, or its size
}

TEST(ImageFile, ChannelsAsTorchvisionWould) {
  ImageSet red;
  red.count = 1, red.channels = 3, red.rows = 1, red.cols = 1, red.labels = {0};
  red.pixels = {255, 0, 0};
  EXPECT_EQ(ToChannels(red, 1).pixels, std::vector<uint8_t>{76});  // BT.601 luma of pure red
  ImageSet grey = ToChannels(red, 1);
  EXPECT_EQ(ToChannels(grey, 3).pixels, (std::vector<uint8_t>{76, 76, 76}));
  // A wide image keeps its height and loses the columns at both ends (Resize, CenterCrop).
  ImageSet wide;
  wide.count = 1, wide.channels = 1, wide.rows = 2, wide.cols = 4, wide.labels = {0};
  wide.pixels = {0, 100, 200, 250, 0, 100, 200, 250};
  ViewOptions v;
  v.channels = 1, v.rows = 2, v.cols = 2;
  EXPECT_EQ(ApplyView(wide, v)->pixels, (std::vector<uint8_t>{100, 200, 100, 200}));
  // Enlarged, a flat image stays flat.
  ImageSet flat;
  flat.count = 1, flat.channels = 1, flat.rows = 3, flat.cols = 5, flat.labels = {0};
  flat.pixels.assign(15, 7);
  v.rows = v.cols = 32;
  ImageSet big = *ApplyView(flat, v);
  EXPECT_EQ(big.rows, 32);
  EXPECT_TRUE(std::all_of(big.pixels.begin(), big.pixels.end(), [](uint8_t p) { return p == 7; }));
}

TEST(ImageFolder, AFolderPerClassWithItsLabelsHoldoutAndBadFiles) {
  testing::Scratch s;
  namespace fs = std::filesystem;
  for (const char* cls : {"cat", "dog", "emu"}) fs::create_directories(s.path(std::string("train/") + cls));
  fs::create_directories(s.path(".hidden"));
  for (int i = 0; i < 30; ++i) {
    const char* cls = i % 3 == 0 ? "cat" : i % 3 == 1 ? "dog" : "emu";
    // Sizes of their own: each is resized and cropped to the folder's 4x4.
    s.Write(std::string("train/") + cls + "/" + std::to_string(i) + ".pgm", Pgm(4 + i % 5, 6, uint8_t(i % 3 * 100)));
  }
  s.Write("train/cat/readme.txt", "not an image, and not named as one");
  s.Write("train/dog/broken.png", "\x89PNG\r\n\x1a\n and then nothing");
  FolderOptions o;
  o.view.channels = 1, o.view.rows = 4, o.view.cols = 4;
  auto f = LoadImageFolder(s.path("train"), o);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->classes, (std::vector<std::string>{"cat", "dog", "emu"}));
  EXPECT_EQ(f->set.class_names, f->classes);
  EXPECT_EQ(f->set.count, 30);
  EXPECT_EQ(f->set.num_classes, 3);
  ASSERT_EQ(f->skipped.size(), 1u);
  EXPECT_NE(f->skipped[0].find("broken.png"), std::string::npos);
  for (int64_t i = 0; i < f->set.count; ++i) {  // each image's pixels say its class
    EXPECT_EQ(f->set.image(i)[5], f->set.labels[i] * 100) << i;
  }
  // The classes are mixed in the order (a limit keeps some of each).
  o.limit = 9;
  auto some = LoadImageFolder(s.path("train"), o);
  ASSERT_TRUE(some.ok());
  EXPECT_EQ(std::set<uint16_t>(some->set.labels.begin(), some->set.labels.end()).size(), 3u);
  o.limit = 0;
  // Holdout: a split by path, the same each time, the parts disjoint and whole.
  o.holdout = 0.3;
  auto train = LoadImageFolder(s.path("train"), o);
  o.test = true;
  auto test = LoadImageFolder(s.path("train"), o);
  auto again = LoadImageFolder(s.path("train"), o);
  ASSERT_TRUE(train.ok() && test.ok() && again.ok());
  EXPECT_EQ(train->set.count + test->set.count, 30);
  EXPECT_GT(test->set.count, 2);
  EXPECT_EQ(test->set.pixels, again->set.pixels);
  // bad_images: fail names the file; a test folder with a class the training one lacks is refused.
  o = FolderOptions{};
  o.view.channels = 1, o.view.rows = 4, o.view.cols = 4, o.skip_bad = false;
  auto strict = LoadImageFolder(s.path("train"), o);
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("train/dog/broken.png"), std::string::npos) << strict.status().message();
  fs::create_directories(s.path("test/cat"));
  fs::create_directories(s.path("test/fox"));
  s.Write("test/fox/1.pgm", Pgm(4, 4, 1));
  o.skip_bad = true;
  o.classes = f->classes;
  auto fox = LoadImageFolder(s.path("test"), o);
  ASSERT_FALSE(fox.ok());
  EXPECT_NE(fox.status().message().find("test/fox: a class the training folder does not have"), std::string::npos)
      << fox.status().message();
  auto one = FolderClasses(s.path("test/cat"));
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("0 class folder(s)"), std::string::npos) << one.status().message();
  EXPECT_FALSE(FolderClasses(s.path("nowhere")).ok());
}

}  // namespace
}  // namespace trainctl::data
