// The program's own machine code on transparent huge pages, for a process that forks many copies
// of itself (a fork server).
//
// A forked child starts with empty page tables for file mappings: each copy faults the program's
// code in again, 4 KiB at a time, and under a hypervisor that shadows page tables (a cloud VM
// without nested paging) each page a copy touches costs a trip through the host. Text held in
// anonymous huge pages instead is mapped by the fork itself (one entry per 2 MiB), so the copies
// touch no code page of their own: a 1024-node no-op local job's agents took 25 % less CPU each
// (bench/RESULTS.md).
//
// Only the 2 MiB-aligned part of the text is moved (the executable is linked with 2 MiB segment
// alignment, so that is all of it), only where the kernel has transparent huge pages and gives
// them (MADV_COLLAPSE), and never half: on any failure the text stays the file's. The code is the
// same bytes at the same addresses, read-only and executable as before; what changes is that
// /proc/PID/maps shows it anonymous, so a profiler (perf) or a uprobe cannot tie the copies'
// samples to the executable. TRAINCTL_HUGE_TEXT=0 in the environment leaves the text alone.
#pragma once

#include <cstddef>

namespace trainctl {

inline constexpr const char* kEnvHugeText = "TRAINCTL_HUGE_TEXT";

// Moves this process's text onto huge pages as said above; returns the bytes moved (0: none).
// Call while the process has one thread.
size_t MapTextOnHugePages();

}  // namespace trainctl
