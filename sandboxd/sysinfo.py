# -*- test-case-name: tests.test_sysinfo -*-
"""
Facts about the machine as the sandbox sees it (SPEC §7.6).

sandboxd runs inside containers, where ``/proc/meminfo`` and the CPU count
describe the host, not the sandbox: a container limited to 512 MiB on a
64 GiB host would report 64 GiB.  This module reads the container's cgroup
(v2, else v1) limits and says which source each answer comes from.

What comes from where, and why:

- host memory: psutil's ``virtual_memory`` (it computes "available" the way
  the kernel does, with a fallback for kernels lacking ``MemAvailable``);
- container memory and CPU quota: the cgroup files, by hand, because psutil
  does not read cgroups;
- CPUs usable: ``os.sched_getaffinity`` (honours cpusets), capped by the
  CPU quota;
- disk: psutil's ``disk_usage`` (``statvfs``, with ``used``/``percent`` as
  ``df`` reports them, root-reserved blocks counted);
- listening sockets: from the kernel through ``sock_diag`` netlink
  (:mod:`sandboxd.sockdiag`), else ``/proc/net/tcp{,6}`` by hand (the
  source SPEC §7.6 names; reading them walks every connection's bucket);
  owners are found by scanning ``/proc/*/fd`` for only the listening
  inodes and stopping once all are found, which costs far less than
  psutil's ``net_connections`` building every connection of every process.

Every reader takes a ``root`` so tests can point it at a fake tree.
"""

from __future__ import annotations

import math
import os
import re
import socket
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from sandboxd import sockdiag
from sandboxd.libc import libc

#: The real ``/proc``: what the kernel is asked directly instead of read
#: from (a fake tree in a test is always read).
PROC = "/proc"

# psutil is imported by the two functions that use it, on the first
# /system/info or /system/metrics: the daemon does not pay for it at start.

#: ``st`` value of a listening socket in /proc/net/tcp.
TCP_LISTEN = "0A"

MIB = 1024 * 1024
GIB = 1024 * MIB


@attrs.frozen
class Memory:
    """
    Memory as the sandbox can use it, in bytes.

    :ivar source: ``cgroup`` when a container limit below the host's memory
        bounds the sandbox, else ``host``.
    """

    total: int
    available: int
    used: int
    source: str

    @property
    def percent(self) -> float:
        """Used over total, in percent, one decimal."""
        return round(self.used * 100.0 / self.total, 1) if self.total else 0.0


@attrs.frozen
class Cpu:
    """
    CPUs the sandbox can use.

    :ivar count: whole CPUs: the affinity mask, capped by the quota rounded
        up (a 1.5-CPU quota can keep two CPUs busy half the time).
    :ivar limit: the cgroup quota in CPUs (``1.5``), or None.
    :ivar source: ``cgroup`` (the quota decides), ``affinity`` (a cpuset
        narrower than the host decides) or ``host``.
    """

    count: int
    limit: float | None
    source: str


@attrs.frozen
class Disk:
    """Usage of the file system holding a path, in bytes."""

    total: int
    used: int
    free: int
    percent: float


@attrs.frozen
class Listening:
    """One listening TCP socket."""

    port: int
    protocol: str
    address: str
    pid: int | None

    def as_json(self) -> dict[str, Any]:
        """The ``/ports`` entry."""
        return {
            "port": self.port,
            "protocol": self.protocol,
            "address": self.address,
            "pid": self.pid,
        }


# --- cgroups ---------------------------------------------------------------


def _read(path: str) -> str | None:
    """
    A /proc or /sys file's text as the kernel wrote it: no newline
    translation (a CR in a mount point's name is not a line end), and bytes
    that are not UTF-8 kept (as surrogates) so a path read here opens the
    directory it names.
    """
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
            return f.read()
    except OSError:
        return None


def _lines(text: str) -> list[str]:
    """
    The kernel's lines, ended by LF only: ``str.splitlines`` also ends one at
    NEL, U+2028, U+2029, FF, VT and the separators 0x1c-0x1e, any of which a
    mount point's or a cgroup's name may hold.
    """
    return text.split("\n")


#: mountinfo's escapes: space, tab, newline and backslash as ``\ooo``.
_MOUNT_ESCAPE = re.compile(r"\\([0-7]{3})")


def _mount_field(field: str) -> str:
    """A mountinfo path with its octal escapes undone."""
    return _MOUNT_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def _read_int(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return None


def _stat_value(path: str, key: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    for line in _lines(text):
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return None
    return None


@attrs.frozen
class Cgroup:
    """
    The directories of this process's cgroup, per hierarchy.

    :ivar v2: the cgroup v2 directory and its mount point, or None.
    :ivar v1: controller name -> (directory, mount point).
    """

    v2: tuple[str, str] | None
    v1: dict[str, tuple[str, str]]

    @classmethod
    def find(cls, root: str = "/") -> Cgroup:
        """
        Locate this process's cgroup directories from ``/proc/self/cgroup``
        and ``/proc/self/mountinfo`` (so a cgroup namespace, or a host path
        mounted as the container's root, both resolve).
        """
        own = _read(os.path.join(root, "proc/self/cgroup")) or ""
        mounts = _read(os.path.join(root, "proc/self/mountinfo")) or ""
        paths_v2: str | None = None
        paths_v1: dict[str, str] = {}
        for line in _lines(own):
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            _, controllers, path = parts
            if controllers == "":
                paths_v2 = path
            else:
                for controller in controllers.split(","):
                    paths_v1[controller] = path
        v2: tuple[str, str] | None = None
        v1: dict[str, tuple[str, str]] = {}
        for line in _lines(mounts):
            # Fields are split at a space only: str.split() would also split
            # at NEL, U+2028, NBSP and others a mount point may hold (the
            # kernel escapes only space, tab, newline and backslash).
            fields = line.split(" ")
            if " - " not in line or len(fields) < 5:
                continue
            tail = line.split(" - ", 1)[1].split(" ")
            if len(tail) < 3:
                continue
            fstype, super_options = tail[0], tail[2].split(",")
            mount_root, mount_point = (
                _mount_field(fields[3]),
                os.path.join(root, _mount_field(fields[4]).lstrip("/")),
            )
            if fstype == "cgroup2" and paths_v2 is not None and v2 is None:
                v2 = (_cgroup_dir(mount_root, mount_point, paths_v2), mount_point)
            elif fstype == "cgroup":
                for controller in super_options:
                    if controller in paths_v1 and controller not in v1:
                        directory = _cgroup_dir(
                            mount_root, mount_point, paths_v1[controller]
                        )
                        v1[controller] = (directory, mount_point)
        return cls(v2, v1)

    def memory_limit(self) -> int | None:
        """The tightest memory limit on the way up the tree, or None."""
        if self.v2 is not None:
            found = _tightest(_ancestors(*self.v2), "memory.max")
            if found is not None or os.path.exists(
                os.path.join(self.v2[0], "memory.max")
            ):
                return found
        if "memory" in self.v1:
            return _tightest(_ancestors(*self.v1["memory"]), "memory.limit_in_bytes")
        return None

    def memory_used(self) -> int | None:
        """
        The cgroup's working set: usage minus inactive file cache, as
        kubelet and ``docker stats`` count it (cache the kernel can drop is
        not memory the sandbox has lost).
        """
        if self.v2 is not None:
            directory = self.v2[0]
            current = _read_int(os.path.join(directory, "memory.current"))
            if current is not None:
                inactive = _stat_value(
                    os.path.join(directory, "memory.stat"), "inactive_file"
                )
                return max(0, current - (inactive or 0))
        if "memory" in self.v1:
            directory = self.v1["memory"][0]
            usage = _read_int(os.path.join(directory, "memory.usage_in_bytes"))
            if usage is not None:
                stat = os.path.join(directory, "memory.stat")
                inactive = _stat_value(stat, "total_inactive_file")
                return max(0, usage - (inactive or 0))
        return None

    def cpu_limit(self) -> float | None:
        """The tightest CPU quota (in CPUs) on the way up the tree, or None."""
        best: float | None = None
        if self.v2 is not None:
            for directory in _ancestors(*self.v2):
                text = _read(os.path.join(directory, "cpu.max"))
                if text is None:
                    continue
                quota, _, period = text.strip().partition(" ")
                best = _min_quota(best, quota, period or "100000")
            if best is not None:
                return best
        if "cpu" in self.v1:
            for directory in _ancestors(*self.v1["cpu"]):
                quota_us = _read(os.path.join(directory, "cpu.cfs_quota_us"))
                period_us = _read(os.path.join(directory, "cpu.cfs_period_us"))
                if quota_us is not None and period_us is not None:
                    best = _min_quota(best, quota_us.strip(), period_us.strip())
        return best


def _cgroup_dir(mount_root: str, mount_point: str, path: str) -> str:
    """
    The directory of ``path`` under a mount of ``mount_root``.

    Without a cgroup namespace a container sees its host path
    (``/docker/ID``) while the mount's root is that same path; with one, or
    when the host mounts the whole tree, the path is below the mount.  When
    the computed directory is missing, the mount point itself is the best
    guess (it is the container's own cgroup in most runtimes).
    """
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root) :]
    directory = os.path.normpath(os.path.join(mount_point, path.lstrip("/")))
    if not directory.startswith(mount_point) or not os.path.isdir(directory):
        return mount_point
    return directory


def _ancestors(directory: str, mount_point: str) -> list[str]:
    """``directory`` and its parents up to the mount point, innermost first."""
    out = [directory]
    while directory != mount_point and directory.startswith(mount_point):
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
        out.append(directory)
    return out


def _tightest(directories: Iterable[str], name: str) -> int | None:
    best: int | None = None
    for directory in directories:
        text = _read(os.path.join(directory, name))
        if text is None:
            continue
        text = text.strip()
        if text == "max":
            continue
        try:
            value = int(text)
        except ValueError:
            continue
        # cgroup v1 writes "no limit" as a page-rounded LONG_MAX.
        if value <= 0 or value >= 2**62:
            continue
        best = value if best is None else min(best, value)
    return best


def _min_quota(best: float | None, quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return best
    if q <= 0 or p <= 0:
        return best
    value = q / p
    return value if best is None else min(best, value)


# --- memory, CPU, disk -------------------------------------------------------


def memory(
    cgroup: Cgroup | None = None,
    host_total: int | None = None,
    host_available: int | None = None,
) -> Memory:
    """
    Memory as the sandbox sees it: the cgroup limit when there is one below
    the host's memory, else the host's.

    :param host_total: the host's memory (psutil's when None).
    :param host_available: the host's available memory (psutil's when None).
    """
    if host_total is None or host_available is None:
        import psutil  # type: ignore[import-untyped]

        vm = psutil.virtual_memory()
        host_total, host_available = int(vm.total), int(vm.available)
    group = cgroup if cgroup is not None else Cgroup.find()
    limit = group.memory_limit()
    if limit is not None and limit < host_total:
        used = group.memory_used()
        if used is None:
            used = max(0, host_total - host_available)
        used = min(used, limit)
        # The host can run short before the container reaches its limit.
        available = max(0, min(limit - used, host_available))
        return Memory(total=limit, available=available, used=used, source="cgroup")
    used = max(0, host_total - host_available)
    return Memory(total=host_total, available=host_available, used=used, source="host")


def cpu(
    cgroup: Cgroup | None = None, affinity: int | None = None, host: int | None = None
) -> Cpu:
    """
    The CPUs the sandbox can use: the affinity mask (cpusets), capped by the
    cgroup quota rounded up.

    :param affinity: CPUs this process may run on (``sched_getaffinity``
        when None); :param host: the host's CPUs (``os.cpu_count``).
    """
    host_count = host if host is not None else (os.cpu_count() or 1)
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = host_count
    group = cgroup if cgroup is not None else Cgroup.find()
    limit = group.cpu_limit()
    if limit is not None and math.ceil(limit) < affinity:
        return Cpu(count=max(1, math.ceil(limit)), limit=limit, source="cgroup")
    source = "affinity" if affinity < host_count else "host"
    return Cpu(count=affinity, limit=limit, source=source)


def disk(path: str) -> Disk:
    """Usage of the file system holding ``path``, as ``df`` shows it."""
    import psutil

    usage = psutil.disk_usage(path)
    return Disk(
        total=int(usage.total),
        used=int(usage.used),
        free=int(usage.free),
        percent=float(usage.percent),
    )


# --- listening sockets -------------------------------------------------------


def decode_address(hex_address: str) -> str:
    """
    An address of /proc/net/tcp{,6}: 32-bit words in the kernel's byte
    order (``0100007F`` is 127.0.0.1 on a little-endian host).
    """
    words = [int(hex_address[i : i + 8], 16) for i in range(0, len(hex_address), 8)]
    raw = struct.pack(f"={len(words)}I", *words)
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw)


def parse_proc_net_tcp(text: str, protocol: str) -> list[tuple[str, int, int]]:
    """
    The listening sockets of one /proc/net/tcp{,6} file.

    :returns: ``(address, port, inode)`` for each line in state ``0A``.
    """
    out = []
    for line in _lines(text)[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        address, _, port = fields[1].partition(":")
        try:
            out.append((decode_address(address), int(port, 16), int(fields[9])))
        except (ValueError, OSError, struct.error):
            continue
    return out


def _fd_targets(fd_dir: str) -> list[str]:
    """
    What a process's descriptors point at.

    :raises PermissionError: the kernel keeps them from us (another user's
        process, to a root without ``CAP_SYS_PTRACE``).
    :raises OSError: the process is gone.
    """
    targets = []
    for fd in os.listdir(fd_dir):
        try:
            targets.append(os.readlink(os.path.join(fd_dir, fd)))
        except PermissionError:
            raise
        except OSError:
            continue
    return targets


@contextmanager
def _as_owner(path: str) -> Iterator[bool]:
    """
    This thread's file-system identity that of ``path``'s owner for the
    block, then its own again; whether it switched.

    A container's root usually runs without ``CAP_SYS_PTRACE`` (Docker's
    default), and then may not read the descriptors of the children it
    runs as the sandbox's user; the kernel checks those against the
    caller's file-system uid and gid, which ``setfsuid``/``setfsgid``
    change for the calling thread alone.
    """
    c = libc()
    setfsuid = getattr(c, "setfsuid", None)
    setfsgid = getattr(c, "setfsgid", None)
    if setfsuid is None or setfsgid is None or os.geteuid() != 0:
        yield False
        return
    try:
        st = os.stat(path)
    except OSError:
        yield False
        return
    old_gid = setfsgid(st.st_gid)
    old_uid = setfsuid(st.st_uid)
    try:
        yield True
    finally:
        setfsuid(old_uid)
        setfsgid(old_gid)


def fd_targets(proc: str, pid: int) -> list[str]:
    """
    What process ``pid``'s descriptors point at, read as its owner when
    the daemon may not read them as itself; empty when it is gone or
    they stay out of reach.
    """
    fd_dir = os.path.join(proc, str(pid), "fd")
    try:
        return _fd_targets(fd_dir)
    except PermissionError:
        pass
    except OSError:
        return []
    with _as_owner(os.path.join(proc, str(pid))) as switched:
        if not switched:
            return []
        try:
            return _fd_targets(fd_dir)
        except OSError:
            return []


def socket_owners(inodes: set[int], proc: str = PROC) -> dict[int, int]:
    """
    Which process holds each socket inode, from ``/proc/PID/fd`` links.

    Processes whose fds stay out of reach (:func:`fd_targets`) are skipped
    (their sockets stay ownerless); pids are visited in ascending order so a socket shared by
    a pre-forking server is credited to its parent.  The walk stops as soon
    as every inode is found.
    """
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    found: dict[int, int] = {}
    try:
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    except OSError:
        return found
    for pid in pids:
        if len(found) == len(wanted):
            break
        for target in fd_targets(proc, pid):
            inode = wanted.get(target)
            if inode is not None and inode not in found:
                found[inode] = pid
    return found


def ports_of(pid: int, proc: str = PROC) -> frozenset[int]:
    """
    The TCP ports process ``pid`` itself listens on (in its own network
    namespace): its socket fds matched against its ``net/tcp{,6}``.  One
    process's fds, not a walk of every pid: cheap enough for the reactor's
    turn.  Empty when the process is gone or unreadable.
    """
    inodes = {
        int(target[8:-1])
        for target in fd_targets(proc, pid)
        if target.startswith("socket:[")
    }
    if proc == PROC and sockdiag.same_namespace(pid, proc):
        found = sockdiag.listening()
        if found is not None:
            return frozenset(port for _, _, port, inode in found if inode in inodes)
    ports = set()
    for protocol, name in (("tcp", "net/tcp"), ("tcp6", "net/tcp6")):
        text = _read(os.path.join(proc, str(pid), name))
        for _address, port, inode in parse_proc_net_tcp(text or "", protocol):
            if inode in inodes:
                ports.add(port)
    return frozenset(ports)


def listening_sockets(proc: str = PROC) -> list[tuple[str, str, int, int]]:
    """
    (protocol, address, port, inode) of every listening TCP socket: from
    the kernel through :mod:`sandboxd.sockdiag` for the real ``/proc``
    where it can, else from ``net/tcp{,6}``.
    """
    if proc == PROC:
        found = sockdiag.listening()
        if found is not None:
            return found
    raw: list[tuple[str, str, int, int]] = []
    for protocol, name in (("tcp", "net/tcp"), ("tcp6", "net/tcp6")):
        text = _read(os.path.join(proc, name))
        if text:
            raw.extend(
                (protocol, address, port, inode)
                for address, port, inode in parse_proc_net_tcp(text, protocol)
            )
    return raw


def listening_ports(proc: str = PROC) -> set[int]:
    """
    The TCP ports (IPv4 or IPv6) something listens on in this network
    namespace: :func:`listening` without the owners, whose search reads
    every process's descriptors (tens of milliseconds beside a few dozen
    processes), for a caller that needs only the ports.
    """
    return {port for _, _, port, _ in listening_sockets(proc)}


def listening_addresses(proc: str = PROC) -> dict[int, set[str]]:
    """
    The addresses each listening TCP port (IPv4 or IPv6) is bound to, by
    port, without the owners (see :func:`listening_ports`).
    """
    found: dict[int, set[str]] = {}
    for _, address, port, _ in listening_sockets(proc):
        found.setdefault(port, set()).add(address)
    return found


def listening(proc: str = PROC) -> list[Listening]:
    """
    Every listening TCP socket (IPv4 and IPv6) of this network namespace,
    with its owning pid where it can be known, deduplicated by protocol,
    address and port (``SO_REUSEPORT`` groups show once), sorted by port.

    Walks /proc: run it off the reactor thread.
    """
    raw = listening_sockets(proc)
    owners = socket_owners({inode for *_, inode in raw if inode}, proc)
    merged: dict[tuple[str, str, int], int | None] = {}
    for protocol, address, port, inode in raw:
        key = (protocol, address, port)
        pid = owners.get(inode)
        if merged.get(key) is None:
            merged[key] = pid
    entries = [
        Listening(port, protocol, address, pid)
        for (protocol, address, port), pid in merged.items()
    ]
    entries.sort(key=lambda e: (e.port, e.protocol, e.address))
    return entries
