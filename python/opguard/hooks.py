"""Module scopes for Python programs, without changing them.

Global forward hooks open a RecordFunction range named "opguard::scope/=<path>"
around every nn.Module call; the recorder reads those ranges as the scope path
of the operators inside. Paths come from named_modules() of the outermost
module called ("blocks.1.attn.proj"); the outermost module itself has the
empty path.
"""

import threading
import weakref

_installed = False
_names = weakref.WeakKeyDictionary()
_local = threading.local()

PREFIX = "opguard::scope/="


def _stack():
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def _name_of(module):
    name = _names.get(module)
    if name is None:
        # Not seen yet: it is the outermost module of a call tree. Name it and
        # everything below it.
        for sub_name, sub in module.named_modules():
            if sub not in _names:
                _names[sub] = sub_name
        name = _names.get(module, "")
    return name


def _pre_hook(module, args):
    import torch

    name = _name_of(module)
    if not name:
        _stack().append(None)
        return None
    rf = torch.autograd.profiler.record_function(PREFIX + name)
    rf.__enter__()
    _stack().append(rf)
    return None


def _post_hook(module, args, output):
    s = _stack()
    if not s:
        return None
    rf = s.pop()
    if rf is not None:
        rf.__exit__(None, None, None)
    return None


def install():
    global _installed
    if _installed:
        return
    import torch.nn.modules.module as m

    m.register_module_forward_pre_hook(_pre_hook)
    m.register_module_forward_hook(_post_hook, always_call=True)
    _installed = True
