"""Module scopes for Python programs, without changing them.

Global forward hooks put every nn.Module call in a scope; the recorder gives
the operators inside it that scope's path. Paths come from named_modules() of
the outermost module called ("blocks.1.attn.proj"); the outermost module
itself has the empty path. A module called on its own before the model that
holds it is named relative to itself until the model's first call names it
in full.

The hooks call the recorder's opguard_push_scope / opguard_pop_scope
(libopguard_record.so, through ctypes) when the process has the recorder
loaded: 0.35 us a module call. Without them they open a RecordFunction range
named "opguard::scope/=<path>" with torch.autograd.profiler.record_function
(6.6 us a module call: two dispatcher calls and a TorchScript object), which
the recorder reads the same way. OPGUARD_TEST_PY_SCOPE_RANGES=1 forces the
ranges (tests compare both).
"""

import os
import sys
import threading
import weakref

_installed = False
_names = weakref.WeakKeyDictionary()  # module -> its path, UTF-8 bytes
_local = threading.local()
_push = None  # opguard_push_scope(path) -> token, or None: ranges
_pop = None   # opguard_pop_scope(token)
_compile_begin = None  # opguard_compile_begin(), opguard_compile_end(): with _push
_compile_end = None
_compiling = None  # torch.compiler.is_compiling, bound by install()

PREFIX = "opguard::scope/="


def _stack():
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def _path_of(module):
    path = _names.get(module)
    if path is None:
        # Not seen yet: it is the outermost module of a call tree. Name it and
        # everything below it, also what a part of it was named when that part
        # was called on its own first (a probe of one block before training):
        # those names were relative to the part ("fc" for "blocks.1.fc").
        for sub_name, sub in module.named_modules():
            _names[sub] = sub_name.encode()
        path = b""
    return path


def _pre_hook(module, args):
    if _compiling():
        # Traced by torch.compile (dynamo inlines global module hooks): the
        # compiled graph gets no scope calls, so tracing sees none of this
        # hook's Python state (it failed on the WeakKeyDictionary) and the
        # graph is the one an unrecorded run compiles.
        return None
    path = _path_of(module)
    if not path:
        _stack().append(None)
    elif _push is not None:
        _stack().append(_push(path))
    else:
        import torch

        rf = torch.autograd.profiler.record_function(PREFIX + path.decode())
        rf.__enter__()
        _stack().append(rf)
    return None


def _post_hook(module, args, output):
    if _compiling():
        return None
    s = _stack()
    if not s:
        return None
    entry = s.pop()
    if entry is None:
        return None
    if isinstance(entry, int):
        _pop(entry)
    else:
        entry.__exit__(None, None, None)
    return None


def _bind_scope_calls():
    """opguard_push_scope / opguard_pop_scope from a recorder library already
    in the process (LD_PRELOAD under `opguard record`, or opguard.load()); never
    loads one."""
    global _push, _pop, _compile_begin, _compile_end
    if _push is not None or os.environ.get("OPGUARD_TEST_PY_SCOPE_RANGES") == "1":
        return
    import ctypes

    libraries = [None]  # the global namespace: LD_PRELOAD puts the recorder there
    try:
        from opguard import _library_path

        libraries.append(_library_path())
    except Exception:
        pass
    for name in libraries:
        try:
            mode = os.RTLD_NOLOAD | os.RTLD_LOCAL if name else ctypes.DEFAULT_MODE
            lib = ctypes.PyDLL(name, mode=mode)  # PyDLL: the calls keep the GIL
            push, pop = lib.opguard_push_scope, lib.opguard_pop_scope
        except (OSError, AttributeError):
            continue
        push.argtypes, push.restype = [ctypes.c_char_p], ctypes.c_uint64
        pop.argtypes, pop.restype = [ctypes.c_uint64], None
        _push, _pop = push, pop
        try:
            begin, end = lib.opguard_compile_begin, lib.opguard_compile_end
            begin.argtypes, begin.restype = [], None
            end.argtypes, end.restype = [], None
            _compile_begin, _compile_end = begin, end
        except AttributeError:
            pass
        return


def _watch_compilations(handler):
    """Tells the recorder when torch.compile compiles: torch._dynamo runs its
    compile callbacks around each compilation (a traced frame; a backward
    compiled at its first run). The ops in between (on FakeTensors, and real
    ones: constants, copies) are the compiler's: a run that loads the compiled
    code from inductor's cache has none of them. Wraps the handler's runners
    rather than registering callbacks, which torch._dynamo.reset() clears."""
    if _compile_begin is None or getattr(handler, "_opguard_watched", False):
        return
    run_start, run_end = handler.run_start_callbacks, handler.run_end_callbacks

    def start(args):
        _compile_begin()
        run_start(args)

    def end(args):
        try:
            run_end(args)
        finally:
            _compile_end()

    handler.run_start_callbacks, handler.run_end_callbacks = start, end
    handler._opguard_watched = True


class _AfterImport:
    """Runs `then(module)` once the program imports `name`, right after the
    module's own code, without importing it for the program."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        import importlib.machinery

        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            try:
                self.then(module)
            except Exception as e:  # the recorder never takes the run down
                sys.stderr.write("opguard: %s\n" % e)

        spec.loader.exec_module = exec_module
        return spec


def after_import(name, then):
    """`then(module)` now if `name` is imported, else once the program imports it."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


def _watch_dynamo():
    # torch._dynamo's compilations, from its first torch.compile call on.
    if _compile_begin is not None:
        after_import("torch._dynamo.callback", lambda m: _watch_compilations(m.callback_handler))


def install():
    global _installed, _compiling
    _bind_scope_calls()
    _watch_dynamo()
    if _installed:
        return
    import torch.compiler
    import torch.nn.modules.module as m

    _compiling = torch.compiler.is_compiling

    m.register_module_forward_pre_hook(_pre_hook)
    m.register_module_forward_hook(_post_hook, always_call=True)
    _installed = True
