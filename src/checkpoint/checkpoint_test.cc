#include "checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "checkpoint/meta.h"
#include "tests/test_util.h"

namespace trainctl::checkpoint {
namespace {

std::string Floats(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

Checkpoint Sample(int64_t step) {
  Checkpoint c;
  c.step = step;
  c.metadata["model"] = "cnn";
  c.tensors.push_back({"conv1.weight", "F32", {2, 2}, Floats({1.5f, -2.f, 3.25f, static_cast<float>(step)})});
  c.tensors.push_back({"step_count", "I64", {1}, std::string("\x07\0\0\0\0\0\0\0", 8)});
  return c;
}

TEST(Safetensors, RoundTripsTensorsStepAndMetadata) {
  auto bytes = Encode(Sample(42));
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  auto back = Decode(*bytes, "mem");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->step, 42);
  EXPECT_EQ(back->metadata.at("model"), "cnn");
  EXPECT_EQ(back->metadata.count("trainctl.crc32"), 0u);
  ASSERT_NE(back->Find("conv1.weight"), nullptr);
  EXPECT_EQ(back->Find("conv1.weight")->data, Sample(42).tensors[0].data);
  EXPECT_EQ(back->Find("conv1.weight")->shape, (std::vector<int64_t>{2, 2}));
  uint64_t header = 0;
  std::memcpy(&header, bytes->data(), 8);
  EXPECT_EQ((8 + header) % 8, 0u) << "data section 8-byte aligned";
}

// A file is checked by its header before the rest is read: a 1.5 GB file of zeros, a header that
// declares more data than the file holds, a device: errors at once, with memory to spare (finding
// 5 of issue 49: the whole file was read first, and /dev/zero ended in bad_alloc).
TEST(Safetensors, AFileIsCheckedByItsHeaderBeforeTheRestIsRead) {
  testing::Scratch s;
  auto rss_mb = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;
  };
  const long before = rss_mb();
  {
    std::ofstream(s.path("zeros.safetensors"));
    std::filesystem::resize_file(s.path("zeros.safetensors"), uint64_t{1536} << 20);  // sparse
  }
  auto zeros = ReadCheckpointFile(s.path("zeros.safetensors"));
  ASSERT_FALSE(zeros.ok());
  EXPECT_NE(zeros.status().message().find("corrupt header"), std::string::npos) << zeros.status().message();
  std::string good = *Encode(Sample(3));
  s.Write("cut.safetensors", good.substr(0, good.size() - 4));
  auto cut = ReadCheckpointFile(s.path("cut.safetensors"));
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("the header declares 24 bytes of tensor data, the file holds 20"),
            std::string::npos)
      << cut.status().message();
  auto device = ReadCheckpointFile("/dev/zero");
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().message(), "/dev/zero: not a regular file; expected a .safetensors model or checkpoint");
  // A header of 3 MB nested a million deep: refused before it is parsed.
  std::string nested = std::string(1 << 20, '[') + std::string(1 << 20, ']') + std::string(1 << 20, ' ');
  std::string header(8, '\0');
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((uint64_t{nested.size()} >> (8 * i)) & 0xff);
  auto deep = Decode(header + nested, "deep");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().message(), "deep: corrupt header: nested too deep");
  EXPECT_LT(rss_mb() - before, 100) << "MiB read for nothing";
  s.Write("good.safetensors", good);
  auto back = ReadCheckpointFile(s.path("good.safetensors"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->step, 3);
}

TEST(Safetensors, EncodeRejectsBlobsThatDoNotMatchTheirShape) {
  Checkpoint c;
  c.tensors.push_back({"w", "F32", {3}, Floats({1.f, 2.f})});
  EXPECT_FALSE(Encode(c).ok());
  c.tensors[0] = {"w", "F99", {2}, Floats({1.f, 2.f})};
  EXPECT_FALSE(Encode(c).ok());
  c.tensors = {{"w", "F32", {1}, Floats({1.f})}, {"w", "F32", {1}, Floats({2.f})}};
  EXPECT_FALSE(Encode(c).ok());
}

TEST(Safetensors, EveryKindOfDamageIsCaught) {
  std::string good = *Encode(Sample(1));
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x40;
  EXPECT_NE(Decode(flipped, "f").status().message().find("checksum mismatch"), std::string::npos);
  EXPECT_NE(Decode(good.substr(0, good.size() - 4), "t").status().message().find("does not fit"), std::string::npos);
  EXPECT_NE(Decode(good.substr(0, 5), "s").status().message().find("truncated"), std::string::npos);
  std::string bad_header = good;
  bad_header[8] = '[';
  EXPECT_FALSE(Decode(bad_header, "h").ok());
  EXPECT_FALSE(Decode(std::string(8, '\xff') + "{}", "len").ok());
}

// A header whose shape or offsets hold what is not a whole number from 0 (a float out of any
// integer's range, found by the fuzzer, was converted with undefined behaviour) names the tensor.
TEST(Safetensors, AShapeOrOffsetThatIsNotAWholeNumberIsALocatedError) {
  const std::string good = *Encode(Sample(1));
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  const std::string header = good.substr(8, n), data = good.substr(8 + n);
  for (const auto& [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"\"shape\":[1]", "\"shape\":[5.55556e+23]"},
                                                        {"\"shape\":[1]", "\"shape\":[1.0]"},
                                                        {"\"shape\":[1]", "\"shape\":[-1]"},
                                                        {"\"shape\":[1]", "\"shape\":[\"1\"]"},
                                                        {"\"shape\":[1]", "\"shape\":[18446744073709551615]"},
                                                        {"\"data_offsets\":[16,24]", "\"data_offsets\":[16,2.4e1]"},
                                                        {"\"data_offsets\":[16,24]", "\"data_offsets\":[-16,24]"}}) {
    std::string h = header;
    const size_t at = h.find(from);
    ASSERT_NE(at, std::string::npos) << h;
    h.replace(at, from.size(), to);
    std::string bytes(8, '\0');
    const uint64_t size = h.size();
    std::memcpy(bytes.data(), &size, 8);
    auto r = Decode(bytes + h + data, "f.safetensors");
    ASSERT_FALSE(r.ok()) << to;
    EXPECT_NE(r.status().message().find("f.safetensors: tensor step_count: its"), std::string::npos)
        << to << ": " << r.status().message();
  }
}

TEST(Safetensors, FuzzedFilesNeverCrashTheDecoder) {
  std::string good = *Encode(Sample(5));
  std::mt19937 rng(7);
  for (int i = 0; i < 5000; ++i) {
    std::string bytes = good;
    int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % bytes.size();
      switch (rng() % 3) {
        case 0:
          bytes[pos] = static_cast<char>(rng());
          break;
        case 1:
          bytes.erase(pos, 1 + rng() % 8);
          break;
        default:
          bytes.insert(pos, 1, static_cast<char>(rng()));
      }
      if (bytes.empty()) bytes = "x";
    }
    auto r = Decode(bytes, "fuzz");  // must return, ok or not
    if (!r.ok()) {
      EXPECT_FALSE(r.status().message().empty());
    }
  }
}

// What the trainer writes, with one field changed: every value read back is checked.
Checkpoint ModelSample() {
  Checkpoint c = Sample(5);
  c.metadata = {{"model", "cnn"},        {"dataset", "fashion-mnist"}, {"data_dir", ""},      {"shape", "1,28,28"},
                {"classes", "10"},       {"norm_mean", "0.286"},       {"norm_std", "0.353"}, {"optimizer.steps", "5"},
                {"batch_in_epoch", "5"}, {"global_batch", "128"},      {"epoch", "0"}};
  return c;
}

TEST(Metadata, WhatTheTrainerWritesReadsBack) {
  auto meta = ReadModelMeta(ModelSample(), "m.safetensors");
  ASSERT_TRUE(meta.ok()) << meta.status().message();
  EXPECT_EQ(meta->classes, 10);
  EXPECT_EQ(meta->rows, 28);
  EXPECT_EQ(meta->std, std::vector<float>{0.353f});
  auto pos = ReadPosition(ModelSample(), "m.safetensors");
  ASSERT_TRUE(pos.ok()) << pos.status().message();
  EXPECT_EQ(pos->samples_in_epoch(), 640);
}

// Crafted metadata (the CRC covers only the tensors): a located error, never a crash, a division
// by zero or an allocation sized from the file.
TEST(Metadata, CraftedValuesAreLocatedErrors) {
  struct Case {
    std::string field, value, message;
  };
  for (const Case& c : std::vector<Case>{
           {"classes", "0", "metadata field 'classes' is '0', expected a whole number from 2 to 4096"},
           {"classes", "4294967297", "'classes' is '4294967297'"},
           {"classes", "ten", "'classes' is 'ten'"},
           {"shape", "1,28", "'shape' is '1,28', expected channels,rows,cols, each from 1 to 4096"},
           {"shape", "1,0,28", "'shape' is '1,0,28'"},
           {"shape", "1,99999999999999999999,28", "'shape'"},
           {"norm_std", "0", "'norm_std' is '0', expected 1 finite number(s), one per channel, each above 0"},
           {"norm_mean", "nan", "'norm_mean' is 'nan'"},
           {"norm_mean", "0.1,0.2", "'norm_mean' is '0.1,0.2'"},
           {"model", "resnet1000", "'model' is 'resnet1000', expected cnn, resnet18, resnet50, layers or torchscript"},
           {"model", "layers", "'layers' is missing, expected the declared model's layers (JSON)"},
           {"dataset", "imagenet", "'dataset' is 'imagenet'"}}) {
    Checkpoint ck = ModelSample();
    ck.metadata[c.field] = c.value;
    auto meta = ReadModelMeta(ck, "m.safetensors");
    ASSERT_FALSE(meta.ok()) << c.field << "=" << c.value;
    EXPECT_EQ(meta.status().message().rfind("m.safetensors: ", 0), 0u);
    EXPECT_NE(meta.status().message().find(c.message), std::string::npos) << meta.status().message();
  }
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, std::string>>{{"batch_in_epoch", "-1"},
                                                        {"global_batch", "0"},
                                                        {"global_batch", "9223372036854775807"},
                                                        {"epoch", "1e9"},
                                                        {"optimizer.steps", ""}}) {
    Checkpoint ck = ModelSample();
    ck.metadata[field] = value;
    auto pos = ReadPosition(ck, "c.safetensors");
    ASSERT_FALSE(pos.ok()) << field << "=" << value;
    EXPECT_NE(pos.status().message().find("metadata field '" + field + "'"), std::string::npos);
  }
}

TEST(Metadata, ANegativeOrGarbageStepIsRefused) {
  for (const std::string step : {"-5", "12abc", "99999999999999999999"}) {
    Checkpoint c = Sample(1);
    auto bytes = Encode(c);
    ASSERT_TRUE(bytes.ok());
    // Re-encode with the step field replaced (and the header length adjusted).
    uint64_t n = 0;
    std::memcpy(&n, bytes->data(), 8);
    std::string header = bytes->substr(8, n);
    const std::string key = "\"trainctl.step\":\"1\"";
    ASSERT_NE(header.find(key), std::string::npos) << header;
    header.replace(header.find(key), key.size(), "\"trainctl.step\":\"" + step + "\"");
    uint64_t m = header.size();
    std::string crafted(reinterpret_cast<const char*>(&m), 8);
    crafted += header + bytes->substr(8 + n);
    auto back = Decode(crafted, "c.safetensors");
    ASSERT_FALSE(back.ok()) << step;
    EXPECT_NE(back.status().message().find("'trainctl.step' is '" + step.substr(0, 64) + "'"), std::string::npos)
        << back.status().message();
  }
}

TEST(CheckpointDir, KeepsTheLastKAndResumesFromTheNewest) {
  testing::Scratch s;
  CheckpointDir dir(s.path("ckpt"), 2);
  for (int64_t step : {100, 200, 300}) ASSERT_TRUE(dir.Save(Sample(step)).ok());
  auto files = dir.List();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], dir.PathFor(200));
  EXPECT_EQ(files[1], dir.PathFor(300));
  auto latest = dir.LoadLatest();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step, 300);
  // No temporary files are left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(s.path("ckpt")), std::filesystem::directory_iterator()),
            2);
}

TEST(CheckpointDir, FallsBackPastACorruptOrTruncatedNewest) {
  testing::Scratch s;
  CheckpointDir dir(s.path("ckpt"), 3);
  for (int64_t step : {1, 2, 3}) ASSERT_TRUE(dir.Save(Sample(step)).ok());
  std::string newest = *ReadFile(dir.PathFor(3));
  newest[newest.size() - 1] ^= 1;
  ASSERT_TRUE(AtomicWriteFile(dir.PathFor(3), newest).ok());
  std::string middle = *ReadFile(dir.PathFor(2));
  ASSERT_TRUE(AtomicWriteFile(dir.PathFor(2), middle.substr(0, middle.size() / 2)).ok());
  std::vector<std::string> skipped;
  auto latest = dir.LoadLatest(&skipped);
  ASSERT_TRUE(latest.ok()) << latest.status().message();
  EXPECT_EQ(latest->step, 1);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find(dir.PathFor(3) + ": checksum mismatch"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find(dir.PathFor(2)), std::string::npos);
  CheckpointDir empty(s.path("none"), 1);
  EXPECT_EQ(empty.LoadLatest().status().code(), Code::kNotFound);
}

// A consistent checkpoint of 1 GiB (a sparse file: its data is zeros, its checksum theirs) is read
// once, through the checksum straight into its tensor: the reader's peak memory is the file's
// size, not three copies of it.
TEST(Safetensors, ALargeCheckpointIsStreamedThroughItsChecksumIntoItsTensors) {
  testing::Scratch s;
  const uint64_t data = uint64_t{1} << 30;
  uLong crc = ::crc32(0L, Z_NULL, 0);
  {
    const std::string zeros(8 << 20, '\0');
    for (uint64_t done = 0; done < data; done += zeros.size()) {
      crc = ::crc32(crc, reinterpret_cast<const Bytef*>(zeros.data()), static_cast<uInt>(zeros.size()));
    }
  }
  std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(data / 4) + "],\"data_offsets\":[0," +
                       std::to_string(data) + "]},\"__metadata__\":{\"trainctl.crc32\":\"" + std::to_string(crc) +
                       "\",\"trainctl.step\":\"5\"}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[i] = static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  const std::string path = s.Write("big.safetensors", head + header);
  std::filesystem::resize_file(path, 8 + header.size() + data);
  auto peak_mb = [] {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss / 1024;
  };
  const long before = peak_mb();
  auto c = ReadCheckpointFile(path);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->step, 5);
  ASSERT_EQ(c->tensors.size(), 1u);
  EXPECT_EQ(c->tensors[0].data.size(), data);
  EXPECT_LE(peak_mb() - before, long(1.2 * 1024)) << "MiB at the peak for a 1024 MiB file";
  // One byte of it changed: the checksum says so.
  c = NotFound("released");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(8 + header.size() + data / 2));
    f.put('\x01');
  }
  auto bad = ReadCheckpointFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("checksum mismatch"), std::string::npos) << bad.status().message();
}

TEST(CheckpointDir, PythonReadsTheFileAsSafetensors) {
  testing::Scratch s;
  CheckpointDir dir(s.path("ckpt"), 1);
  ASSERT_TRUE(dir.Save(Sample(9)).ok());
  // Reads the layout by hand, as the safetensors format is specified: no trainctl code involved.
  std::string script = R"(
import json, struct, sys, numpy as np
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
w = header["conv1.weight"]
a, b = w["data_offsets"]
arr = np.frombuffer(data[a:b], dtype="<f4").reshape(w["shape"])
assert arr.tolist() == [[1.5, -2.0], [3.25, 9.0]], arr
assert header["__metadata__"]["trainctl.step"] == "9"
print("ok")
)";
  SpawnOptions o;
  o.argv = {TRAINCTL_TEST_PYTHON, "-c", script, dir.PathFor(9)};
  o.env = CurrentEnvironment();
  auto r = RunCommand(o, std::chrono::seconds(60));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->output, "ok\n");
  EXPECT_EQ(r->exit.code, 0);
}

}  // namespace
}  // namespace trainctl::checkpoint
