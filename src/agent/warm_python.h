// Warm interpreters: a job's Python workers made as copies of one interpreter per node (and per
// script) that has imported the spec's `preload` modules (import torch: 1.7 s and 0.6 GB of private
// pages per process on a 2-core VM), instead of each starting an interpreter and importing them
// again, at the first start and at every restart. The interpreter runs agent/warm_python.py and
// speaks common/fork_server.h's protocol, so agent/worker_forks.h serves it as it serves the built-in
// trainer's worker servers; a copy runs its script the way `python3 SCRIPT` (or `-m MODULE`) would.
// docs/own-program.md lists what differs from a fresh interpreter.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace trainctl {

// agent/warm_python.py's text (compiled in).
extern const char* const kWarmPythonSource;

// Whether `program` (a command's first word) names a Python interpreter: python, python3,
// python3.11, /usr/bin/python3.
bool IsPythonInterpreter(const std::string& program);

// A warm interpreter for a command: the interpreter's own command line (the same program and
// interpreter options, importing `preload`), and the argument a copy of it takes (the worker's
// command line).
struct WarmPythonPlan {
  std::vector<std::string> server_argv;
  std::string argument;
};
// The plan for `argv` (python3 [OPTIONS] SCRIPT [ARGS], or python3 [OPTIONS] -m MODULE [ARGS]) run
// in `cwd` (empty: this process's), or why a copy cannot run it the way the interpreter would
// (python3 -c, -i, -x, a script that is not a source file, ...).
Result<WarmPythonPlan> PlanWarmPython(const std::vector<std::string>& argv, const std::vector<std::string>& preload,
                                      const std::string& cwd);

}  // namespace trainctl
