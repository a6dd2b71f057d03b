#include "common/huge_text.h"

#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack it
#endif

namespace trainctl {
namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;

uintptr_t RoundDown(uintptr_t a, uintptr_t to) { return a & ~(to - 1); }
uintptr_t RoundUp(uintptr_t a, uintptr_t to) { return RoundDown(a + to - 1, to); }

struct Range {
  uintptr_t begin = 0, end = 0;
};

// The main program's executable segment (dl_iterate_phdr lists the program first).
int FindText(dl_phdr_info* info, size_t, void* data) {
  auto* text = static_cast<Range*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
      text->begin = info->dlpi_addr + ph.p_vaddr;
      text->end = text->begin + ph.p_memsz;
    }
  }
  return 1;
}

bool KernelGivesHugePages() {
  FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");
  if (!f) return false;
  char mode[128] = {};
  const bool read = std::fgets(mode, sizeof mode, f) != nullptr;
  std::fclose(f);
  return read && std::strstr(mode, "[never]") == nullptr;
}

// Whether [begin, end) holds nothing but inaccessible mappings (the loader's gap after the text).
bool OnlyGapIn(uintptr_t begin, uintptr_t end) {
  if (begin >= end) return true;
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (!f) return false;
  bool free = true;
  char line[512];
  while (free && std::fgets(line, sizeof line, f)) {
    uintptr_t lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s", &lo, &hi, perms) != 3) {
      free = false;
    } else if (lo < end && hi > begin && std::strcmp(perms, "---p") != 0) {
      free = false;
    }
    // A line longer than the buffer: its rest has no address range to read; skip it.
    while (!std::strchr(line, '\n') && std::fgets(line, sizeof line, f)) {
    }
  }
  std::fclose(f);
  return free;
}

}  // namespace

size_t MapTextOnHugePages() {
  if (const char* v = std::getenv(kEnvHugeText); v && std::strcmp(v, "0") == 0) return 0;
  if (!KernelGivesHugePages()) return 0;
  Range text;
  dl_iterate_phdr(FindText, &text);
  if (text.end <= text.begin) return 0;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = RoundUp(text.begin, kHugePage);
  // The last huge page may reach past the text only over the gap the loader left before the
  // next segment (2 MiB segment alignment makes one); otherwise it stays the file's.
  uintptr_t end = RoundUp(text.end, kHugePage);
  if (!OnlyGapIn(RoundUp(text.end, page), end)) end = RoundDown(text.end, kHugePage);
  if (end <= begin) return 0;
  const size_t size = end - begin;

  // The copy is built at a 2 MiB-aligned address (so the move keeps its huge pages whole).
  const size_t reserved = size + kHugePage;
  void* raw = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return 0;
  char* const raw_begin = static_cast<char*>(raw);
  char* const copy = reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(raw), kHugePage));
  auto release = [&](size_t moved) {
    if (copy > raw_begin) ::munmap(raw_begin, static_cast<size_t>(copy - raw_begin));
    char* const tail = copy + size;
    if (raw_begin + reserved > tail) ::munmap(tail, static_cast<size_t>(raw_begin + reserved - tail));
    if (!moved) ::munmap(copy, size);
    return moved;
  };
  if (::madvise(copy, size, MADV_HUGEPAGE) != 0) return release(0);
  std::memcpy(copy, reinterpret_cast<const void*>(begin), std::min(text.end, end) - begin);
  // Huge pages already, or made so now; a kernel without MADV_COLLAPSE (before 6.1), or without
  // free huge pages, says no, and the text stays as it is.
  if (::madvise(copy, size, MADV_COLLAPSE) != 0) return release(0);
  if (::mprotect(copy, size, PROT_READ | PROT_EXEC) != 0) return release(0);  // never writable and executable
  // One system call swaps the mappings; the code running here is the same bytes either side.
  if (::mremap(copy, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(begin)) == MAP_FAILED) {
    return release(0);
  }
  return release(size);
}

}  // namespace trainctl
