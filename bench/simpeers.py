"""Simulated workers: N asyncio clients speaking the peer protocol to one master.

Each simulated worker opens one keep-alive connection to the master's peer API, POSTs a
signed /v1/join (rank, host w<rank>, the given address) and then long-polls a signed
GET /v1/cluster until it holds the cluster document, offering gzip as aiohttp's client (the
real worker) does. All workers start together. The answers' signatures are not checked
(that would only load this process); the document of one worker is decoded, checked
against its signature and parsed fully with rallypoint.wire to prove it is well formed.

Prints one JSON line: start time (time.monotonic, shared by every namespace of the host),
join latencies, seconds until each worker held the document, and failures.

    python bench/simpeers.py --master 10.213.0.10:7781 --session S --count 4096 \
        --address 10.213.0.11 [--token T] [--no-poll]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import resource
import time
from collections import Counter

from rallypoint import wire
from rallypoint.auth import Authenticator
from rallypoint.errors import AuthError, PeerMessageError
from rallypoint.model import Member


async def http(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes = b"",
) -> tuple[int, bytes, dict[str, str]]:
    """One HTTP/1.1 request on an open keep-alive connection: (status, body, headers)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: master", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the master closed the connection")
    status = int(status_line.split()[1])
    answer: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        answer[name.strip().lower()] = value.strip()
    length = int(answer.get("content-length", "0"))
    return status, await reader.readexactly(length), answer


async def worker(
    rank: int,
    args: argparse.Namespace,
    auth: Authenticator,
    go: asyncio.Event,
    out: dict[str, list[object]],
) -> None:
    host, port = args.master.rsplit(":", 1)
    member = Member(rank=rank, host=f"w{rank}", addresses=(args.address,), tf_port=2222)
    body = wire.encode_join(wire.JoinRequest(args.session, member))
    await go.wait()
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port)), args.timeout
        )
    except (OSError, TimeoutError) as exc:
        out["join_errors"].append(f"connect: {type(exc).__name__}")
        return
    phase = "join_errors"
    try:
        headers = {"Content-Type": "application/json", **auth.sign("POST /v1/join", body)}
        status, _, _ = await asyncio.wait_for(
            http(reader, writer, "POST", "/v1/join", headers, body), args.timeout
        )
        if status != 200:
            out["join_errors"].append(f"http {status}")
            return
        out["join_s"].append(time.monotonic() - t0)
        phase = "doc_errors"
        if args.no_poll:
            return
        while True:
            headers = {"Accept-Encoding": "gzip", **auth.sign("GET /v1/cluster?after=", b"")}
            status, doc, answer = await asyncio.wait_for(
                http(reader, writer, "GET", "/v1/cluster", headers), args.timeout
            )
            if status == 200:
                break
            if status != 204:
                out["doc_errors"].append(f"http {status}")
                return
        out["doc_at"].append(time.monotonic())
        out["doc_wire_bytes"].append(len(doc))
        if rank == 1:
            if answer.get("content-encoding") == "gzip":
                doc = gzip.decompress(doc)
            checker = Authenticator(args.token or None)
            checker.verify("200 /v1/cluster", doc, answer)
            parsed = wire.parse_cluster_doc(doc)
            out["doc_members"].append(len(parsed.members))
            out["doc_bytes"].append(len(doc))
    except (
        OSError,
        TimeoutError,
        ConnectionError,
        asyncio.IncompleteReadError,
        AuthError,
        PeerMessageError,
    ) as exc:
        out[phase].append(type(exc).__name__)
    finally:
        writer.close()


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    auth = Authenticator(args.token or None)
    go = asyncio.Event()
    out: dict[str, list[object]] = {
        k: []
        for k in (
            "join_s",
            "join_errors",
            "doc_at",
            "doc_bytes",
            "doc_wire_bytes",
            "doc_errors",
            "doc_members",
        )
    }
    tasks = [
        asyncio.create_task(worker(rank, args, auth, go, out)) for rank in range(1, args.count + 1)
    ]
    await asyncio.sleep(0.2)  # every task is parked on go.wait()
    start = time.monotonic()
    cpu0 = time.process_time()
    go.set()
    await asyncio.gather(*tasks)
    sim_cpu_s = time.process_time() - cpu0
    errors = Counter(str(e) for e in out["join_errors"] + out["doc_errors"])
    return {
        "start": start,
        "count": args.count,
        "join_ok": len(out["join_s"]),
        "join_s": out["join_s"],
        "doc_ok": len(out["doc_at"]),
        "doc_s": [float(t) - start for t in out["doc_at"]],  # type: ignore[arg-type]
        "doc_bytes": max(out["doc_bytes"], default=0),
        "doc_wire_bytes": max(out["doc_wire_bytes"], default=0),
        "doc_members": out["doc_members"][0] if out["doc_members"] else None,
        "errors": dict(errors),
        # The simulator's own CPU over the run: near the wall time means it, not the
        # master, set the pace (one process on one core plays every worker).
        "sim_cpu_s": round(sim_cpu_s, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description="simulated rallypoint workers")
    p.add_argument("--master", required=True, help="ADDRESS:PORT of the master's peer API")
    p.add_argument("--session", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--address", required=True, help="the address every worker reports")
    p.add_argument("--token", default="")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--no-poll", action="store_true", help="join only")
    args = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(json.dumps(asyncio.run(main_async(args))), flush=True)


if __name__ == "__main__":
    main()
