"""Simulated workers: N asyncio clients speaking the peer protocol to one master.

Each simulated worker opens one keep-alive connection to the master's peer API, POSTs a
signed /v1/join (rank, host w<rank>, the given address), long-polls a signed
GET /v1/cluster until it holds the cluster document (offering gzip as aiohttp's client, the
real worker, does), then reports its checks as passed for that document's generation
(POST /v1/report) and long-polls the report until the master's verdict says verified, as a
real worker does before it turns ready. All workers start together.

Every document answer's bytes are kept apart by content: a run is correct only when every
worker got the same bytes and that one document, decoded, checked against its signature and
parsed fully with rallypoint.wire, lists every node. The other answers' signatures are not
checked (that would only load this process).

Several processes can share the simulated ranks (--first, --count) and start at the same
instant (--start-at, a time.monotonic() value, shared by every namespace of the host).

Prints one JSON line: start time, join latencies, seconds until each worker held the
document and the verified verdict, the digests of the documents seen, failures, own CPU.

    python -m bench.simpeers --master 10.213.0.10:7781 --session S --count 4096 \
        --address 10.213.0.11 [--first 1] [--start-at T] [--token T] [--no-poll] [--no-report]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import resource
import time
from collections import Counter
from collections.abc import Callable

from rallypoint import wire
from rallypoint.auth import Authenticator
from rallypoint.core import fanout
from rallypoint.errors import AuthError, PeerMessageError
from rallypoint.model import Member
from rallypoint.wire import batch as wirebatch
from rallypoint.wire import cluster


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


class Documents:
    """The distinct document answers of this process: bytes -> (generation, digest)."""

    def __init__(self, token: str) -> None:
        self.checker = Authenticator(token or None)
        self.seen: dict[bytes, tuple[str, str]] = {}
        self.members: int | None = None
        self.body_bytes = 0

    def read(self, payload: bytes, headers: dict[str, str]) -> str:
        """The generation of a document answer; the first of each content is checked fully."""
        known = self.seen.get(payload)
        if known is not None:
            return known[0]
        body = gzip.decompress(payload) if headers.get("content-encoding") == "gzip" else payload
        self.checker.verify("200 /v1/cluster", body, headers)
        parsed = cluster.parse_cluster_doc(body)
        self.members = len(parsed.members)
        self.body_bytes = len(body)
        self.seen[payload] = (parsed.generation, hashlib.sha256(body).hexdigest())
        return parsed.generation


def member(rank: int, args: argparse.Namespace) -> Member:
    return Member(rank=rank, host=f"w{rank}", addresses=(args.address,), tf_port=2222)


async def connect(
    target: str, args: argparse.Namespace, out: dict[str, list[object]]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    host, port = target.rsplit(":", 1)
    try:
        return await asyncio.wait_for(asyncio.open_connection(host, int(port)), args.timeout)
    except (OSError, TimeoutError) as exc:
        out["join_errors"].append(f"connect: {type(exc).__name__}")
        return None


async def worker(
    rank: int,
    args: argparse.Namespace,
    auth: Authenticator,
    docs: Documents,
    go: asyncio.Event,
    out: dict[str, list[object]],
    target: str,
) -> None:
    own = member(rank, args)
    body = wire.encode_join(wire.JoinRequest(args.session, own))
    await go.wait()
    t0 = time.monotonic()
    connection = await connect(target, args, out)
    if connection is None:
        return
    reader, writer = connection

    async def post(path: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        headers = {"Content-Type": "application/json", **auth.sign(f"POST {path}", body)}
        return await asyncio.wait_for(
            http(reader, writer, "POST", path, headers, body), args.timeout
        )

    phase = "join_errors"
    try:
        status, _, _ = await post("/v1/join", body)
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
        generation = docs.read(doc, answer)
        if args.no_report:
            return
        phase = "report_errors"
        seen = -1
        while True:
            report = wire.Report(args.session, generation, rank, own.host, True, seen=seen)
            status, answer_body, _ = await post("/v1/report", wire.encode_report(report))
            if status != 200:
                out["report_errors"].append(f"http {status}")
                return
            verdict = wire.parse_verdict(answer_body)
            if verdict.generation != generation:
                out["report_errors"].append("verdict for another generation")
                return
            if verdict.failures:
                out["report_errors"].append(f"failed: {verdict.failures[0].code}")
                return
            if verdict.verified:
                break
            seen = verdict.version
        out["verified_at"].append(time.monotonic())
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


async def relay(
    rank: int,
    group: range,
    args: argparse.Namespace,
    auth: Authenticator,
    docs: Documents,
    go: asyncio.Event,
    out: dict[str, list[object]],
) -> None:
    """A simulated relay, as the master sees one: its own join, one batch of its group's joins,
    one document long-poll, its own report and its group's reports as one batch, each
    long-polled until verified. Its members' times are the relay's: the hop from a relay
    to its members is measured with a real relay (--real-relay), not here."""
    own = member(rank, args)
    members = [member(r, args) for r in group]
    join = wire.encode_join(wire.JoinRequest(args.session, own))
    batch = wirebatch.encode_join_batch(wirebatch.JoinBatch(args.session, rank, tuple(members)))
    await go.wait()
    t0 = time.monotonic()
    first = await connect(args.master, args, out)
    second = await connect(args.master, args, out)
    if first is None or second is None:
        return

    async def post(
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], path: str, body: bytes
    ) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", **auth.sign(f"POST {path}", body)}
        status, answer, _ = await asyncio.wait_for(
            http(*connection, "POST", path, headers, body), args.timeout
        )
        return status, answer

    async def until_verified(
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        path: str,
        encode: Callable[[int], bytes],
    ) -> None:
        seen = -1
        while True:
            status, answer = await post(connection, path, encode(seen))
            if status != 200:
                raise RuntimeError(f"{path}: http {status}")
            verdict = wire.parse_verdict(answer)
            if verdict.failures:
                raise RuntimeError(f"failed: {verdict.failures[0].code}")
            if verdict.verified:
                return
            seen = verdict.version

    phase = "join_errors"
    try:
        for path, body in (("/v1/join", join), ("/v1/joins", batch)):
            status, _ = await post(first, path, body)
            if status != 200:
                out["join_errors"].append(f"http {status}")
                return
        out["join_s"].extend([time.monotonic() - t0] * (1 + len(members)))
        phase = "doc_errors"
        while True:
            headers = {"Accept-Encoding": "gzip", **auth.sign("GET /v1/cluster?after=", b"")}
            status, doc, answer = await asyncio.wait_for(
                http(*first, "GET", "/v1/cluster", headers), args.timeout
            )
            if status == 200:
                break
            if status != 204:
                out["doc_errors"].append(f"http {status}")
                return
        out["doc_at"].extend([time.monotonic()] * (1 + len(members)))
        out["doc_wire_bytes"].append(len(doc))
        generation = docs.read(doc, answer)
        phase = "report_errors"
        reports = tuple(
            wire.Report(args.session, generation, m.rank, m.host, True) for m in members
        )
        await asyncio.gather(
            until_verified(
                second,
                "/v1/report",
                lambda seen: wire.encode_report(
                    wire.Report(args.session, generation, rank, own.host, True, seen=seen)
                ),
            ),
            until_verified(
                first,
                "/v1/reports",
                lambda seen: wirebatch.encode_report_batch(
                    wirebatch.ReportBatch(args.session, generation, rank, reports, seen)
                ),
            ),
        )
        out["verified_at"].extend([time.monotonic()] * (1 + len(members)))
    except (
        OSError,
        TimeoutError,
        ConnectionError,
        RuntimeError,
        asyncio.IncompleteReadError,
        AuthError,
        PeerMessageError,
    ) as exc:
        out[phase].append(str(exc) if isinstance(exc, RuntimeError) else type(exc).__name__)
    finally:
        for _, writer in (first, second):
            writer.close()


def plan(args: argparse.Namespace, nnodes: int) -> list[tuple[str, int, range]]:
    """What each simulated rank does: ("worker", rank, target) rows and ("relay", rank, group)."""
    size = args.relay_group
    rows: list[tuple[str, int, range]] = []
    for rank in range(args.first, args.first + args.count):
        if rank == args.real_worker:
            continue  # a real sidecar plays it
        relay_rank = fanout.relay_of(rank, size)
        if relay_rank is not None and relay_rank == args.real_relay:
            rows.append(("worker-via-relay", rank, range(0)))
        elif relay_rank is not None:
            continue  # its relay plays it
        elif fanout.group(rank, size, nnodes) and rank != args.real_relay:
            rows.append(("relay", rank, fanout.group(rank, size, nnodes)))
        elif rank != args.real_relay:
            rows.append(("worker", rank, range(0)))
    return rows


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    auth = Authenticator(args.token or None)
    docs = Documents(args.token)
    go = asyncio.Event()
    out: dict[str, list[object]] = {
        k: []
        for k in (
            "join_s",
            "join_errors",
            "doc_at",
            "doc_wire_bytes",
            "doc_errors",
            "verified_at",
            "report_errors",
        )
    }
    tasks = []
    for kind, rank, group in plan(args, args.nnodes):
        if kind == "relay":
            job = relay(rank, group, args, auth, docs, go, out)
        else:
            target = args.relay_address if kind == "worker-via-relay" else args.master
            job = worker(rank, args, auth, docs, go, out, target)
        tasks.append(asyncio.create_task(job))
    await asyncio.sleep(0.2)  # every task is parked on go.wait()
    if args.start_at is not None:
        await asyncio.sleep(max(0.0, args.start_at - time.monotonic()))
    start = time.monotonic()
    cpu0 = time.process_time()
    go.set()
    await asyncio.gather(*tasks)
    sim_cpu_s = time.process_time() - cpu0
    errors = Counter(str(e) for e in out["join_errors"] + out["doc_errors"] + out["report_errors"])
    return {
        "start": start,
        "count": args.count,
        "join_ok": len(out["join_s"]),
        "join_s": out["join_s"],
        "doc_ok": len(out["doc_at"]),
        "doc_at": out["doc_at"],
        "verified_ok": len(out["verified_at"]),
        "verified_at": out["verified_at"],
        # One entry per distinct document content: a correct run has exactly one.
        "doc_digests": sorted({digest for _, digest in docs.seen.values()}),
        "doc_bytes": docs.body_bytes,
        "doc_wire_bytes": max(out["doc_wire_bytes"], default=0),
        "doc_members": docs.members,
        "errors": dict(errors),
        # The simulator's own CPU over the run: near the wall time means it, not the
        # master, set the pace.
        "sim_cpu_s": round(sim_cpu_s, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description="simulated rallypoint workers")
    p.add_argument("--master", required=True, help="ADDRESS:PORT of the master's peer API")
    p.add_argument("--session", required=True)
    p.add_argument("--count", type=int, required=True, help="how many ranks to play")
    p.add_argument("--first", type=int, default=1, help="the first rank to play")
    p.add_argument("--start-at", type=float, default=None, help="time.monotonic() to start at")
    p.add_argument("--address", required=True, help="the address every worker reports")
    p.add_argument("--token", default="")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--no-poll", action="store_true", help="join only")
    p.add_argument("--no-report", action="store_true", help="join and fetch the document only")
    p.add_argument("--nnodes", type=int, default=0, help="the cluster's size (for the tree)")
    p.add_argument("--relay-group", type=int, default=0, help="the fan-out tree's group size")
    p.add_argument("--real-relay", type=int, default=-1, help="the rank a real relay plays")
    p.add_argument("--relay-address", default="", help="ADDRESS:PORT of the real relay")
    p.add_argument("--real-worker", type=int, default=-1, help="the rank a real worker plays")
    args = p.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(json.dumps(asyncio.run(main_async(args))), flush=True)


if __name__ == "__main__":
    main()
