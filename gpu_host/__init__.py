"""The GPU host: a web process (auth, /health, the business endpoints) in front of ONE model
child process that alone imports torch and mediapipe.

    main.py           `hairgate gpu-host`: settings -> socket -> ONE nursery (signals, model
                      supervisor, Hypercorn): the one place the host's tasks start
    app.py            the Quart-trio app factory: routes, auth hook, envelopes
    auth.py           X-Internal-Token against accept_passwords (constant time)
    uploads.py        multipart / JSON bodies -> fields + image bytes (1001, 1003)
    supervisor.py     the model child's life as a pure state machine (no I/O, `now` passed in)
    model_process.py  the I/O around it: spawn, pipe, reaping, timers; `ready()`, `infer()`
    connections.py    idle kept-alive connections close at shutdown (Hypercorn x quart-trio)
    protocol.py       every message that crosses the pipe
    child.py          the model child's main loop (the real analysis)
"""
