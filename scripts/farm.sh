#!/usr/bin/env bash
# farm.sh - a farm of emulated aarch64 "devices" on this machine, reachable only over SSH.
#
#   scripts/farm.sh start [N]      start (or complete) a farm of N devices (default 2)
#   scripts/farm.sh stop [--purge] remove everything start made (--purge: the download cache too)
#   scripts/farm.sh status         one line per device: name address sshd-pid reachable
#   scripts/farm.sh kill DEVICE    kill the device's sshd and all its user's processes (it "dies";
#                                  `start` brings it back)
#   scripts/farm.sh rekey DEVICE   give the device a new SSH host key (restarts its sshd)
#
# Each device farmI is:
#   - a network namespace epfarm-farmI with a veth to the bridge epfarm0 (10.77.0.1/24) in the root
#     namespace, device address 10.77.0.(10+I); these private addresses exist only on this machine;
#   - its own sshd (Debian openssh-server) listening on 10.77.0.(10+I):22 only, with its own
#     ed25519 host key, key-only auth for the user farmI (home under the state directory),
#     the farm client key as the only authorized key, SFTP through internal-sftp;
#   - an aarch64 userland: the login shell is Debian's aarch64 static busybox run through
#     qemu-user binfmt (`uname -m` says aarch64); dynamically linked aarch64 programs run too
#     (QEMU_LD_PREFIX=/usr/aarch64-linux-gnu is set in every session).
#
# With EDGEPACK_FARM_ARCH=x86_64 the devices are native instead (named farmxI, on 10.78.0.0/24, their
# own bridge, namespaces and state directory, so both farms can run at once): the same namespace, user
# and sshd, but this machine's own userland (/bin/sh, /usr/bin), so whatever runs here runs there -- an
# OpenCL driver such as PoCL included: an x86-64 "GPU device" reached over SSH.
#
# State lives in ${EDGEPACK_FARM_DIR:-/var/lib/edgepack-farm}; farm.json there describes the farm
# (devices: name, address, port, user, key_path, host_key_fingerprint ...). Needs root.
# Environment: EDGEPACK_FARM_DIR, EDGEPACK_FARM_NET (first three octets, default 10.77.0),
# EDGEPACK_FARM_ARCH (aarch64, the default, or x86_64).
set -euo pipefail

ARCH=${EDGEPACK_FARM_ARCH:-aarch64}
case "$ARCH" in
  aarch64)
    STATE=${EDGEPACK_FARM_DIR:-/var/lib/edgepack-farm}
    NET=${EDGEPACK_FARM_NET:-10.77.0}
    BRIDGE=epfarm0
    NS_PREFIX=epfarm-
    USER_PREFIX=farm
    VETH_PREFIX=epf
    ;;
  x86_64)
    STATE=${EDGEPACK_FARM_DIR:-/var/lib/edgepack-farm-x86_64}
    NET=${EDGEPACK_FARM_NET:-10.78.0}
    BRIDGE=epfarmx0
    NS_PREFIX=epfarmx-
    USER_PREFIX=farmx
    VETH_PREFIX=epx
    ;;
  *) printf 'farm: error: EDGEPACK_FARM_ARCH must be aarch64 or x86_64, not %s\n' "$ARCH" >&2; exit 2 ;;
esac
MAX_DEVICES=40
QEMU_LD_PREFIX_DIR=/usr/aarch64-linux-gnu

log() { printf 'farm: %s\n' "$*" >&2; }
die() { printf 'farm: error: %s\n' "$*" >&2; exit 1; }

usage() {
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

require_root() {
  [[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces, users and sshd need it)"
  case "$STATE" in
    /*) ;;
    *) die "EDGEPACK_FARM_DIR must be an absolute path" ;;
  esac
  [[ "$STATE" =~ ^[A-Za-z0-9/._-]+$ ]] || die "EDGEPACK_FARM_DIR may only contain letters, digits and /._-"
  [[ "$NET" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "EDGEPACK_FARM_NET must look like 10.77.0"
  # sshd (StrictModes) refuses keys and homes below group/world-writable directories such as /tmp
  local dir=$STATE
  while [[ $dir != / && -n $dir ]]; do
    dir=$(dirname "$dir")
    if [[ -d $dir ]] && [[ $(( 8#$(stat -c %a "$dir") & 8#022 )) -ne 0 ]]; then
      die "EDGEPACK_FARM_DIR=$STATE is below $dir, which others can write to; sshd refuses that: use e.g. /var/lib/edgepack-farm"
    fi
  done
}

# ---------------------------------------------------------------------------------------------
# prerequisites

apt_install() {
  log "installing $*"
  local guard=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    # never let a package start a system-wide sshd listening on all addresses
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    guard=1
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends "$@" >&2 || rc=$?
  if [[ $rc -ne 0 ]]; then
    DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update -q >&2 || true
    rc=0
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends "$@" >&2 || rc=$?
  fi
  [[ $guard -eq 1 ]] && rm -f /usr/sbin/policy-rc.d
  [[ $rc -eq 0 ]] || die "apt-get install $* failed"
}

ensure_packages() {
  local missing=()
  command -v ip >/dev/null || missing+=(iproute2)
  [[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
  command -v ssh-keygen >/dev/null || missing+=(openssh-client)
  command -v update-binfmts >/dev/null || missing+=(binfmt-support)
  [[ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P || -x /usr/bin/qemu-aarch64-static ]] || missing+=(qemu-user-static)
  [[ -e $QEMU_LD_PREFIX_DIR/lib/ld-linux-aarch64.so.1 ]] || missing+=(libc6-arm64-cross)
  [[ -e $QEMU_LD_PREFIX_DIR/lib/libstdc++.so.6 ]] || missing+=(libstdc++6-arm64-cross)
  command -v dpkg-deb >/dev/null || missing+=(dpkg)
  command -v flock >/dev/null || missing+=(util-linux)
  if [[ ${#missing[@]} -gt 0 ]]; then
    apt_install "${missing[@]}"
  fi
  ip netns list >/dev/null 2>&1 || die "'ip netns' is not available here (needs iproute2 and CAP_SYS_ADMIN)"
}

ensure_binfmt() {
  if [[ ! -e /proc/sys/fs/binfmt_misc/status ]]; then
    log "mounting binfmt_misc"
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || die "cannot mount binfmt_misc"
  fi
  if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] || ! grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64; then
    log "enabling qemu-aarch64 binfmt"
    update-binfmts --enable qemu-aarch64 >&2 || die "update-binfmts --enable qemu-aarch64 failed (is qemu-user-static installed?)"
  fi
}

# Debian's aarch64 static busybox, fetched from the Debian mirror with a private apt state:
# the system's dpkg architectures and package lists are not touched.
ensure_busybox() {
  [[ $ARCH == aarch64 ]] || return 0
  local cache=$STATE/cache
  if [[ -x $cache/busybox ]]; then return; fi
  log "downloading busybox-static:arm64 from the Debian mirror"
  local tmp
  tmp=$(mktemp -d "$STATE/.apt.XXXXXX")
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/dl" "$cache"
  local opts=(-o APT::Architecture=arm64 -o APT::Architectures=arm64 -o "Dir::State::Lists=$tmp/lists"
              -o "Dir::Cache=$tmp/cache" -o Dir::State::status=/dev/null -o APT::Sandbox::User=root -q)
  if ! timeout 600 apt-get "${opts[@]}" update >&2; then
    rm -rf "$tmp"; die "apt-get update (arm64 lists) failed: is the Debian mirror reachable?"
  fi
  if ! (cd "$tmp/dl" && timeout 600 apt-get "${opts[@]}" download busybox-static >&2); then
    rm -rf "$tmp"; die "apt-get download busybox-static:arm64 failed"
  fi
  dpkg-deb -x "$tmp"/dl/busybox-static_*_arm64.deb "$tmp/root"
  install -m 755 "$tmp/root/bin/busybox" "$cache/busybox.new"
  mv "$cache/busybox.new" "$cache/busybox"
  rm -rf "$tmp"
}

# $STATE/rootfs/bin: busybox and one link per applet; the devices' login shell and PATH.
# Native (x86_64) devices use this machine's own shell and PATH instead.
login_shell() { if [[ $ARCH == aarch64 ]]; then echo "$STATE/rootfs/bin/sh"; else echo /bin/sh; fi; }
device_path() { if [[ $ARCH == aarch64 ]]; then echo "$STATE/rootfs/bin"; else echo /usr/local/bin:/usr/bin:/bin; fi; }

ensure_rootfs() {
  [[ $ARCH == aarch64 ]] || return 0
  local bin=$STATE/rootfs/bin
  if [[ -x $bin/sh ]] && [[ $("$bin/sh" -c 'uname -m' 2>/dev/null) == aarch64 ]]; then return; fi
  rm -rf "$STATE/rootfs"
  mkdir -p "$bin"
  install -m 755 "$STATE/cache/busybox" "$bin/busybox"
  local applet
  for applet in $("$bin/busybox" --list); do
    [[ $applet == busybox ]] && continue
    ln -sf busybox "$bin/$applet"
  done
  chmod -R go-w "$STATE/rootfs"
  [[ $("$bin/sh" -c 'uname -m') == aarch64 ]] || die "the aarch64 busybox does not run: is qemu-aarch64 binfmt enabled?"
}

ensure_client_key() {
  if [[ ! -f $STATE/client_key ]]; then
    ssh-keygen -q -t ed25519 -N '' -C "edgepack-farm-client" -f "$STATE/client_key" >/dev/null
  fi
  chmod 600 "$STATE/client_key"
}

# ---------------------------------------------------------------------------------------------
# devices

dev_index() { # farmI -> I
  local name=$1
  [[ $name =~ ^${USER_PREFIX}([0-9]+)$ ]] || die "unknown device '$name' (devices are named ${USER_PREFIX}0, ${USER_PREFIX}1 ...)"
  echo "${BASH_REMATCH[1]}"
}
dev_addr() { echo "$NET.$((10 + $1))"; }
dev_ns() { echo "${NS_PREFIX}${USER_PREFIX}$1"; }
dev_dir() { echo "$STATE/devices/${USER_PREFIX}$1"; }

sshd_pid() { # pid of the device's listening sshd, or nothing
  local pidfile
  pidfile="$(dev_dir "$1")/sshd.pid"
  [[ -f $pidfile ]] || return 0
  local pid
  pid=$(cat "$pidfile" 2>/dev/null || true)
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "sshd.*$(dev_dir "$1")/sshd_config"; then
    echo "$pid"
  fi
}

reachable() { # SSH banner within 3 s
  local addr=$1
  timeout 3 bash -c "exec 3<>/dev/tcp/$addr/22 && head -c 4 <&3" 2>/dev/null | grep -q '^SSH-'
}

ensure_bridge() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    if ip -4 addr show | grep -q "inet $NET\."; then
      die "addresses in $NET.0/24 are already in use on this machine: set EDGEPACK_FARM_NET"
    fi
    ip link add "$BRIDGE" type bridge
  fi
  if ! ip -4 addr show dev "$BRIDGE" | grep -q "inet $NET.1/24"; then
    ip addr add "$NET.1/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
}

ensure_user() {
  local i=$1 dir user
  dir=$(dev_dir "$i")
  user=${USER_PREFIX}$i
  if id -u "$user" >/dev/null 2>&1; then
    [[ -f $dir/user-created ]] || die "user $user exists but was not made by farm.sh; remove it or use another machine"
    usermod -d "$dir/home" -s "$(login_shell)" "$user" >/dev/null
  else
    useradd --system --user-group --no-create-home -d "$dir/home" -s "$(login_shell)" \
      -c "edgepack farm device $i" "$user"
    touch "$dir/user-created"
  fi
  usermod -p '*' "$user" # not locked (sshd refuses locked accounts), but no password either
  mkdir -p "$dir/home/tmp"
  chown -R "$user:$user" "$dir/home"
  chmod 700 "$dir/home"
}

write_sshd_config() {
  local i=$1 dir addr
  dir=$(dev_dir "$i")
  addr=$(dev_addr "$i")
  cat > "$dir/sshd_config" <<EOF
# edgepack farm device ${USER_PREFIX}$i (generated by scripts/farm.sh)
ListenAddress $addr:22
HostKey $dir/ssh_host_ed25519_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
AllowUsers ${USER_PREFIX}$i
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
PermitEmptyPasswords no
UsePAM no
StrictModes yes
AllowTcpForwarding local
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
GatewayPorts no
PrintMotd no
PrintLastLog no
ClientAliveInterval 15
ClientAliveCountMax 4
LoginGraceTime 30
Subsystem sftp internal-sftp
SetEnv QEMU_LD_PREFIX=$QEMU_LD_PREFIX_DIR PATH=$(device_path) TMPDIR=$dir/home/tmp EDGEPACK_FARM_DEVICE=${USER_PREFIX}$i
EOF
}

ensure_netns() {
  local i=$1 ns addr hostveth devveth
  ns=$(dev_ns "$i")
  addr=$(dev_addr "$i")
  hostveth="${VETH_PREFIX}${i}h"
  devveth="${VETH_PREFIX}${i}d"
  if ip netns list | grep -qw "^$ns" && ip link show "$hostveth" >/dev/null 2>&1 \
     && ip netns exec "$ns" ip -4 addr show dev eth0 2>/dev/null | grep -q "inet $addr/"; then
    return
  fi
  # partial leftovers: rebuild from scratch
  ip link del "$hostveth" >/dev/null 2>&1 || true
  ip netns del "$ns" >/dev/null 2>&1 || true
  ip netns add "$ns"
  ip netns exec "$ns" ip link set lo up
  ip link add "$hostveth" type veth peer name "$devveth"
  ip link set "$devveth" netns "$ns"
  ip netns exec "$ns" ip link set "$devveth" name eth0
  ip netns exec "$ns" ip addr add "$addr/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  ip link set "$hostveth" master "$BRIDGE"
  ip link set "$hostveth" up
}

start_sshd() {
  local i=$1 dir ns addr
  dir=$(dev_dir "$i")
  ns=$(dev_ns "$i")
  addr=$(dev_addr "$i")
  if [[ -n $(sshd_pid "$i") ]]; then return; fi
  rm -f "$dir/sshd.pid"
  if [[ ! -d /run/sshd ]]; then
    mkdir -p /run/sshd && chmod 755 /run/sshd
    touch "$STATE/created-run-sshd"
  fi
  /usr/sbin/sshd -t -f "$dir/sshd_config" || die "sshd rejects $dir/sshd_config"
  # own UTS namespace too, so that `hostname` on the device says its name
  ip netns exec "$ns" unshare --uts /bin/sh -c \
    "hostname ${USER_PREFIX}$i && exec /usr/sbin/sshd -f '$dir/sshd_config' -E '$dir/sshd.log'"
    for _ in $(seq 1 100); do
    if [[ -n $(sshd_pid "$i") ]] && reachable "$addr"; then return; fi
    sleep 0.1
  done
  die "sshd of ${USER_PREFIX}$i did not come up on $addr:22 (see $dir/sshd.log)"
}

ensure_device() {
  local i=$1 dir
  dir=$(dev_dir "$i")
  mkdir -p "$dir"
  chmod 755 "$dir"
  ensure_user "$i"
  if [[ ! -f $dir/ssh_host_ed25519_key ]]; then
    ssh-keygen -q -t ed25519 -N '' -C "${USER_PREFIX}$i" -f "$dir/ssh_host_ed25519_key" >/dev/null
  fi
  chmod 600 "$dir/ssh_host_ed25519_key"
  install -m 644 "$STATE/client_key.pub" "$dir/authorized_keys"
  write_sshd_config "$i"
  ensure_netns "$i"
  start_sshd "$i"
}

kill_user_processes() {
  local user=$1
  id -u "$user" >/dev/null 2>&1 || return 0
  for _ in $(seq 1 50); do
    pkill -KILL -u "$user" 2>/dev/null || true
    pgrep -u "$user" >/dev/null 2>&1 || return 0
    sleep 0.1
  done
  log "warning: processes of $user survive: $(pgrep -u "$user" | tr '\n' ' ')"
}

kill_device() {
  local i=$1 pid
  pid=$(sshd_pid "$i")
  if [[ -n $pid ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
  kill_user_processes "${USER_PREFIX}$i"
  # whatever else still runs inside the device's namespace (sshd session processes)
  local ns
  ns=$(dev_ns "$i")
  if ip netns list | grep -qw "^$ns"; then
    local p
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  fi
  rm -f "$(dev_dir "$i")/sshd.pid"
}

remove_device() {
  local i=$1 dir user
  dir=$(dev_dir "$i")
  user=${USER_PREFIX}$i
  kill_device "$i"
  ip link del "${VETH_PREFIX}${i}h" >/dev/null 2>&1 || true
  ip netns del "$(dev_ns "$i")" >/dev/null 2>&1 || true
  if [[ -f $dir/user-created ]] && id -u "$user" >/dev/null 2>&1; then
    userdel "$user" >/dev/null 2>&1 || log "warning: userdel $user failed"
    if getent group "$user" >/dev/null 2>&1; then groupdel "$user" >/dev/null 2>&1 || true; fi
  fi
  rm -rf "$dir"
}

existing_indices() {
  local d
  [[ -d $STATE/devices ]] || return 0
  for d in "$STATE"/devices/"${USER_PREFIX}"*; do
    [[ -d $d ]] || continue
    local n=${d##*/"${USER_PREFIX}"}
    [[ $n =~ ^[0-9]+$ ]] && echo "$n"
  done | sort -n
}

json_escape() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g'; }

write_farm_json() {
  local tmp=$STATE/.farm.json.tmp first=1 i
  local kh=$STATE/known_hosts.tmp
  : > "$kh"
  {
    printf '{\n'
    printf '  "state_dir": "%s",\n' "$(json_escape "$STATE")"
    printf '  "client_key": "%s",\n' "$STATE/client_key"
    printf '  "client_public_key": "%s",\n' "$(json_escape "$(cat "$STATE/client_key.pub")")"
    printf '  "known_hosts": "%s",\n' "$STATE/known_hosts"
    printf '  "bridge": "%s",\n' "$BRIDGE"
    printf '  "bridge_address": "%s",\n' "$NET.1"
    printf '  "devices": ['
    for i in $(existing_indices); do
      local dir addr pub ktype kb64 fp pid
      dir=$(dev_dir "$i")
      addr=$(dev_addr "$i")
      pub=$(cat "$dir/ssh_host_ed25519_key.pub")
      ktype=$(awk '{print $1}' <<< "$pub")
      kb64=$(awk '{print $2}' <<< "$pub")
      fp=$(ssh-keygen -l -E sha256 -f "$dir/ssh_host_ed25519_key.pub" | awk '{print $2}')
      pid=$(sshd_pid "$i")
      printf '%s %s\n' "$addr" "$ktype $kb64" >> "$kh"
      [[ $first -eq 1 ]] || printf ','
      first=0
      printf '\n    {"name": "%s", "address": "%s", "port": 22, "user": "%s", "key_path": "%s",\n' \
        "${USER_PREFIX}$i" "$addr" "${USER_PREFIX}$i" "$STATE/client_key"
      printf '     "host_key_type": "%s", "host_key": "%s", "host_key_fingerprint": "%s",\n' "$ktype" "$kb64" "$fp"
      printf '     "netns": "%s", "home": "%s", "sshd_pid": %s, "arch": "%s"}' \
        "$(dev_ns "$i")" "$dir/home" "${pid:-null}" "$ARCH"
    done
    printf '\n  ]\n}\n'
  } > "$tmp"
  mv "$tmp" "$STATE/farm.json"
  mv "$kh" "$STATE/known_hosts"
}

# ---------------------------------------------------------------------------------------------
# commands

with_lock() {
  mkdir -p "$STATE"
  chmod 755 "$STATE"
  exec 9> "$STATE/.lock"
  flock -w 300 9 || die "another farm.sh is running (lock $STATE/.lock)"
}

cmd_start() {
  local n=${1:-2}
  if ! [[ $n =~ ^[0-9]+$ ]] || [[ $n -lt 1 ]] || [[ $n -gt $MAX_DEVICES ]]; then die "N must be 1..$MAX_DEVICES"; fi
  require_root
  ensure_packages
  with_lock
  if [[ $ARCH == aarch64 ]]; then ensure_binfmt; fi
  ensure_busybox
  ensure_rootfs
  ensure_client_key
  ensure_bridge
  local i
  for i in $(existing_indices); do
    if [[ $i -ge $n ]]; then remove_device "$i"; fi
  done
  for ((i = 0; i < n; i++)); do ensure_device "$i"; done
  write_farm_json
  cmd_status_unlocked
  echo "client key: $STATE/client_key"
  echo "farm description: $STATE/farm.json"
}

cmd_stop() {
  local purge=0
  [[ ${1:-} == --purge ]] && purge=1
  require_root
  if [[ ! -d $STATE ]]; then echo "farm: nothing to stop ($STATE does not exist)"; return 0; fi
  with_lock
  local i
  for i in $(existing_indices); do remove_device "$i"; done
  # devices whose state directory vanished but whose namespace is still there
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${NS_PREFIX}${USER_PREFIX}[0-9]*$" || true); do
    i=${ns#"${NS_PREFIX}${USER_PREFIX}"}
    remove_device "$i"
  done
  ip link del "$BRIDGE" >/dev/null 2>&1 || true
  if [[ -f $STATE/created-run-sshd ]]; then
    if ! pgrep -x sshd >/dev/null 2>&1; then rmdir /run/sshd 2>/dev/null || true; fi
  fi
  rm -rf "$STATE/devices" "$STATE/rootfs" "$STATE/farm.json" "$STATE/known_hosts" "$STATE/client_key" \
    "$STATE/client_key.pub" "$STATE/created-run-sshd" "$STATE"/.apt.* "$STATE"/.farm.json.tmp "$STATE"/known_hosts.tmp
  if [[ $purge -eq 1 ]]; then rm -rf "$STATE/cache"; fi
  exec 9>&-
  rm -f "$STATE/.lock"
  rmdir "$STATE" 2>/dev/null || true
  echo "farm stopped"
}

cmd_status_unlocked() {
  local i any=0 bad=0
  for i in $(existing_indices); do
    any=1
    local addr pid ok
    addr=$(dev_addr "$i")
    pid=$(sshd_pid "$i")
    if [[ -n $pid ]] && reachable "$addr"; then ok=yes; else ok=no; bad=1; fi
    printf '%-8s %-15s sshd=%-8s reachable=%s\n' "${USER_PREFIX}$i" "$addr" "${pid:--}" "$ok"
  done
  if [[ $any -eq 0 ]]; then echo "farm: not running (no devices in $STATE)"; return 1; fi
  return $bad
}

cmd_status() {
  require_root
  cmd_status_unlocked
}

cmd_kill() {
  [[ $# -eq 1 ]] || die "usage: farm.sh kill DEVICE"
  require_root
  local i
  i=$(dev_index "$1")
  [[ -d $(dev_dir "$i") ]] || die "no device $1 in this farm"
  with_lock
  kill_device "$i"
  write_farm_json
  echo "$1 killed (scripts/farm.sh start brings it back)"
}

cmd_rekey() {
  [[ $# -eq 1 ]] || die "usage: farm.sh rekey DEVICE"
  require_root
  local i dir pid
  i=$(dev_index "$1")
  dir=$(dev_dir "$i")
  [[ -d $dir ]] || die "no device $1 in this farm"
  with_lock
  pid=$(sshd_pid "$i")
  if [[ -n $pid ]]; then kill -TERM "$pid" 2>/dev/null || true; fi
    for _ in $(seq 1 50); do
    [[ -z $(sshd_pid "$i") ]] && break
    sleep 0.1
  done
  pid=$(sshd_pid "$i")
  if [[ -n $pid ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$dir/ssh_host_ed25519_key" "$dir/ssh_host_ed25519_key.pub" "$dir/sshd.pid"
  ssh-keygen -q -t ed25519 -N '' -C "${USER_PREFIX}$i" -f "$dir/ssh_host_ed25519_key" >/dev/null
  chmod 600 "$dir/ssh_host_ed25519_key"
  start_sshd "$i"
  write_farm_json
  echo "$1 has a new host key: $(ssh-keygen -l -E sha256 -f "$dir/ssh_host_ed25519_key.pub" | awk '{print $2}')"
}

main() {
  local cmd=${1:-}
  [[ $# -gt 0 ]] && shift
  case "$cmd" in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    kill) cmd_kill "$@" ;;
    rekey) cmd_rekey "$@" ;;
    -h|--help|help) usage 0 ;;
    *) usage 2 ;;
  esac
}

main "$@"
