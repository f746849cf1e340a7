"""A bare aiohttp server answering GET /env with a fixed JSON body: the throughput reference.

Usage: python -m bench.bare_server PORT BODY_FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

from aiohttp import web


def main() -> None:
    port, body = int(sys.argv[1]), Path(sys.argv[2]).read_bytes()

    async def env(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/env", env)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
