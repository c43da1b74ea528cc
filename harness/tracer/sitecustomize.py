"""Changed-line tracer, loaded by Python at start-up when this directory is on PYTHONPATH.

Untimed coverage pass of the gate: it records which of the changed lines of a patch ran.
AGENTSEARCH_TRACE_FILES names a JSON file {absolute path: [line, ...]}; every watched line
the first time it runs is appended to AGENTSEARCH_TRACE_OUT/hits-<pid>.txt as "path\\tline"
(written at once, so processes that are killed still leave their hits). Only frames of the
watched files get a line tracer; everything else costs one call per function call.
Stdlib only: this runs inside the candidate's environment.
"""

import json
import os
import sys
import threading


def _install():
    spec = os.environ.get("AGENTSEARCH_TRACE_FILES")
    out_dir = os.environ.get("AGENTSEARCH_TRACE_OUT")
    if not spec or not out_dir:
        return
    try:
        with open(spec) as fh:
            watched = {os.path.realpath(k): set(v) for k, v in json.load(fh).items()}
    except (OSError, ValueError):
        return
    cwd = os.getcwd()
    resolved = {}
    seen = set()
    lock = threading.Lock()
    out_path = os.path.join(out_dir, f"hits-{os.getpid():d}.txt")

    def real(filename):
        r = resolved.get(filename)
        if r is None:
            r = os.path.realpath(os.path.join(cwd, filename)) if not filename.startswith("<") else filename
            resolved[filename] = r
        return r

    def record(path, line):
        key = (path, line)
        with lock:
            if key in seen:
                return
            seen.add(key)
            try:
                with open(out_path, "a") as fh:
                    fh.write(f"{path}\t{line:d}\n")
            except OSError:
                pass

    def tracer(frame, event, arg):
        if event != "call":
            return None
        path = real(frame.f_code.co_filename)
        lines = watched.get(path)
        if lines is None:
            return None
        if frame.f_lineno in lines:
            record(path, frame.f_lineno)

        def local(f, ev, a):
            if ev == "line" and f.f_lineno in lines:
                record(path, f.f_lineno)
            return local

        return local

    sys.settrace(tracer)
    threading.settrace(tracer)


_install()
