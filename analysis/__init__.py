"""Pure image + landmark functions: numpy in, numpy/dataclasses/dicts out; no web, no pipes.

The only stateful objects (the MediaPipe and torch wrappers) are bundled in `Models` and
injected, so everything else is testable with plain arrays.
"""
