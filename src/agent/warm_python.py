# trainctl's warm interpreter (agent/warm_python.h), run as `python3 [FLAGS] -c THIS PATH0 SYSCALLS
# FLAGS_COUNT MODULE...`: it imports the job's preload modules once, then makes each Python worker
# of its node as a copy of itself, on the agent's request (the protocol of common/fork_server.h).
# A copy is the agent's own child (clone with CLONE_PARENT), gets the worker's environment,
# directory, CPUs, output and argv, and runs its script as __main__ the way `python3 SCRIPT` or
# `python3 -m MODULE` would: this program's own frames and names are gone before it starts.
#
# Compiled into trainctl (src/CMakeLists.txt): edit this file, not the generated one.
import sys

# sys.path[0] before any import: -c put "" there (the working directory, as it changes), where a
# fresh `python3 SCRIPT` has the script's directory. This program's own modules come from the
# standard library alone; the script's directory (argv[1]) goes first only before the preload's.
_path0 = sys.path and sys.path[0] == "" and not getattr(sys.flags, "safe_path", False)
if _path0:
    del sys.path[0]
import builtins  # noqa: E402 (every import after the path is fixed)
import ctypes  # noqa: E402
import gc  # noqa: E402
import importlib.machinery  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import socket  # noqa: E402


def _preload(modules, say):
    # Imports the job's modules once, here; whether each copy must seed torch anew. Exits (each
    # worker then starts its own interpreter) when a copy could not use what they left.
    for module in modules:
        try:
            __import__(module)
        except BaseException as e:  # SystemExit too: a module that exits serves no one
            say("cannot import " + module + ": " + type(e).__name__ + ": " + str(e))
            os._exit(1)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "cuda") and torch.cuda.is_initialized():
        say("importing it initialized CUDA, which a forked process cannot use")
        os._exit(1)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        say("importing it started %d threads, which a fork does not copy" % threads)
        os._exit(1)
    # torch seeds its default generator at random in each new process (unless a build fixes the
    # seed): a copy must not draw the same numbers as every other copy.
    return torch is not None and hasattr(torch, "initial_seed") and torch.initial_seed() != 67280421310721


class _Copier:
    # Makes the copies: each a clone of this process that is the agent's child (CLONE_PARENT),
    # set up as its request asks (the fields of common/fork_server.cc's request).

    def __init__(self, channel, sys_clone, sys_brk):
        self.channel, self.sys_clone, self.sys_brk = channel, sys_clone, sys_brk
        self.libc = ctypes.PyDLL(None, use_errno=True)  # holds the GIL: no other thread may run meanwhile
        self.libc.syscall.restype = ctypes.c_long
        self.libc.malloc.restype = ctypes.c_void_p
        self.api = ctypes.pythonapi
        self.parent = os.getppid()

    def prctl(self, *args):  # every argument an unsigned long, as the kernel reads them
        args = args + (0,) * (5 - len(args))
        return self.libc.prctl(*(ctypes.c_ulong(a) for a in args))

    def show_in_proc(self, argv, env):
        # What /proc/PID/cmdline and environ show (ps, tools that find a job's processes by its
        # environment) is the memory the kernel noted at exec: point it at the copy's own, as
        # common/fork_server.cc does. PR_SET_MM_MAP takes the whole map; the rest is passed back.
        libc = self.libc
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        rest = stat[stat.rindex(b")") + 2:].split()  # from field 3 on, numbered from 1 as in proc(5)
        field = lambda n: int(rest[n - 3])
        with open("/proc/self/auxv", "rb") as f:
            auxv = f.read()

        def block(strings):
            text = b"".join(s + b"\0" for s in strings)
            at = libc.malloc(ctypes.c_size_t(len(text)))  # for the process's life, as exec's are
            ctypes.memmove(at, text, len(text))
            return at, at + len(text)

        class Map(ctypes.Structure):
            _fields_ = [(n, ctypes.c_uint64) for n in (
                "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
                "arg_start", "arg_end", "env_start", "env_end", "auxv")] + [
                ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]

        arg_start, arg_end = block(argv)
        env_start, env_end = block(env) if env is not None else (field(50), field(51))
        auxv_buffer = ctypes.create_string_buffer(auxv, len(auxv))
        m = Map(field(26), field(27), field(45), field(46), field(47),
                libc.syscall(ctypes.c_long(self.sys_brk), ctypes.c_long(0)), field(28), arg_start, arg_end,
                env_start, env_end, ctypes.addressof(auxv_buffer), len(auxv), 0xFFFFFFFF)
        if self.prctl(35, 14, ctypes.addressof(m), ctypes.sizeof(m)) != 0:  # PR_SET_MM, PR_SET_MM_MAP
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_MM_MAP)")

    @staticmethod
    def parse_argument(text):
        # The worker's argv, each argument as LENGTH:BYTES (an argument may hold any byte but NUL).
        argv = []
        while text:
            n, _, rest = text.partition(b":")
            argv.append(rest[:int(n)])
            text = rest[int(n):]
        return argv

    def set_up(self, fields, output):
        # In the copy: what the request asks.
        self.channel.close()
        os.setpgid(0, 0)
        self.prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
        if os.getppid() != self.parent:  # the agent died meanwhile
            os._exit(127)
        if output >= 0:
            os.dup2(output, 1)
            os.dup2(output, 2)
            os.close(output)
        if fields[1]:
            os.chdir(fields[1])
        if fields[2]:
            os.sched_setaffinity(0, [int(c) for c in fields[2].split(b",")])
        argv, env = self.parse_argument(fields[0]), fields[3:]
        if env:
            os.environb.clear()
            for kv in env:
                k, _, v = kv.partition(b"=")
                os.environb[k] = v
        self.show_in_proc(argv, env if env else None)
        return argv

    def copy(self, fields, output):
        # In the copy: (its argv, 0, 0). Here: (None, its pid or -errno, the errno it could not be
        # set up with, else 0).
        r, w = os.pipe()  # close-on-exec, and closed by hand: a copy does not exec
        self.api.PyOS_BeforeFork()
        pid = self.libc.syscall(ctypes.c_long(self.sys_clone), ctypes.c_long(0x8000), ctypes.c_long(0),
                                ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))  # CLONE_PARENT
        if pid == 0:
            self.api.PyOS_AfterFork_Child()
            os.close(r)
            try:
                argv = self.set_up(fields, output)
            except OSError as e:
                os.write(w, (e.errno or 5).to_bytes(4, sys.byteorder, signed=True))
                os._exit(127)
            os.close(w)
            return argv, 0, 0
        pid = pid if pid > 0 else -ctypes.get_errno()
        self.api.PyOS_AfterFork_Parent()
        os.close(w)
        error = 0
        if pid > 0:  # the copy says whether it could be set up: end of file when it could
            got = os.read(r, 4)
            if len(got) == 4:
                error = int.from_bytes(got, sys.byteorder, signed=True)
        os.close(r)
        return None, pid, error


def _serve():
    say = lambda why: print("trainctl: warm interpreter (preload " + ", ".join(modules) + "): " + why +
                            "; each worker starts its own interpreter", file=sys.stderr, flush=True)
    path0, syscalls, flags = sys.argv[1], sys.argv[2], int(sys.argv[3])
    modules = sys.argv[4:]
    sys_clone, sys_brk = (int(n) for n in syscalls.split(","))
    # "FD[,NAME...]": the channel, and variables the agent set for this process alone.
    named = os.environ.pop("TRAINCTL_FORK_SERVER_FD", "").split(",")
    for name in named[1:]:
        os.environ.pop(name, None)
    channel = socket.socket(fileno=int(named[0]))
    if channel.type != socket.SOCK_SEQPACKET:
        os._exit(1)
    # What a fresh interpreter has in sys.path[0] for this script (its directory) or module (the
    # working directory at the start).
    if _path0:
        sys.path.insert(0, path0)
    reseed_torch = _preload(modules, say)
    gc.freeze()  # the objects imported so far stay shared: a copy's collector does not touch them
    sys.stdout.flush()
    sys.stderr.flush()
    copier = _Copier(channel, sys_clone, sys_brk)
    stdout_tty = os.isatty(1)
    try:
        copier.show_in_proc([os.fsencode(a) for a in getattr(sys, "orig_argv", [sys.executable])[:1 + flags]] +
                            [b"-c", b"(trainctl warm interpreter: " + ", ".join(modules).encode() + b")"], None)
    except OSError:
        pass  # ps shows this program's text: untidy, no more

    while True:
        try:
            data, ancillary, msg_flags, _ = channel.recvmsg(160 << 10, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
        except InterruptedError:
            continue
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)  # the agent closed the channel, or is gone
        output = -1
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                output = int.from_bytes(payload[:4], sys.byteorder, signed=True)
        fields = data.split(b"\0")
        if data.endswith(b"\0"):
            fields.pop()
        pid, error = 0, 0
        if len(fields) < 3 or msg_flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            pid = -71  # EPROTO
        else:
            argv, pid, error = copier.copy(fields, output)
            if argv is not None:  # in the copy
                return argv, stdout_tty, reseed_torch
        if output >= 0:
            os.close(output)
        try:
            channel.send(pid.to_bytes(4, sys.byteorder, signed=True) + error.to_bytes(4, sys.byteorder, signed=True))
        except OSError:
            os._exit(0)


def _run(argv, stdout_tty, reseed_torch, flags=int(sys.argv[3])):
    # In a copy: argv is the worker's whole command line. Runs its script (or -m module) in the
    # interpreter's own __main__, emptied of this program's names (sys too: bound here), as
    # `python3` would. The modules were imported before the script's directory joined sys.path:
    # these imports only bind them.
    import builtins
    import importlib.machinery
    import io
    import os
    import runpy
    import sys
    if stdout_tty and not os.isatty(1) and not sys.stdout.write_through:
        # The interpreter chose line buffering for a terminal; a worker's output is a pipe.
        old = sys.stdout
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.open(1, "wb", closefd=False), encoding=old.encoding,
                                                       errors=old.errors)
    # What a fresh interpreter seeds anew (Python's random module is, by its own fork handler).
    if reseed_torch:
        sys.modules["torch"].default_generator.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    argv = [os.fsdecode(a) for a in argv]
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = argv
    rest = argv[1 + flags:]
    main = sys.modules["__main__"].__dict__
    for name in list(main):
        if name not in ("__name__", "__doc__", "__package__", "__spec__", "__annotations__", "__builtins__"):
            del main[name]
    main["__builtins__"] = builtins
    try:
        if rest[0] == "-m":
            sys.argv = ["-m"] + rest[2:]
            runpy._run_module_as_main(rest[1], alter_argv=True)
        else:
            sys.argv = rest
            path = os.path.abspath(rest[0])
            with open(path, "rb") as f:
                source = f.read()
            main["__file__"] = path
            main["__cached__"] = None
            main["__loader__"] = importlib.machinery.SourceFileLoader("__main__", path)
            code = compile(source, path, "exec", dont_inherit=True)
            del source, f
            exec(code, main)
    except SystemExit:
        raise
    except BaseException:
        # The interpreter prints it (and exits 1, or by SIGINT for a KeyboardInterrupt) through
        # sys.excepthook: without this program's frames, whatever hook the program installed.
        hook = sys.excepthook

        def without_own_frames(kind, value, tb):
            while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
                tb = tb.tb_next
            if isinstance(value, BaseException):  # what the default hook prints
                value.__traceback__ = tb
            hook(kind, value, tb)
        sys.excepthook = without_own_frames
        raise


_run(*_serve())
