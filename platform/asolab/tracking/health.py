"""A store's bad day: a database file that cannot be written, a full disk, a
corrupt database, found before a run starts where that is cheap, and turned into
one line naming the store and the fix wherever it happens later.

MLflow's SQLite store wraps what SQLite said in SQLAlchemy's and its own
exceptions (and logs each one, with a traceback, before it raises it); a full
disk under the artifact folder or the temp folder is an ``OSError`` or torch's
``RuntimeError``. :func:`store_failure` looks through the whole chain for the
few conditions that no retry fixes.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
from pathlib import Path

from .store import TrackingError, sqlite_path

# What SQLite (and the OS) say, first words of the message -> the condition.
_FULL = ("database or disk is full", "no space left on device", "disk quota exceeded")
_READ_ONLY = (
    "attempt to write a readonly database",
    "read-only file system",
    "readonly database",
)
_CORRUPT = (
    "database disk image is malformed",
    "file is not a database",
    "file is encrypted or is not a database",
    "malformed database schema",
)
_ERRNO = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EROFS: "read-only"}

# MLflow logs every SQLAlchemy error with its traceback before raising it; the CLI
# turns the error into one line, so that log is quiet unless asked for (-v).
DB_LOGGER = "mlflow.store.db.utils"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen) or len(seen) > 20:
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "orig", None)]
    return seen


def condition(exc: BaseException) -> tuple[str, str]:
    """``(kind, file)``: kind is ``full``, ``read-only`` or ``corrupt`` when ``exc`` (or
    what caused it) says so, else ''; file is the path an ``OSError`` names ('' if none)."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _ERRNO:
            return _ERRNO[e.errno], str(e.filename or "")
        text = str(e).lower()
        for words, kind in ((_FULL, "full"), (_READ_ONLY, "read-only"), (_CORRUPT, "corrupt")):
            if any(w in text for w in words):
                return kind, ""
    return "", ""


def store_failure(exc: BaseException, uri: str) -> TrackingError | None:
    """One line for a store that is full, read-only or corrupt, or a full or read-only
    disk under a file the run writes elsewhere (None for anything else)."""
    kind, file = condition(exc)
    if not kind:
        return None
    db = sqlite_path(uri)
    store_dir = db.absolute().parent if db is not None else None
    if file and (store_dir is None or store_dir not in Path(file).absolute().parents):
        what = "the disk is full" if kind == "full" else "it is read-only"
        return TrackingError(
            f"cannot write {file} ({what}); free space there (or, for the temp folder, set "
            "TMPDIR to a folder with room)"
        )
    return TrackingError(failure_text(kind, uri))


def failure_text(kind: str, uri: str) -> str:
    """What is wrong with the store at ``uri`` and what to do, in one line."""
    db = sqlite_path(uri)
    where = db.absolute().parent if db is not None else None
    if kind == "full":
        room = f"free space on the disk of {where}" if where else "free space on the server's disk"
        return (
            f"tracking store {uri}: the disk is full; {room} (or point tracking.tracking_uri "
            "at a disk with room)"
        )
    if kind == "read-only":
        fix = (
            f"make {db} and {where} writable (chmod u+w; chattr -i where the file is immutable)"
            if db is not None
            else "give this user write access to the store"
        )
        return (
            f"tracking store {uri} is read-only (attempt to write a readonly database); {fix}, "
            "or point tracking.tracking_uri at another store"
        )
    fix = (
        f"restore {db} from a backup (sqlite3 {db} .recover may save its runs)"
        if db is not None
        else "repair the server's database"
    )
    return (
        f"tracking store {uri} is corrupt (database disk image is malformed); {fix}, or point "
        "tracking.tracking_uri at a new store"
    )


def check_writable_db(uri: str) -> None:
    """Refuse a SQLite store whose database file cannot take a write: read-only,
    immutable, on a full disk, or too damaged to open a transaction.

    Cheap, and changes nothing: a write transaction that rewrites page 1's
    ``user_version`` with its own value, rolled back (the journal beside the file
    takes one page). A full integrity check would read the whole file; damage it
    would find later in the file still ends a run in one line (:func:`store_failure`).
    """
    db = sqlite_path(uri)
    if db is None or not db.is_file() or db.stat().st_size == 0:
        return
    check_intact(uri)  # before the write transaction: a corrupt file is never written
    try:
        con = sqlite3.connect(str(db), timeout=30, isolation_level=None)
    except sqlite3.Error as exc:
        raise TrackingError(_check_text(uri, exc)) from None
    try:
        con.execute("BEGIN IMMEDIATE")
        version = int(con.execute("PRAGMA user_version").fetchone()[0])
        con.execute(f"PRAGMA user_version = {version}")
        con.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise TrackingError(_check_text(uri, exc)) from None
    finally:
        con.close()


def check_intact(uri: str) -> None:
    """Refuse a SQLite store whose pages are damaged, before anything writes to it.

    ``PRAGMA quick_check`` in a read-only connection (one read transaction; the file
    is opened ``mode=ro``, so not even a journal is made): damage anywhere in the
    file is found here, not by the first write that lands on it after the run has
    already committed its experiment and tags. It reads the whole file once, about
    half a second for a store of 200 MB; once per store and process.
    """
    db = sqlite_path(uri)
    if db is None or uri in _INTACT or not db.is_file() or db.stat().st_size == 0:
        return
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            found = [row[0] for row in con.execute("PRAGMA quick_check(1)")]
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise TrackingError(_check_text(uri, exc)) from None
    if found != ["ok"]:
        raise TrackingError(failure_text("corrupt", uri))
    _INTACT.add(uri)


_INTACT: set[str] = set()  # stores found intact by this process (the check reads every page)


def _check_text(uri: str, exc: sqlite3.Error) -> str:
    kind, _ = condition(exc)
    if kind:
        return failure_text(kind, uri)
    return (
        f"tracking store {uri} cannot be written ({type(exc).__name__}: {exc}); check the file "
        f"{sqlite_path(uri)} or point tracking.tracking_uri at another store"
    )


def quiet_db_errors(verbose: bool = False) -> None:
    """Keep MLflow's multi-line database error logs off the terminal (unless ``verbose``):
    the error itself reaches the user as one line."""
    if not verbose:
        logging.getLogger(DB_LOGGER).setLevel(logging.CRITICAL)
