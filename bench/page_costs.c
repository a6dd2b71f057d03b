// What a forked process pays for the pages it touches and for a context switch, on this machine
// (issue 64: why a local job's agents cost what they do; under a hypervisor that shadows page
// tables each is a trip through the host). Prints, per child of a parent that holds the pages:
//   - reading 2048 pages of shared anonymous memory on 4 KiB pages, and on transparent huge pages;
//   - reading 2048 pages of a file mapping (FILE, in the page cache) at 4 KiB and at 64 KiB stride
//     (a 64 KiB stride takes a fault a page; 4 KiB lets the kernel's fault-around map 16 at once);
// and the time a token takes per hop around a ring of P processes (pipes), for P = 2 and 1024.
//
// Usage: cc -O2 -o page_costs bench/page_costs.c && ./page_costs FILE   (FILE of 128 MiB or more: the
// trainctl binary of a RelWithDebInfo build is)
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kPages = 2048, kChildren = 50 };

static double Now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// Microseconds a child takes, from fork to reaped, reading `pages` pages `stride` apart.
static double ChildReading(const volatile char* m, long pages, long stride) {
  const double start = Now();
  for (int i = 0; i < kChildren; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      long sum = 0;
      for (long j = 0; j < pages; ++j) sum += m[j * stride];
      _exit(sum & 1);
    }
    waitpid(pid, NULL, 0);
  }
  return (Now() - start) / kChildren * 1e6;
}

static void Report(const char* what, const volatile char* m, long stride) {
  const double none = ChildReading(m, 0, stride), all = ChildReading(m, kPages, stride);
  printf("%-44s %6.2f us a page (a child: %.0f us, reading none: %.0f us)\n", what, (all - none) / kPages, all, none);
}

static volatile char* Anonymous(size_t size, int huge) {
  const size_t align = 2 << 20;
  char* raw = mmap(NULL, size + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) exit(1);
  char* m = (char*)(((unsigned long)raw + align - 1) & ~(align - 1));
  if (huge && madvise(m, size, MADV_HUGEPAGE) != 0) perror("madvise");
  for (size_t i = 0; i < size; i += 4096) m[i] = 1;
  return m;
}

// Microseconds per hop of a token around a ring of `n` processes (pipes), `rounds` times round.
static void Ring(int n, int rounds) {
  int(*p)[2] = malloc(sizeof(int[2]) * n);
  for (int i = 0; i < n; ++i) pipe(p[i]);
  for (int i = 0; i < n; ++i) {
    if (fork() == 0) {
      char c = 0;
      for (int r = 0; r < rounds; ++r) {
        if ((i || r) && read(p[i][0], &c, 1) != 1) _exit(1);
        if (write(p[(i + 1) % n][1], &c, 1) != 1) _exit(1);
      }
      _exit(0);
    }
  }
  for (int i = 0; i < n; ++i) wait(NULL);
  free(p);
}

static double RingHop(int n) {
  // Two lengths of run: the difference is the hops alone, without the processes' start and exit.
  const int k = n < 2048 ? 2048 / n : 1;  // some 40000 hops either way
  double t = Now();
  Ring(n, 10 * k);
  const double short_run = Now() - t;
  t = Now();
  Ring(n, 30 * k);
  return (Now() - t - short_run) / (20.0 * k * n) * 1e6;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 2;
  }
  const size_t size = (size_t)kPages * 4096;
  Report("shared anonymous memory, 4 KiB pages:", Anonymous(size, 0), 4096);
  Report("shared anonymous memory, huge pages:", Anonymous(size, 1), 4096);
  int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < (off_t)kPages * 65536) {
    fprintf(stderr, "%s: cannot read it, or under 128 MiB\n", argv[1]);
    return 2;
  }
  const volatile char* file = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  long sum = 0;
  for (off_t i = 0; i < st.st_size; i += 4096) sum += file[i];  // into the page cache
  Report("a file mapping, 4 KiB stride:", file, 4096);
  Report("a file mapping, 64 KiB stride:", file, 65536);
  const int rings[] = {2, 1024};
  for (int i = 0; i < 2; ++i) printf("a token around a ring of %4d processes:     %6.1f us a hop\n", rings[i], RingHop(rings[i]));
  return sum == 42;
}
