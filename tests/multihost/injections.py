"""The fault kinds of the campaign: each injects one fault and says how to heal it.

An injector picks its target with the campaign's seeded generator (the order of its draws
is part of what a seed replays), injects the fault and returns an `Injection`: the nodes
hit, the (observer, host) pairs that must name a node down, the shortest hold and the
steps that heal it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rallypoint.core import fanout
from tests.support.cluster.layout import PEER_PORT, SUBNET
from tests.support.netns import IFNAME, xtables

if TYPE_CHECKING:
    from tests.multihost.rounds import Campaign

MASTER = "main1"
#: The --long-poll of the cluster's FAST_ARGS.
LONG_POLL_S = 5.0


@dataclass
class Injection:
    """What a fault did: the nodes hit, the (observer, host) pairs that must name a node
    down, the shortest hold, and the steps that heal it (run in reverse order)."""

    hit: list[str]
    expect: list[tuple[str, str]] = field(default_factory=list)
    min_hold_s: float = 1.0
    heal: list[Callable[[], None]] = field(default_factory=list)


def inject(c: Campaign, kind: str, number: int) -> Injection:
    """Inject a fault of ``kind`` in the ``number``-th round."""
    if kind not in INJECTORS:
        raise ValueError(f"unknown fault {kind!r}")
    return INJECTORS[kind](c, number)


# --- whom a fault hits ------------------------------------------------------------------------


def workers(c: Campaign) -> list[str]:
    return [name for name in c.hosts if name != MASTER]


def relays(c: Campaign) -> list[str]:
    """Workers that relay for a non-empty group (core/fanout.py), by name."""
    size = fanout.group_size(len(c.hosts), c.options.relay_group)
    n = len(c.hosts)
    return [c.ranked[r] for r in fanout.relays(size, n) if fanout.group(r, size, n)]


def upstream_relay(c: Campaign, name: str) -> str | None:
    size = fanout.group_size(len(c.hosts), c.options.relay_group)
    relay = fanout.relay_of(c.ranked.index(name), size)
    return None if relay is None else c.ranked[relay]


def named_by_others(hosts: Sequence[str], target: str) -> list[tuple[str, str]]:
    return [(other, target) for other in hosts if other != target]


# --- what undoes a fault ----------------------------------------------------------------------


def iptables(c: Campaign, name: str, rule: Sequence[str]) -> Callable[[], None]:
    """Insert an iptables rule in a node's namespace; return what deletes it."""
    node = c.cluster[name]
    node.inside(xtables("iptables", "-I", *rule))
    return lambda: node.inside(xtables("iptables", "-D", *rule))


def drop_from(c: Campaign, name: str, source: str) -> Callable[[], None]:
    """Drop everything ``name`` receives from ``source``; return what undoes it."""
    return iptables(c, name, ["INPUT", "-s", c.cluster[source].address, "-j", "DROP"])


def restart_later(c: Campaign, name: str) -> Callable[[], None]:
    return lambda: c.watch.start(name)


def restore_hosts(c: Campaign) -> None:
    for node in c.cluster:
        node.unpin()


def readdress(c: Campaign, name: str, number: int) -> None:
    """Move a node to a free address on the bridge and tell every hosts file."""
    node = c.cluster[name]
    used = {n.address for n in c.cluster}
    last = 150 + number % 40
    while f"{SUBNET}.{last}" in used:
        last = 150 + (last - 149) % 40
    new, old = f"{SUBNET}.{last}", node.address
    # Deleting the primary address would take the new (secondary) one with it.
    node.inside(["sysctl", "-q", "-w", f"net.ipv4.conf.{IFNAME}.promote_secondaries=1"])
    node.inside(["ip", "addr", "add", f"{new}/24", "dev", IFNAME])
    node.inside(["ip", "addr", "del", f"{old}/24", "dev", IFNAME])
    node.inside(["ip", "route", "replace", "224.0.0.0/4", "dev", IFNAME])
    node.address = new
    restore_hosts(c)


# --- the fault kinds --------------------------------------------------------------------------


def _kill_one(c: Campaign, pool: list[str]) -> Injection:
    target = c.rng.choice(pool)
    c.watch.kill(target)
    return Injection([target], named_by_others(c.hosts, target), c.rng.uniform(1.0, 3.0),
                     [restart_later(c, target)])  # fmt: skip


def kill_worker(c: Campaign, _number: int) -> Injection:
    return _kill_one(c, workers(c))


def kill_master(c: Campaign, _number: int) -> Injection:
    return _kill_one(c, [MASTER])


def kill_relay(c: Campaign, _number: int) -> Injection:
    return _kill_one(c, relays(c))


def _pause(c: Campaign, target: str) -> Injection:
    c.watch.pause(target)
    hold = max(LONG_POLL_S, c.down_after_s) + 1.0
    return Injection([target], named_by_others(c.hosts, target), hold,
                     [lambda: c.watch.resume(target)])  # fmt: skip


def pause_master(c: Campaign, _number: int) -> Injection:
    return _pause(c, MASTER)


def pause_worker(c: Campaign, _number: int) -> Injection:
    return _pause(c, c.rng.choice(workers(c)))


def kill_master_mid(c: Campaign, _number: int) -> Injection:
    """Every sidecar restarted, and the master killed again within its rendezvous."""
    for name in c.hosts:
        c.watch.kill(name)
    for name in c.hosts:
        c.watch.start(name)
    time.sleep(c.rng.uniform(0.1, 1.5))
    c.watch.kill(MASTER)
    return Injection([MASTER], [], c.rng.uniform(0.5, 2.0), [restart_later(c, MASTER)])


def kill_worker_mid(c: Campaign, _number: int) -> Injection:
    """A worker restarted, and killed again within its join."""
    target = c.rng.choice(workers(c))
    c.watch.kill(target)
    c.watch.start(target)
    time.sleep(c.rng.uniform(0.1, 1.5))
    c.watch.kill(target)
    return Injection([target], [], c.rng.uniform(0.5, 2.0), [restart_later(c, target)])


def readdress_worker(c: Campaign, number: int) -> Injection:
    target = c.rng.choice(workers(c))
    c.watch.kill(target)
    readdress(c, target, number)
    return Injection([target], [], c.rng.uniform(0.5, 2.0), [restart_later(c, target)])


def isolate_one(c: Campaign, _number: int) -> Injection:
    target = c.rng.choice(c.hosts)
    node = c.cluster[target]
    node.link_down()
    expect = named_by_others(c.hosts, target)
    if target != MASTER:
        expect.append((target, MASTER))
    return Injection([target], expect, c.rng.uniform(1.0, 3.0), [node.link_up])


def halves(c: Campaign, _number: int) -> Injection:
    """The master's side and the far side, every packet between them dropped."""
    others = workers(c)
    c.rng.shuffle(others)
    cut = c.rng.randint(1, len(others) - 1) if len(others) > 1 else 1
    near, far = [MASTER, *others[: cut - 1]], others[cut - 1 :]
    heal = []
    for a in near:
        for b in far:
            heal.append(drop_from(c, a, b))
            heal.append(drop_from(c, b, a))
    expect = [(a, b) for a in near for b in far] + [(b, MASTER) for b in far]
    return Injection(far, expect, c.rng.uniform(1.0, 3.0), heal)


def oneway_loss(c: Campaign, _number: int) -> Injection:
    target = c.rng.choice(c.hosts)
    node = c.cluster[target]
    if c.rng.random() < 0.5:
        node.drop_incoming(1.0)
        return Injection([target], [], c.rng.uniform(2.0, 5.0), [node.undrop_incoming])
    peer = c.rng.choice([h for h in c.hosts if h != target])
    undo = drop_from(c, target, peer)
    return Injection([target, peer], [], c.rng.uniform(2.0, 5.0), [undo])


def drop_join_answers(c: Campaign, _number: int) -> Injection:
    """A worker restarted while the answers of the master (and its relay) never reach it."""
    target = c.rng.choice(workers(c))
    c.watch.kill(target)
    heal = []
    for source in filter(None, (MASTER, upstream_relay(c, target))):
        rule = ["INPUT", "-s", c.cluster[source].address, "-p", "tcp",
                "--sport", str(PEER_PORT), "-j", "DROP"]  # fmt: skip
        heal.append(iptables(c, target, rule))
    c.watch.start(target)
    return Injection([target], [], c.rng.uniform(2.0, 4.0), heal)


def name_vanish(c: Campaign, _number: int) -> Injection:
    target = c.rng.choice(c.hosts)
    for node in c.cluster:
        node.drop_host(target)
    c.watch.kill(target)
    c.watch.start(target)
    return Injection([target], [], c.rng.uniform(2.0, 4.0), [lambda: restore_hosts(c)])


def kill_all(c: Campaign, _number: int) -> Injection:
    for name in c.hosts:
        c.watch.kill(name)
    order = c.rng.sample(c.hosts, len(c.hosts))
    gaps = [c.rng.uniform(0.0, 0.5) for _ in order]

    def restart_all() -> None:
        for name, gap in zip(order, gaps, strict=True):
            c.watch.start(name)
            time.sleep(gap)

    return Injection(order, [], c.rng.uniform(0.5, 2.0), [restart_all])


#: Every fault kind, in the order `--faults` lists them.
INJECTORS: dict[str, Callable[[Campaign, int], Injection]] = {
    "kill_worker": kill_worker,
    "kill_master": kill_master,
    "kill_master_mid": kill_master_mid,
    "kill_worker_mid": kill_worker_mid,
    "pause_master": pause_master,
    "pause_worker": pause_worker,
    "readdress_worker": readdress_worker,
    "isolate_one": isolate_one,
    "halves": halves,
    "oneway_loss": oneway_loss,
    "drop_join_answers": drop_join_answers,
    "name_vanish": name_vanish,
    "kill_all": kill_all,
    "kill_relay": kill_relay,
}
#: Faults after which a node is dead, paused or cut off: the others must name it down.
FAULTS = tuple(INJECTORS)
