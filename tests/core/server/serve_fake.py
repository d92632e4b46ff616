"""`ninfer serve` over the fake engine, as its own process (the SIGTERM tests).

usage: python serve_fake.py STEP_DELAY_S DRAIN_TIMEOUT_S
Prints the port on stdout, then serves until SIGTERM; the exit code is serve_engine's.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fake_engine import make_fake_engine  # noqa: E402

from ninfer.server.app import bind, serve_engine  # noqa: E402


def main() -> int:
    engine = make_fake_engine()
    engine.model.step_delay = float(sys.argv[1])
    sock = bind("127.0.0.1", 0)
    print(sock.getsockname()[1], flush=True)
    return serve_engine(engine, sock=sock, model_id="fake-qwen", drain_timeout=float(sys.argv[2]))


if __name__ == "__main__":
    sys.exit(main())
