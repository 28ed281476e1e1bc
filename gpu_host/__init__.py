"""The GPU host: a web process (auth, /health, the business endpoints) in front of ONE model
child process that alone imports torch and mediapipe.

    main.py           `hairgate gpu-host`: settings -> app -> Hypercorn, signals
    app.py            the Quart-trio app factory: routes, auth hook, envelopes
    auth.py           X-Internal-Token against accept_passwords (constant time)
    uploads.py        multipart / JSON bodies -> fields + image bytes (1001, 1003)
    model_process.py  the supervisor: spawn, pipe I/O, timeouts, restarts, /health state
    protocol.py       every message that crosses the pipe
    child.py          the model child's main loop (the real analysis)
    dev.py            `hairgate dev`: N hosts + a gateway on this machine
"""
