"""The after-ready room of one node, built once the spec is known: the job watch, its
progress and the keep-alives, each handed by its constructor what it reads of the others."""

from __future__ import annotations

import msgspec

from rallypoint.core import fanout, liveness
from rallypoint.core.clock import ClockEstimate
from rallypoint.rendezvous.afterready.jobwatch import JobWatch
from rallypoint.rendezvous.afterready.keepalive import Keepalive
from rallypoint.rendezvous.afterready.progresswatch import ProgressWatch
from rallypoint.rendezvous.context import NodeContext


class AfterReady(msgspec.Struct, frozen=True):
    """The job on every node, its progress, and the keep-alives that carry both (None when
    keep-alives are off: ``--keepalive 0``)."""

    jobs: JobWatch
    progress: ProgressWatch
    keepalive: Keepalive | None


def build(ctx: NodeContext, offsets: ClockEstimate, *, boot: str) -> AfterReady:
    """The room for ``ctx``'s spec; the nodes named down reach readiness's warnings."""
    spec, keepalive_s = ctx.spec, ctx.settings.keepalive_s
    size = fanout.group_size(spec.nnodes, ctx.settings.relay_group_size)
    watch = liveness.Watch(spec.hosts, spec.rank, keepalive_s) if keepalive_s > 0 else None
    readiness = ctx.readiness
    progress = ProgressWatch(
        spec,
        group_size=size,
        now=offsets.now,
        offset=lambda: offsets.offset_s,
        error=lambda: 0.0 if offsets.best is None else offsets.best.rtt_s / 2,
        attempt=lambda: jobs.book.go,  # the job watch is built next
    )
    jobs = JobWatch(
        spec,
        ctx.metrics,
        boot=boot,
        group_size=size,
        now=offsets.now,
        offset=lambda: offsets.offset_s,
        coordinated=watch is not None,
        sync_bound_s=liveness.UPSTREAM_DOWN_AFTER * keepalive_s,
        ready=lambda: readiness.ready,
        unsettled_s=(lambda: 0.0) if watch is None else watch.unsettled_s,
        progress=progress,
    )
    keepalive = None if watch is None else Keepalive(ctx, watch, jobs, progress)
    if keepalive is not None:
        readiness.warn_from(keepalive.warnings)
    return AfterReady(jobs, progress, keepalive)
