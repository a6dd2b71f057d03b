// Issue 71: pictures that cannot stall or bloat a decode thread (scans, memory, a header that
// promises more than the file holds), and a file-list cache nobody else controls.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <csetjmp>
#include <cstdio>
#include <filesystem>
#include <numeric>
// clang-format off: jpeglib.h needs stdio.h's FILE first.
#include <jpeglib.h>
// clang-format on

#include "common/fs.h"
#include "data/dataset.h"
#include "data/file_list.h"
#include "data/image_header.h"
#include "data/image_rows.h"
#include "data/image_stream.h"
#include "data/image_view.h"
#include "tests/test_util.h"

namespace trainctl::data {
namespace {

namespace fs = std::filesystem;

long PeakMib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

// A grey progressive JPEG of rows x cols by libjpeg's own encoder; `scans` its scan script
// (empty: libjpeg's default progression).
std::string ProgressiveJpeg(int rows, int cols, const std::vector<jpeg_scan_info>& scans) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = static_cast<JDIMENSION>(cols);
  c.image_height = static_cast<JDIMENSION>(rows);
  c.input_components = 1;
  c.in_color_space = JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  if (scans.empty()) {
    jpeg_simple_progression(&c);
  } else {
    c.scan_info = scans.data();
    c.num_scans = static_cast<int>(scans.size());
  }
  jpeg_start_compress(&c, TRUE);
  std::vector<uint8_t> row(static_cast<size_t>(cols));
  for (int y = 0; y < rows; ++y) {
    for (int x = 0; x < cols; ++x) row[x] = static_cast<uint8_t>((x * 7 + y * 3) % 256);
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::string bytes(reinterpret_cast<char*>(out), size);
  std::free(out);
  return bytes;
}

// A valid progression of 1 + 63 x 5 = 316 scans: the DC, then each AC coefficient on its own, in
// five successive-approximation steps.
std::vector<jpeg_scan_info> ManyScans() {
  std::vector<jpeg_scan_info> s;
  s.push_back({1, {0}, 0, 0, 0, 0});
  for (int k = 1; k <= 63; ++k) s.push_back({1, {0}, k, k, 0, 4});
  for (int al = 3; al >= 0; --al) {
    for (int k = 1; k <= 63; ++k) s.push_back({1, {0}, k, k, al + 1, al});
  }
  return s;
}

Status View(const std::string& bytes, const std::string& path) {
  ViewOptions v;
  v.channels = 1, v.rows = v.cols = 32;
  std::vector<uint8_t> out(32 * 32);
  return DecodeView(bytes, path, v, 0, out.data());
}

TEST(ImageLimits, ProgressiveJpegsOfTooManyScansAreRefusedInEveryPath) {
  const std::string ok = ProgressiveJpeg(256, 256, {});
  ASSERT_TRUE(View(ok, "ok.jpg").ok());
  ASSERT_TRUE(DecodeImage(ok, "ok.jpg").ok());
  // 316 scans, each one valid: more than the 256 any picture may have.
  const std::string many = ProgressiveJpeg(256, 256, ManyScans());
  for (const Status& st : {View(many, "many.jpg"), DecodeImage(many, "many.jpg").status()}) {
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("many.jpg: not a JPEG libjpeg-turbo can read: more than 256 scans"), std::string::npos)
        << st.message();
  }
  // The red team's bomb: the last scan repeated 2000 times (each repeat refines nothing).
  const size_t last = ok.rfind("\xff\xda");
  ASSERT_NE(last, std::string::npos);
  std::string bomb = ok.substr(0, ok.size() - 2);
  const std::string scan = ok.substr(last, ok.size() - 2 - last);
  for (int i = 0; i < 2000; ++i) bomb += scan;
  bomb += "\xff\xd9";
  for (const Status& st : {View(bomb, "bomb.jpg"), DecodeImage(bomb, "bomb.jpg").status()}) {
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("bomb.jpg: not a JPEG libjpeg-turbo can read: "), std::string::npos) << st.message();
  }
}

TEST(ImageLimits, AProgressiveJpegWhoseCoefficientsPassTheBudgetIsRefused) {
  // 7200 x 7200 grey: 810,000 blocks of 64 coefficients, 104 MB held before the first row.
  const std::string big = ProgressiveJpeg(7200, 7200, {});
  const long before = PeakMib();
  const Status st = View(big, "big.jpg");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("needs more than 96 MiB"), std::string::npos) << st.message();
  EXPECT_LT(PeakMib() - before, 40) << "MiB grown refusing it";
}

TEST(ImageLimits, TruncatedJpegsAreBadNotGrey) {
  const std::string ok = ProgressiveJpeg(64, 64, {});
  const std::string cut = ok.substr(0, ok.size() * 2 / 3);
  const Status st = View(cut, "cut.jpg");
  ASSERT_FALSE(st.ok()) << "a truncated JPEG was decoded, its missing part as grey";
  EXPECT_NE(st.message().find("a damaged picture"), std::string::npos) << st.message();
  EXPECT_FALSE(DecodeImage(cut, "cut.jpg").ok());
}

// A labels file given for pictures is named as one (plain or gzipped, as Debian ships them);
// any other file that is no picture gets no word about idx files (issue 75).
TEST(ImageLimits, OnlyAnIdxLabelsFileGetsTheIdxHint) {
  const fs::path dir = fs::temp_directory_path() / ("trainctl-idx-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string labels("\0\0\x08\x01\0\0\0\x02\x01\x02", 10);
  ASSERT_TRUE(AtomicWriteFile((dir / "t10k-labels-idx1-ubyte").string(), labels).ok());
  gzFile gz = ::gzopen((dir / "labels.gz").c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(::gzwrite(gz, labels.data(), labels.size()), static_cast<int>(labels.size()));
  ::gzclose(gz);
  ASSERT_TRUE(AtomicWriteFile((dir / "notes.txt").string(), "a text file, no picture").ok());
  for (const char* name : {"t10k-labels-idx1-ubyte", "labels.gz"}) {
    auto h = ReadImageHeader((dir / name).string());
    ASSERT_FALSE(h.ok()) << name;
    EXPECT_NE(h.status().message().find("an idx1 labels file, not images: give the images file itself"),
              std::string::npos)
        << h.status().message();
  }
  auto notes = ReadImageHeader((dir / "notes.txt").string());
  ASSERT_FALSE(notes.ok());
  EXPECT_EQ(notes.status().message(), (dir / "notes.txt").string() + ": not a PNG, JPEG, PGM or PPM image");
  fs::remove_all(dir);
}

// The list of skipped pictures sits in the run's directory: a FIFO planted under its name is
// refused at once (a decode thread reading it would wait forever), and a file gets each line once.
TEST(ImageLimits, TheSkippedPicturesListIsARegularFileWithEachNameOnce) {
  const fs::path dir = fs::temp_directory_path() / ("trainctl-skips-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fifo = (dir / "fifo.txt").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const Status planted = RecordSkipped(fifo, {"a.jpg: damaged"});
  ASSERT_FALSE(planted.ok());
  EXPECT_NE(planted.message().find("is not a regular file"), std::string::npos) << planted.message();
  const std::string list = (dir / "skipped-images.txt").string();
  ASSERT_TRUE(RecordSkipped(list, {"a.jpg: damaged", "b.jpg: damaged"}).ok());
  ASSERT_TRUE(RecordSkipped(list, {"b.jpg: damaged", "c.jpg: damaged"}).ok());
  EXPECT_EQ(*ReadFile(list, 1 << 20), "a.jpg: damaged\nb.jpg: damaged\nc.jpg: damaged\n");
  fs::remove_all(dir);
}

// A 17-byte PPM whose header promises 8192 x 8192: refused before anything is allocated.
TEST(ImageLimits, APnmHeaderThatPromisesMoreThanTheFileHoldsAllocatesNothing) {
  const long before = PeakMib();
  for (const std::string& bytes : {std::string("P6 8192 8192 255\n"), std::string("P3 8192 8192 255\n0 0 0\n")}) {
    const Status view = View(bytes, "bomb.ppm");
    ASSERT_FALSE(view.ok());
    EXPECT_NE(view.message().find("bomb.ppm: truncated: the header promises 201326592 samples"), std::string::npos)
        << view.message();
    EXPECT_FALSE(DecodeImage(bytes, "bomb.ppm").ok());
  }
  EXPECT_LT(PeakMib() - before, 4) << "MiB grown refusing 17 bytes";
}

// An 8192 x 8192 RGB PNG of zeros (some 200 KB), written a row at a time.
std::string ZeroPng(int cols, int rows) {
  auto chunk = [](const std::string& type, const std::string& data) {
    auto be = [](uint32_t v) { return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; };
    std::string body = type + data;
    return be(static_cast<uint32_t>(data.size())) + body +
           be(static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(body.data()), body.size())));
  };
  std::string ihdr;
  for (uint32_t v : {static_cast<uint32_t>(cols), static_cast<uint32_t>(rows)}) {
    ihdr += std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  }
  ihdr += std::string{8, 2, 0, 0, 0};  // 8 bits, RGB, deflate, no filter, not interlaced
  z_stream z{};
  deflateInit(&z, 9);
  std::string idat, row(static_cast<size_t>(cols) * 3 + 1, '\0');
  std::vector<unsigned char> buf(1 << 16);
  for (int y = 0; y <= rows; ++y) {
    z.next_in = reinterpret_cast<Bytef*>(row.data());
    z.avail_in = y < rows ? static_cast<uInt>(row.size()) : 0;
    do {
      z.next_out = buf.data();
      z.avail_out = static_cast<uInt>(buf.size());
      deflate(&z, y < rows ? Z_NO_FLUSH : Z_FINISH);
      idat.append(reinterpret_cast<char*>(buf.data()), buf.size() - z.avail_out);
    } while (z.avail_out == 0);
  }
  deflateEnd(&z);
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + chunk("IDAT", idat) + chunk("IEND", "");
}

// Eight 8192 x 8192 PNGs streamed by eight threads: each is resampled as its rows come, so the
// pipeline's peak memory is threads x (a few rows), not threads x 400 MiB.
TEST(ImageLimits, PngsStreamRowByRowWithinTheThreadsBound) {
  testing::Scratch s;
  const std::string png = ZeroPng(8192, 8192);
  ASSERT_LT(png.size(), 400u << 10);
  for (const char* cls : {"a", "b"}) {
    fs::create_directories(s.path(std::string("pics/") + cls));
    for (int i = 0; i < 4; ++i) s.Write(std::string("pics/") + cls + "/" + std::to_string(i) + ".png", png);
  }
  auto list = ListImageFolder(s.path("pics"), ListOptions{});
  ASSERT_TRUE(list.ok()) << list.status().message();
  StreamOptions o;
  o.view.rows = o.view.cols = 224;
  o.threads = 8;
  ImageStream stream(std::make_shared<const FileList>(std::move(*list)), o);
  std::vector<int64_t> idx(8);
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<uint8_t> px(8 * stream.image_bytes());
  std::vector<uint16_t> labels(8);
  const long before = PeakMib();
  ASSERT_TRUE(stream.Get(idx.data(), 8, 0, px.data(), labels.data()).ok());
  EXPECT_EQ(std::accumulate(px.begin(), px.end(), 0L), 0L);
  EXPECT_LT(PeakMib() - before, 64) << "MiB grown decoding eight 8192x8192 PNGs at once";
  EXPECT_EQ(stream.Stats().images, 8);
}

// The list cache as another user would attack it: what it plants is never read.
class ListCache : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* cls : {"cat", "dog"}) {
      fs::create_directories(s.path(std::string("pics/") + cls));
      for (int i = 0; i < 3; ++i)
        s.Write(std::string("pics/") + cls + "/" + std::to_string(i) + ".pgm", "P5 1 1 255\n\x01");
    }
    o.cache_dir = s.path("cache/trainctl/lists");
  }
  std::string OnlyList() {
    for (const auto& e : fs::directory_iterator(o.cache_dir)) return e.path().string();
    return "";
  }
  testing::Scratch s;
  ListOptions o;
};

TEST_F(ListCache, ItsDirectoriesAndListsAreThisUsersAlone) {
  ListReport r;
  ASSERT_TRUE(ListImageFolder(s.path("pics"), o, &r).ok());
  EXPECT_EQ(r.cache_refused, "");
  auto mode = [](const std::string& p) {
    struct stat st {};
    ::stat(p.c_str(), &st);
    return st.st_mode & 0777;
  };
  EXPECT_EQ(mode(o.cache_dir), 0700u);
  EXPECT_EQ(mode(s.path("cache/trainctl")), 0700u);
  EXPECT_EQ(mode(OnlyList()), 0600u);
  // A directory trainctl made readable by all before: made private at its next use.
  ::chmod(o.cache_dir.c_str(), 0755);
  ASSERT_TRUE(ListImageFolder(s.path("pics"), o, &r).ok());
  EXPECT_TRUE(r.from_cache);
  EXPECT_EQ(mode(o.cache_dir), 0700u);
}

TEST_F(ListCache, PlantedEntriesAreIgnoredAndTheListWrittenAnew) {
  ASSERT_TRUE(ListImageFolder(s.path("pics"), o).ok());
  const std::string path = OnlyList();
  std::string text = s.Read(path.substr(s.path("").size()));
  // Entries outside the folder, with the same stamps (so the folders look unchanged).
  std::string planted = text;
  const size_t first = planted.find("\n0.pgm\n");
  ASSERT_NE(first, std::string::npos) << planted;
  planted.replace(first, 7, "\n../../../../mallory/p1.pgm\n");
  ASSERT_TRUE(AtomicWriteFile(path, planted, 0600).ok());
  ListReport r;
  auto list = ListImageFolder(s.path("pics"), o, &r);
  ASSERT_TRUE(list.ok());
  EXPECT_FALSE(r.from_cache);
  EXPECT_EQ(r.listed, 2);
  for (int64_t i = 0; i < list->size(); ++i) EXPECT_EQ(list->Name(i).find(".."), std::string::npos) << list->Name(i);
  EXPECT_EQ(s.Read(path.substr(s.path("").size())), text) << "the list written anew";
  // 20 MB of empty lines with a count to match: refused by the count bound, at once.
  std::string header = text.substr(0, text.find('\n', text.find('\n') + 1) + 1);
  const size_t stamp_end = text.find(' ', header.size());
  std::string huge =
      header + text.substr(header.size(), stamp_end - header.size()) + " 20000000 cat\n" + std::string(20000000, '\n');
  EXPECT_TRUE(ParseFileList(huge, s.path("pics")).empty());
  EXPECT_TRUE(ParseFileList(text, s.path("pics")).size() == 2);
  for (const std::string name : {"/etc/p.pgm", "..", "a/b.pgm", ""}) {
    std::string bad = text;
    bad.replace(bad.find("\n0.pgm\n"), 7, "\n" + name + "\n");
    EXPECT_TRUE(ParseFileList(bad, s.path("pics")).empty()) << name;
  }
}

TEST_F(ListCache, ADirectoryAnotherUserOwnsOrCanWriteIsNotUsed) {
  ASSERT_TRUE(ListImageFolder(s.path("pics"), o).ok());
  ListReport r;
  ::chmod(o.cache_dir.c_str(), 0777);
  ASSERT_TRUE(ListImageFolder(s.path("pics"), o, &r).ok());
  EXPECT_FALSE(r.from_cache);
  EXPECT_NE(r.cache_refused.find("can be written by other users (mode 0777)"), std::string::npos) << r.cache_refused;
  ::chmod(o.cache_dir.c_str(), 0700);
  // A link in its place is not followed.
  fs::rename(o.cache_dir, s.path("elsewhere"));
  fs::create_directory_symlink(s.path("elsewhere"), o.cache_dir);
  ASSERT_TRUE(ListImageFolder(s.path("pics"), o, &r).ok());
  EXPECT_FALSE(r.from_cache);
  EXPECT_NE(r.cache_refused.find("a link is not followed"), std::string::npos) << r.cache_refused;
  fs::remove(o.cache_dir);
  fs::rename(s.path("elsewhere"), o.cache_dir);
  if (::geteuid() != 0) GTEST_SKIP() << "giving the directory to another user needs root";
  ASSERT_EQ(::chown(o.cache_dir.c_str(), 12345, 12345), 0);
  ASSERT_TRUE(ListImageFolder(s.path("pics"), o, &r).ok());
  EXPECT_FALSE(r.from_cache);
  EXPECT_NE(r.cache_refused.find("belongs to user 12345, not to you"), std::string::npos) << r.cache_refused;
}

// Another folder at the same path, its class folders' times set to the first's (as tar --mtime
// does): its own list, not the first's.
TEST_F(ListCache, AnotherFolderAtTheSamePathWithTheSameTimesIsListedAfresh) {
  ASSERT_TRUE(ListImageFolder(s.path("pics"), o).ok());
  struct stat cat {
  }, dog{};
  ::stat(s.path("pics/cat").c_str(), &cat);
  ::stat(s.path("pics/dog").c_str(), &dog);
  fs::rename(s.path("pics"), s.path("old"));
  for (const char* cls : {"cat", "dog"}) {
    fs::create_directories(s.path(std::string("pics/") + cls));
    s.Write(std::string("pics/") + cls + "/other.pgm", "P5 1 1 255\n\x02");
  }
  const timespec cat_times[2] = {cat.st_atim, cat.st_mtim}, dog_times[2] = {dog.st_atim, dog.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, s.path("pics/cat").c_str(), cat_times, 0), 0);
  ASSERT_EQ(::utimensat(AT_FDCWD, s.path("pics/dog").c_str(), dog_times, 0), 0);
  ListReport r;
  auto list = ListImageFolder(s.path("pics"), o, &r);
  ASSERT_TRUE(list.ok());
  EXPECT_FALSE(r.from_cache);
  ASSERT_EQ(list->size(), 2);
  EXPECT_EQ(list->Name(0).substr(4), "other.pgm");
}

}  // namespace
}  // namespace trainctl::data
