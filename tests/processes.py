"""Real child processes without a fresh interpreter each: ``Popen`` and ``run`` for
``python -c CODE ARGS`` and ``python -m asolab.cli ARGS``, forked from a server that has
imported torch, MLflow, Optuna and asolab once.

Why: a test that SIGKILLs, SIGTERMs or freezes ``asolab run``, or starts three store
openers at once, is about the process boundary, not about interpreter start-up. Yet each
``sys.executable`` child re-imported torch, MLflow and Optuna (about 8 CPU-s on the
suite's 2 cores) and paid TorchDynamo's import on its first optimizer step (about 3.4 s)
before doing a second of work; the 7 files that start such children spent ~630
worker-seconds, most of it there. A child forked from this module's server starts in
milliseconds, already past those imports.

What it is: ``multiprocessing``'s forkserver context, one server per test process (each
xdist worker), started on first use with the modules in ``PRELOAD`` imported. Each child
is a real process of its own (its own pid, signals, exit status, file descriptors): the
child takes the given ``env`` (``os.environ`` replaced, so its own children inherit it),
``cwd``, ``start_new_session``, and stdin/stdout/stderr (``PIPE`` is an OS pipe dup2()ed
onto fds 0, 1 and 2, so the product's own children - study workers, ``mlflow server`` -
write into it as with ``subprocess``; ``None`` is this process's fds at the call). Then it
runs the code as the interpreter would (``__main__``, ``sys.argv``, ``sys.path[0]``),
ends as it would (non-daemon threads joined, atexit handlers run - MLflow and asolab rely
on them - stdio flushed) and exits with the interpreter's status: ``SystemExit``'s code,
1 with a traceback for an uncaught exception, killed by SIGINT after an uncaught
``KeyboardInterrupt``; a signal gives ``returncode == -N`` as ``subprocess`` does.

What it does not emulate (use ``sys.executable`` where the test is about these):
- anything an import does once: what torch read from the environment when the server
  imported it (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``, the CPU capability), a module's
  top-level code run at import, ``--help`` without torch loaded, the start-up time;
- a different ``PYTHONPATH`` for modules the server already imported (new entries are put
  on ``sys.path``, so a plugin folder works; an already imported ``asolab`` is not
  replaced);
- interpreter flags (``-u``, ``-X``, ``-W``): ``PYTHONUNBUFFERED`` in ``env`` is honoured;
- other values an import makes once per process (asolab's one, the lease token, is made
  again in every forked child by the product itself: ``tracking/lease.py _forked``);
- the family tree: the child's parent is the server, not the test process
  (``os.getppid()``, ``psutil.Process().children()`` in the test do not see it);
- warnings an import prints (MLflow's SQLAlchemy deprecation): the server printed them once;
- exit status 120 when flushing stdout fails at exit.

Coverage: under coverage.py with ``concurrency = multiprocessing`` (and ``patch = fork``
for the server's forks) the children are measured like any multiprocessing child.
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import reduction
from typing import Any

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL

# What every child imports anyway (found by listing sys.modules after a tracked run and
# a study; each module here is one the child does not import again). torch._dynamo: torch
# imports it on the first optimizer step (about 3.4 s of CPU per process). pytest: under
# ``-n 0`` the child runs pytest's script as ``__mp_main__`` (multiprocessing's rule).
PRELOAD = [
    "asolab.cli",
    "asolab.api",
    "asolab.data.load",
    "asolab.data.builtin",
    "asolab.evolution.growth",
    "asolab.evolution.mutation",
    "asolab.evolution.selection",
    "asolab.progress",
    "asolab.runner.cycle",
    "asolab.runner.resume",
    "asolab.space.network",
    "asolab.space.plot",
    "asolab.study.run",
    "asolab.tracking.browse",
    "asolab.tracking.lease",
    "asolab.tracking.lifecycle",
    "asolab.tracking.mlflow_tracker",
    "asolab.tracking.models",
    "asolab.tracking.ui",
    "torch",
    "torch._dynamo",
    "mlflow",
    "mlflow.pyfunc",
    "mlflow.store.db.utils",
    "mlflow.store.model_registry.sqlalchemy_store",
    "mlflow.store.tracking.sqlalchemy_store",
    "alembic.command",
    "alembic.migration",
    "PIL.ImageDraw",
    "PIL.ImageFont",
    "optuna",
    "pytest",
    "processes",
]

# The server's socket goes in multiprocessing's temp folder, made once per process under
# the temp folder of that moment. Made now, at collection: a test that points tempfile at
# its deep tmp_path and then starts the first child would put the socket's path past the
# 108 bytes a socket's path may have.
multiprocessing.util.get_temp_dir()

_context: multiprocessing.context.BaseContext | None = None
_lock = threading.Lock()
_live: list[Popen] = []
_kept: list[Popen] = []  # children that outlive their test (``outlives_the_test``)


def _ctx():
    """The forkserver context, its server started once per process with ``PRELOAD``."""
    global _context
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            # Python 3.11's server ignores the sys.path it is given: it imports PRELOAD from
            # PYTHONPATH, so give it this process's path (tests/ included, for this module).
            saved = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
            try:
                from multiprocessing import forkserver

                forkserver.ensure_running()
            finally:
                if saved is None:
                    del os.environ["PYTHONPATH"]
                else:
                    os.environ["PYTHONPATH"] = saved
            _context = ctx
        return _context


def warm() -> None:
    """Return once the server has imported ``PRELOAD`` (a no-op child has run): a test
    that times its children's start from now is not delayed by the first preload."""
    global _warm
    if not _warm:
        run([sys.executable, "-c", "pass"], check=True)
        _warm = True


_warm = False


class _Fd:
    """A file descriptor handed to the child (sent to the server with the request)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _received, (reduction.DupFd(self.fd),)


def _received(dup) -> int:
    return dup.detach()


def _parse(argv: list[str]) -> tuple[str, str, list[str]]:
    """("-c", code, args) or ("-m", module, args) from a ``sys.executable`` command line."""
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] not in ("-c", "-m"):
        raise ValueError(f"not a 'python -c CODE' or 'python -m MODULE' command: {argv[:3]}")
    return argv[1], argv[2], list(argv[3:])


def _reopen_stdio(unbuffered: bool) -> None:
    """Fds 0-2 are the child's now; the stream objects stay (handlers made at import hold
    them) and take the buffering an interpreter would choose for them."""
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's stdin, as at start-up
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            stream.flush()
            stream.reconfigure(
                line_buffering=fd == 2 or os.isatty(fd) or unbuffered, write_through=unbuffered
            )
        except (AttributeError, ValueError, OSError):
            pass


def _child(
    how: str,
    what: str,
    args: list[str],
    fds: tuple[Any, Any, Any],
    env: dict[str, str],
    cwd: str,
    new_session: bool,
) -> None:
    """The child's whole life: set the process up, run the code, end as Python ends."""
    if new_session:
        os.setsid()
    for target, fd in zip((0, 1, 2), fds):
        if fd is not None:
            os.dup2(fd, target)
    for fd in {f for f in fds if f is not None and f > 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    import tempfile

    tempfile.tempdir = None  # read TMPDIR again, as a fresh process does
    _reopen_stdio(bool(env.get("PYTHONUNBUFFERED")))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = "" if how == "-c" else os.getcwd()
    sys.path[:] = [first, *paths, *(p for p in sys.path if p not in paths and p != first)]

    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    status: int | str = 0
    try:
        if how == "-c":
            sys.argv = ["-c", *args]
            exec(compile(what, "<string>", "exec"), main.__dict__)
        else:
            import runpy

            sys.argv = ["-m", *args]
            # imported by the server; run afresh as __main__, as ``python -m`` does (an
            # import of it from there on makes a second copy, as it would there)
            sys.modules.pop(what, None)
            runpy._run_module_as_main(what, alter_argv=True)
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        status = "SIGINT"
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # the interpreter waits for non-daemon threads before atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if status == "SIGINT":  # as CPython does after an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(status)  # multiprocessing turns it into the exit status


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


class Popen:
    """``subprocess.Popen`` for ``[sys.executable, "-c" | "-m", ...]``, forked from the
    server (see the module docstring)."""

    def __init__(
        self,
        args: list[str],
        *,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        text: bool = False,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        start_new_session: bool = False,
    ) -> None:
        how, what, rest = _parse(list(map(str, args)))
        self.args = args
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        mine: list[int] = []  # the child's ends, closed here once it has them
        devnull = os.open(os.devnull, os.O_RDWR)
        mine.append(devnull)

        def end(spec, fd_here: int, reading: bool):
            if spec is None:
                return fd_here
            if spec == DEVNULL:
                return devnull
            if spec == PIPE:
                r, w = os.pipe()
                child, parent = (r, w) if reading else (w, r)
                mine.append(child)
                mode = ("w" if reading else "r") + ("" if text else "b")
                return child, open(parent, mode, buffering=-1 if text else 0)
            if isinstance(spec, int):
                return spec
            return spec.fileno()

        got = [end(stdin, 0, True), end(stdout, 1, False)]
        got.append(got[1] if stderr == STDOUT else end(stderr, 2, False))
        fds = []
        for i, g in enumerate(got):
            if isinstance(g, tuple):
                fds.append(g[0])
                if i == 0:
                    self.stdin = g[1]
                elif i == 1:
                    self.stdout = g[1]
                elif stderr != STDOUT:
                    self.stderr = g[1]
            else:
                fds.append(g)
        self._process = _ctx().Process(
            target=_child,
            args=(
                how,
                what,
                rest,
                tuple(_Fd(fd) for fd in fds),
                dict(os.environ if env is None else env),
                os.fspath(cwd) if cwd is not None else os.getcwd(),
                start_new_session,
            ),
            daemon=False,
        )
        try:
            self._process.start()
        finally:
            for fd in mine:
                os.close(fd)
        self.pid = self._process.pid
        _live.append(self)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None):
        """(stdout, stderr) as ``subprocess`` gives them; ``input`` goes to a piped stdin."""
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        results: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda n=n, s=s: results.__setitem__(n, s.read()), daemon=True)
            for n, s in (("out", self.stdout), ("err", self.stderr))
            if s is not None
        ]
        for t in readers:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        for s in (self.stdout, self.stderr):
            if s is not None:
                s.close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return results.get("out"), results.get("err")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never signal a pid the system may have given another
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def __enter__(self) -> Popen:
        return self

    def __exit__(self, *exc) -> None:
        for s in (self.stdin, self.stdout, self.stderr):
            if s is not None:
                s.close()
        self.wait()


def run(
    args: list[str],
    *,
    input=None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs,
) -> subprocess.CompletedProcess:
    """``subprocess.run`` for the commands ``Popen`` takes."""
    if capture_output:
        kwargs.update(stdout=PIPE, stderr=PIPE)
    if input is not None:
        kwargs["stdin"] = PIPE
    proc = Popen(args, **kwargs)
    try:
        out, err = proc.communicate(input, timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    done = subprocess.CompletedProcess(args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def outlives_the_test(proc: Popen) -> Popen:
    """``proc``, left running past the end of its test (a module-scoped fixture's server,
    which the fixture stops): ``kill_leftovers`` at a test's end passes it by; the
    session's end still kills it."""
    _live.remove(proc)
    _kept.append(proc)
    return proc


def kill_leftovers(also_kept: bool = False) -> list[int]:
    """SIGKILL every child still running (end of a test; with ``also_kept``, of the
    session); their pids."""
    killed = []
    if also_kept:
        _live.extend(_kept)
        _kept.clear()
    while _live:
        proc = _live.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
            killed.append(proc.pid)
    return killed


def shutdown() -> None:
    """End every child, then the server, and reap it (multiprocessing leaves it to exit on
    its own, after this process, whose ``RUSAGE_CHILDREN`` then never counts it: nor do
    ``/usr/bin/time pytest`` and ``resource.getrusage``). conftest.py calls this at the end
    of each session (each xdist worker's, before xdist stops the worker); atexit otherwise.
    A later ``Popen`` starts a new server."""
    global _context, _warm
    from multiprocessing import forkserver

    kill_leftovers(also_kept=True)
    _warm = False
    with _lock:
        if _context is None:
            return
        _context = None
        # multiprocessing's own stop: EOF on the server's "alive" pipe, then waitpid
        forkserver._forkserver._stop()


atexit.register(shutdown)
