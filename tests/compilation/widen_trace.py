"""A test double for the hazard of ``hwplug.compilation.serving``, run as code in a fresh
interpreter (it changes torch.fx for the whole process)."""

# A test double that widens the window in which a plain fx trace (torch.fx.Tracer
# itself, as Inductor's placeholder trace) has replaced nn.Module.__call__ for the
# whole process: the trace's patches stay in place WINDOW seconds longer. Without it
# the window is ~0.1 ms and an eager call lands in it about once in thousands of runs.
WIDEN_PLAIN_TRACES = """
import threading, time
import torch.fx._symbolic_trace as st

WINDOW = 0.5
_plain = threading.local()
_trace, _revert = st.Tracer.trace, st._Patcher.revert_all_patches

def trace(self, root, concrete_args=None):
    before = getattr(_plain, "on", False)
    _plain.on = type(self) is st.Tracer
    try:
        return _trace(self, root, concrete_args)
    finally:
        _plain.on = before

def revert(self):
    if getattr(_plain, "on", False):
        time.sleep(WINDOW)
    return _revert(self)

st.Tracer.trace, st._Patcher.revert_all_patches = trace, revert
"""
