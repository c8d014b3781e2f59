# Put on PYTHONPATH by `opguard record`: installs opguard's module-scope hooks
# as soon as the program imports torch, then runs any sitecustomize that this
# one hides. Changes nothing else in the program.
import importlib.machinery
import os
import sys


def _chain_hidden_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


def _install_hooks(torch_module=None):
    try:
        from opguard import hooks

        hooks.install()
    except Exception as e:  # the recorder never takes the run down
        sys.stderr.write("opguard: module scopes are off: %s\n" % e)


def _stop_recording():
    # A program that dies of an uncaught KeyboardInterrupt (Ctrl-C) re-raises
    # SIGINT after Python's exit handlers, so C's, where the recorder finishes
    # the recording, never run. Registered first, this runs after the
    # program's own exit handlers (a checkpoint saved there is recorded).
    import ctypes

    try:
        stop = ctypes.CDLL(None).opguard_stop_recording  # the preloaded recorder
    except (OSError, AttributeError):
        return
    stop.argtypes, stop.restype = [], None
    stop()


if os.environ.get("OPGUARD_OUT"):
    try:
        import atexit

        from opguard import hooks

        hooks.after_import("torch", _install_hooks)  # opguard.hooks imports no torch
        atexit.register(_stop_recording)
    except Exception as e:
        sys.stderr.write("opguard: module scopes are off: %s\n" % e)

try:
    import importlib.util

    _chain_hidden_sitecustomize()
except Exception as e:
    sys.stderr.write("opguard: a sitecustomize hidden by opguard failed: %s\n" % e)
