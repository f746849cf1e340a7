#!/usr/bin/env bash
# Prepare a Debian machine (root) for the container and Slurm tiers: install the
# Docker engine, Debian's docker-compose 1.29, debootstrap, the network tools (iproute2,
# iptables, ethtool, faketime for the data-path faults) and
# Slurm (slurmctld, slurmd, the client commands, munge) and Prometheus (prometheus,
# promtool), then start dockerd in the background unless an engine already answers.
# Idempotent: a second run installs nothing and leaves a running engine alone.
#
# The Slurm tier (tests/slurm) starts its own munged, with a key and socket of its
# own, and its own slurmctld and slurmd in network namespaces: it needs the
# packages only, no munge key, configuration or service here. The monitoring tier
# (tests/monitoring) likewise runs its own Prometheus, with its own configuration, storage
# and port: the packaged prometheus service is stopped and disabled here.
#
#   sudo scripts/setup-system.sh
#
# Environment:
#   DOCKERD_LOG        where dockerd writes its log (default /var/log/rallypoint-dockerd.log)
#   DOCKER_WAIT_S      how long to wait for `docker info` (default 60)
#   SKIP_APT=1         do not touch apt (packages already installed)
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/rallypoint-dockerd.log}"
DOCKER_WAIT_S="${DOCKER_WAIT_S:-60}"
PACKAGES=(docker.io docker-compose debootstrap iproute2 iptables ethtool faketime slurmctld slurmd slurm-client munge prometheus)

log() { printf 'setup-system: %s\n' "$*" >&2; }

if [[ "$(id -u)" -ne 0 ]]; then
    log "must run as root (apt-get and dockerd need it); rerun with sudo"
    exit 2
fi

# Debian's engine speaks API 1.41; a newer standalone client earlier on PATH
# negotiates down, but the packaged client is the one known to match.
docker_cli() {
    if [[ -x /usr/bin/docker ]]; then /usr/bin/docker "$@"; else docker "$@"; fi
}

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [[ ${#missing[@]} -gt 0 && "${SKIP_APT:-0}" != "1" ]]; then
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Another apt run may hold the dpkg lock for a while (unattended upgrades).
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    log "packages present: ${PACKAGES[*]}"
fi

# Debian's prometheus package enables and starts its service (port 9090, scraping this
# machine): nothing here needs it running.
if dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q "install ok installed"; then
    if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
        systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    elif [[ -x /etc/init.d/prometheus ]]; then
        /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    fi
fi

if docker_cli info >/dev/null 2>&1; then
    log "docker engine already running"
    exit 0
fi

if pgrep -x dockerd >/dev/null 2>&1; then
    log "dockerd is starting (pid $(pgrep -x dockerd | head -n1)); waiting for it"
else
    # No init system to rely on (containers, CI VMs): run it detached, with its own log.
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    log "starting dockerd (log: $DOCKERD_LOG)"
    nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
    disown || true
fi

deadline=$((SECONDS + DOCKER_WAIT_S))
until docker_cli info >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
        log "docker engine did not answer within ${DOCKER_WAIT_S}s; last lines of $DOCKERD_LOG:"
        tail -n 20 "$DOCKERD_LOG" >&2 || true
        exit 1
    fi
    sleep 1
done
log "docker engine ready: $(docker_cli version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"
