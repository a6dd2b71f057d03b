/* The machine's floor for a wide no-op job: fork and exec N `true` processes, at most P alive at
 * once, and wait for them all (what a job of N/2 nodes must at least do: N/2 agents and their
 * N/2 tasks, had each been exec'd). Prints the seconds it took.
 *
 *   process_floor N [P]     (P: 0 or absent for all at once)
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 2048;
  const int parallel = argc > 2 && atoi(argv[2]) > 0 ? atoi(argv[2]) : n;
  char* const args[] = {"true", NULL};
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  int alive = 0, failed = 0;
  for (int i = 0; i < n; ++i) {
    if (alive == parallel) {
      int status;
      if (wait(&status) > 0) --alive;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      execvp("true", args);
      _exit(127);
    }
    if (pid < 0) ++failed; else ++alive;
  }
  for (int status; alive > 0 && wait(&status) > 0;) --alive;
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("%.3f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
  return failed ? 1 : 0;
}
