"""The GPU host: a web process (auth, /health, the business endpoints) in front of ONE model
child process that alone imports torch and mediapipe.

    main.py           `hairgate gpu-host`: settings -> socket -> ONE nursery (signals, model
                      supervisor, Hypercorn): the one place the host's tasks start
    app.py            the Quart-trio app factory: the auth hook and envelopes app-wide, the
                      routes as blueprints (status: /health, /metrics; api: one per
                      registry endpoint; admin)
    auth.py           X-Internal-Token against accept_passwords (constant time)
    supervisor.py     the model child's life as a pure state machine (no I/O, `now` passed in)
    model_process.py  the I/O around it: spawn, pipe, reaping, timers; `ready()`, `infer()`
    connections.py    idle kept-alive connections close at shutdown (Hypercorn x quart-trio)
    protocol.py       every message that crosses the pipe
    child.py          the model child's main loop (the real analysis)
    failure_kinds.py  what went wrong, by kind (cuda_oom, timeout, input_rejected, ...)
    checks.py         deep health checks: disk, ComfyUI
    comfyui.py        the ComfyUI client (generation)
    admin.py          the host's admin blueprint (/admin/tokens)
    metrics.py        the host's Prometheus metrics
    wanted.py         another gateway waits for this host (/health's "wanted")
(The request bodies are parsed by `shared.contract.uploads`, which both services import.)
"""
