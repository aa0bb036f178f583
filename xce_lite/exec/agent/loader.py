"""The top of the agent's one shipped file: an importer of the agent's package, from the sources in
that file or from their code compiled on this host, and boot(), which runs main.main.

bundle.py (the controller's side) writes the shipped file as a header and this module's text, then
LOADER (the same text, header included), MODULES ((name, source) of every other module) and TAIL.
Bundle.compiled() makes the form units run, SPOOL/bin/agent-<hash>.<cache tag>.pyc: LOADER's text,
then ORIGIN (the shipped file) and CODE ((name, marshalled code) of every module, compiled by this
host's Python), then TAIL.

Standard library only, and nothing of the package: this runs before there is one. Every unit's
interpreter runs it, so it loads nothing that the interpreter has not loaded already (marshal and
_frozen_importlib are; os is, once the agent's modules run). See docs/agent-protocol.md.
"""

from __future__ import annotations

import marshal
import os
import sys

try:
    from _frozen_importlib import ModuleSpec  # loaded at start: importlib.machinery would cost every unit
except ImportError:  # pragma: no cover - other Pythons
    from importlib.machinery import ModuleSpec

PACKAGE = "xce_agent"  # the package's name in the agent's interpreter
TAIL = '\nif __name__ == "__main__":\n    sys.exit(boot(globals()))\n'


class Bundle:
    """The agent's modules, as the importer (finder and loader, first on sys.meta_path) of PACKAGE.

    `path` is the file this interpreter runs; `origin` the shipped file (`path` itself, or the one
    the compiled form was made from), which tracebacks name as ORIGIN/MODULE.py. Exactly one of
    `sources` (module -> text: the shipped form, with `loader`, its LOADER) and `codes` (module ->
    marshalled code: the compiled form) is given. A module is compiled or unmarshalled
    when it is first imported, so that a command loads only the modules it imports.
    """

    def __init__(self, path: str, origin: str, sources: dict | None = None, codes: dict | None = None,
                 loader: str | None = None):
        self.path, self.origin, self.sources, self.codes, self.loader = path, origin, sources, codes, loader
        self._shipped: dict | None = None  # the shipped file's sources, read for a traceback

    def module(self, name: str) -> str | None:
        """The module's name in the bundle ("__init__" for PACKAGE itself), or None if it is not one."""
        if name == PACKAGE:
            return "__init__"
        short = name[len(PACKAGE) + 1 :] if name.startswith(PACKAGE + ".") else None
        table = self.codes if self.codes is not None else self.sources
        return short if table is not None and short in table else None

    def find_spec(self, name: str, path=None, target=None):
        short = self.module(name)
        if short is None:
            return None
        # a finder and loader by protocol: importlib.abc would cost every unit's interpreter an import
        return ModuleSpec(name, self, origin=self.filename(short), is_package=short == "__init__")  # type: ignore[arg-type]

    def create_module(self, spec):
        return None  # a plain module

    def exec_module(self, module) -> None:
        short = self.module(module.__name__)
        assert short is not None  # find_spec() found it
        if self.codes is not None:
            code = marshal.loads(self.codes[short])
        else:
            assert self.sources is not None  # exactly one of codes and sources is given
            code = compile(self.sources[short], self.filename(short), "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def filename(self, short: str) -> str:
        return f"{self.origin}/{short}.py"

    def get_source(self, name: str) -> str | None:
        """A module's text, for the lines of a traceback (linecache asks); None if it cannot be had
        (the compiled form reads the shipped file, which may be gone)."""
        short = self.module(name)
        if short is None:
            return None
        if self.sources is not None:
            return self.sources[short]
        if self._shipped is None:
            try:
                with open(self.origin, encoding="utf-8") as f:
                    text = f.read()
                shipped: dict = {"__name__": "shipped"}  # not __main__: defines MODULES, runs nothing
                exec(compile(text, self.origin, "exec", dont_inherit=True), shipped)
                self._shipped = dict(shipped["MODULES"])
            except (OSError, ValueError, SyntaxError, KeyError):
                return None
        return self._shipped.get(short)

    def compiled(self, bin_dir: str) -> str:
        """The path of this agent compiled for this Python in `bin_dir`, made once (atomically):
        BIN/agent-<sha256 prefix of the shipped file>.<cache tag>.pyc; this file if it is that one.
        A unit's `exec` and `post` are fresh interpreters: compiling the modules they need from
        source would cost each ~15 ms."""
        if self.codes is not None:
            return self.path
        import hashlib
        import importlib.util

        with open(self.path, "rb") as f:
            shipped = f.read()
        digest = hashlib.sha256(shipped).hexdigest()[:16]
        target = os.path.join(bin_dir, f"agent-{digest}.{sys.implementation.cache_tag}.pyc")
        if os.path.exists(target):
            return target
        assert self.sources is not None  # exactly one of codes and sources is given
        codes = tuple((short, marshal.dumps(compile(text, self.filename(short), "exec", dont_inherit=True)))
                      for short, text in sorted(self.sources.items()))
        head = f"{self.loader}\nORIGIN = {self.origin!r}\nCODE = {codes!r}\n"
        # TAIL on the line it has in the shipped file, which a traceback's lines are read from
        pad = "\n" * max(0, shipped[: shipped.rindex(TAIL.encode())].count(b"\n") - head.count("\n"))
        code = compile(head + pad + TAIL, self.path, "exec", dont_inherit=True)
        # run as a script, a .pyc's 12 bytes after the magic number (flags, source stamp) are not read
        data = importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code)
        tmp = f"{target}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(tmp, target)
        return target


def excepthook(kind, value, tb) -> None:
    """Print an uncaught exception with the traceback module, which asks the Bundle for its modules'
    lines (linecache); the interpreter's own printer reads only files, and they are not files."""
    import traceback

    traceback.print_exception(kind, value, tb)


def boot(namespace: dict) -> int:
    """Run the agent's command line (main.main) from the bundle in `namespace`, the globals of the
    file this interpreter runs (shipped: MODULES and LOADER; compiled: CODE and ORIGIN); its exit
    status."""
    path = os.path.abspath(namespace["__file__"])
    if "CODE" in namespace:
        bundle = Bundle(path, namespace["ORIGIN"], codes=dict(namespace["CODE"]))
    else:
        bundle = Bundle(path, path, sources=dict(namespace["MODULES"]), loader=namespace["LOADER"])
    sys.meta_path.insert(0, bundle)
    sys.excepthook = excepthook
    __import__(f"{PACKAGE}.main")
    return sys.modules[f"{PACKAGE}.main"].main(sys.argv[1:], bundle)
