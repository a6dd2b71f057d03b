#include "checkpoint/module_file.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <string_view>

#include "common/fs.h"
#include "common/sha256.h"

namespace trainctl::checkpoint {
namespace {

// Whether `gid` is this user's own group (Debian's user private group: the user's name, no other
// members), whose write permission lets no one else write.
bool OwnPrivateGroup(gid_t gid) {
  char buf[16384];
  struct passwd pw {
  }, *pwp = nullptr;
  struct group gr {
  }, *grp = nullptr;
  if (::getpwuid_r(::geteuid(), &pw, buf, sizeof buf / 2, &pwp) != 0 || !pwp) return false;
  if (::getgrgid_r(gid, &gr, buf + sizeof buf / 2, sizeof buf / 2, &grp) != 0 || !grp) return false;
  return pw.pw_gid == gid && std::strcmp(gr.gr_name, pw.pw_name) == 0 && (!gr.gr_mem || !gr.gr_mem[0]);
}

// Why another user could have written the file or directory `st` describes, or "" when only this
// user or root could have. A sticky directory (/tmp) others may write lets them add files, not
// replace this user's.
std::string OtherWriter(const struct stat& st) {
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return "it belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " + std::to_string(::geteuid()) +
           ") or root";
  }
  const bool sticky_dir = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX);
  if ((st.st_mode & S_IWOTH) && !sticky_dir) return std::string("every user may write it (mode ") + mode + ")";
  if ((st.st_mode & S_IWGRP) && !sticky_dir && !OwnPrivateGroup(st.st_gid)) {
    return "group " + std::to_string(st.st_gid) + " may write it (mode " + mode + ")";
  }
  return "";
}

// The little-endian number of `bytes` bytes at `at`; 0 where they run past the end (the checks
// below refuse what that leaves inconsistent).
uint64_t Le(std::string_view b, size_t at, int bytes) {
  uint64_t v = 0;
  if (at > b.size() || static_cast<size_t>(bytes) > b.size() - at) return 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(b[at + i])} << (8 * i);
  return v;
}

}  // namespace

Status CheckModuleArchive(std::string_view b, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(path + ": " + why +
                           "; expected a TorchScript module saved with torch.jit.script(model).save(path)");
  };
  if (b.size() < 22 || b.substr(0, 2) != "PK") return bad("not a TorchScript module (a zip archive)");
  // The end-of-central-directory record: within the last 64 KiB + 22 bytes (its comment's most).
  size_t eocd = std::string_view::npos;
  for (size_t at = b.size() - 22;; --at) {
    if (Le(b, at, 4) == 0x06054b50) {
      eocd = at;
      break;
    }
    if (at == 0 || b.size() - at > 65557) break;
  }
  if (eocd == std::string_view::npos) return bad("a zip archive without its central directory (cut short?)");
  uint64_t entries = Le(b, eocd + 10, 2), cd_size = Le(b, eocd + 12, 4), cd_offset = Le(b, eocd + 16, 4);
  if ((entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) && eocd >= 20 &&
      Le(b, eocd - 20, 4) == 0x07064b50) {  // zip64: its locator just before
    const uint64_t at = Le(b, eocd - 20 + 8, 8);
    if (b.size() < 56 || at > b.size() - 56 || Le(b, at, 4) != 0x06064b50) return bad("a corrupt zip64 directory");
    entries = Le(b, at + 32, 8);
    cd_size = Le(b, at + 40, 8);
    cd_offset = Le(b, at + 48, 8);
  }
  if (cd_offset > b.size() || cd_size > b.size() - cd_offset) return bad("a zip directory beyond the file's end");
  const uint64_t limit = 2 * static_cast<uint64_t>(b.size()) + (1 << 20);
  uint64_t total = 0;
  size_t at = cd_offset;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + 46 > cd_offset + cd_size || Le(b, at, 4) != 0x02014b50) return bad("a corrupt zip directory");
    const uint64_t method = Le(b, at + 10, 2), name = Le(b, at + 28, 2), extra = Le(b, at + 30, 2),
                   comment = Le(b, at + 32, 2);
    uint64_t compressed = Le(b, at + 20, 4), inflated = Le(b, at + 24, 4);
    if (at + 46 + name + extra + comment > cd_offset + cd_size) return bad("a corrupt zip directory");
    // zip64's extra field holds, in this order, the sizes the record marks 0xFFFFFFFF.
    for (size_t e = at + 46 + name; e + 4 <= at + 46 + name + extra;) {
      const uint64_t id = Le(b, e, 2), len = Le(b, e + 2, 2);
      if (e + 4 + len > at + 46 + name + extra) break;
      if (id == 1) {
        size_t f = e + 4;
        if (inflated == 0xFFFFFFFF && f + 8 <= e + 4 + len) inflated = Le(b, f, 8), f += 8;
        if (compressed == 0xFFFFFFFF && f + 8 <= e + 4 + len) compressed = Le(b, f, 8);
      }
      e += 4 + len;
    }
    if (method != 0 && method != 8) return bad("a zip record compressed by method " + std::to_string(method));
    if (inflated > limit || total + inflated > limit) {
      return bad("its zip records would inflate to more than " + std::to_string(limit) + " bytes from " +
                 std::to_string(b.size()) + " (a zip bomb; PyTorch stores its records uncompressed)");
    }
    total += inflated;
    at += 46 + name + extra + comment;
  }
  return Status::Ok();
}

Result<ModuleFile> ReadModuleFile(const std::string& path) {
  const std::string expected = "; expected a TorchScript module saved with torch.jit.script(model).save(path)";
  struct stat st {};
  auto fd = OpenRegularFile(path, &st);
  if (!fd.ok()) {
    if (fd.status().code() == Code::kInvalidArgument) return InvalidArgument(fd.status().message() + expected);
    return fd.status();
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{*fd};
  // Who could have written it: the file as opened, then each directory above its real path.
  std::string why = OtherWriter(st);
  if (why.empty()) {
    char real[PATH_MAX];
    if (!::realpath(path.c_str(), real)) return ErrnoStatus("cannot resolve " + path, errno);
    for (auto dir = std::filesystem::path(real).parent_path();; dir = dir.parent_path()) {
      struct stat ds {};
      if (::stat(dir.c_str(), &ds) != 0) return ErrnoStatus("cannot inspect " + dir.string(), errno);
      if (std::string w = OtherWriter(ds); !w.empty()) {
        why = "its directory " + dir.string() + " is open to others: " + w;
        break;
      }
      if (dir == dir.root_path()) break;
    }
  }
  if (!why.empty()) {
    return PermissionDenied(path + ": a TorchScript module is code, and another user could have written this one (" +
                            why + "); refusing to load it");
  }
  if (st.st_size > kMaxModuleBytes) {
    return InvalidArgument(path + ": " + std::to_string(st.st_size) + " bytes, more than a module's most (" +
                           std::to_string(kMaxModuleBytes >> 30) + " GiB)");
  }
  ModuleFile m;
  m.path = path;
  try {
    m.bytes.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    return Internal(path + ": not enough memory to read its " + std::to_string(st.st_size) + " bytes");
  }
  for (size_t done = 0; done < m.bytes.size();) {
    const ssize_t n = ::pread(*fd, m.bytes.data() + done, m.bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return InvalidArgument(path + ": the file shrank while it was read");
    done += static_cast<size_t>(n);
  }
  RETURN_IF_ERROR(CheckModuleArchive(m.bytes, path));
  m.sha256 = Sha256Hex(m.bytes);
  return m;
}

}  // namespace trainctl::checkpoint
