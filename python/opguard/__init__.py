"""opguard from Python: control the recorder of libopguard_record.so.

    import opguard
    with opguard.record("runA", policy="steps=3"):
        train()                      # opguard.step() after each optimizer step is optional:
                                     # PyTorch's Optimizer.step ends steps by itself
    opguard.mark(tensor, "logits")   # a boundary tensor, always stored in full

Under `opguard record` the recorder is already running and module scopes are
installed; this module is only needed for programs that want control.
"""

import contextlib
import os

from . import hooks

__all__ = ["load", "start", "stop", "step", "mark", "active", "record", "install_module_hooks"]

_loaded = False


def _library_path():
    env = os.environ.get("OPGUARD_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    # <build>/python/opguard: <build>/lib; <prefix>/share/opguard/python/opguard: <prefix>/lib.
    for rel in ("../../lib/libopguard_record.so", "../../../../lib/libopguard_record.so"):
        p = os.path.normpath(os.path.join(here, rel))
        if os.path.exists(p):
            return p
    raise RuntimeError("libopguard_record.so was not found: set OPGUARD_LIB to its path")


def load():
    """Loads libopguard_record.so into torch (torch.ops.opguard.*)."""
    global _loaded
    if _loaded:
        return
    import torch

    torch.ops.load_library(_library_path())
    _loaded = True


def start(out, policy="", queue="", strict=False):
    load()
    import torch

    hooks.install()
    torch.ops.opguard.start(out, policy, queue, strict)


def stop():
    load()
    import torch

    torch.ops.opguard.stop()


def step():
    load()
    import torch

    torch.ops.opguard.step()


def active():
    load()
    import torch

    return bool(torch.ops.opguard.active())


def mark(tensor, name):
    load()
    import torch

    torch.ops.opguard.mark(tensor, name)


@contextlib.contextmanager
def record(out, policy="", queue="", strict=False):
    start(out, policy, queue, strict)
    try:
        yield
    finally:
        stop()


def install_module_hooks():
    hooks.install()
