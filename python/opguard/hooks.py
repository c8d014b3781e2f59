"""Module scopes for Python programs, without changing them.

Global forward hooks put every nn.Module call in a scope; the recorder gives
the operators inside it that scope's path. Paths come from named_modules() of
the outermost module called ("blocks.1.attn.proj"); the outermost module
itself has the empty path.

The hooks call the recorder's opguard_push_scope / opguard_pop_scope
(libopguard_record.so, through ctypes) when the process has the recorder
loaded: 0.35 us a module call. Without them they open a RecordFunction range
named "opguard::scope/=<path>" with torch.autograd.profiler.record_function
(6.6 us a module call: two dispatcher calls and a TorchScript object), which
the recorder reads the same way. OPGUARD_TEST_PY_SCOPE_RANGES=1 forces the
ranges (tests compare both).
"""

import os
import threading
import weakref

_installed = False
_names = weakref.WeakKeyDictionary()  # module -> its path, UTF-8 bytes
_local = threading.local()
_push = None  # opguard_push_scope(path) -> token, or None: ranges
_pop = None   # opguard_pop_scope(token)
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
        # everything below it.
        for sub_name, sub in module.named_modules():
            if sub not in _names:
                _names[sub] = sub_name.encode()
        path = _names.get(module, b"")
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
    global _push, _pop
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
        return


def install():
    global _installed, _compiling
    _bind_scope_calls()
    if _installed:
        return
    import torch.compiler
    import torch.nn.modules.module as m

    _compiling = torch.compiler.is_compiling

    m.register_module_forward_pre_hook(_pre_hook)
    m.register_module_forward_hook(_post_hook, always_call=True)
    _installed = True
