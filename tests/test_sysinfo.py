"""
Machine facts from fake /proc and /sys trees (sandboxd.sysinfo): cgroup
v1 and v2 limits, /proc/net/tcp{,6} parsing, socket owners.
"""

from __future__ import annotations

import os
import sys

from twisted.trial.unittest import SynchronousTestCase

from sandboxd import sysinfo

MIB = 1024 * 1024
GIB = 1024 * MIB

TCP_HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when "
    "retrnsmt   uid  timeout inode\n"
)


def tcp_line(local: str, remote: str, state: str, inode: int) -> str:
    """One /proc/net/tcp line in the kernel's layout."""
    return (
        f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 "
        f"00000000  1000        0 {inode} 1 0000000000000000 100 0 0 10 0\n"
    )


class TreeMixin:
    """Builds files below a temporary root (with trial's ``mktemp``)."""

    def tree(self, files: dict[str, str]) -> str:
        """A temporary root holding ``files`` (relative path -> text)."""
        root = os.path.realpath(self.mktemp())  # type: ignore[attr-defined]
        os.makedirs(root)
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        return root


class AddressTests(SynchronousTestCase):
    """Addresses as the kernel prints them in /proc/net/tcp{,6}."""

    def setUp(self) -> None:
        if sys.byteorder != "little":
            raise self.skipTest("fixtures are in little-endian word order")

    def test_ipv4(self) -> None:
        """0100007F is 127.0.0.1 and 00000000 the wildcard."""
        self.assertEqual(sysinfo.decode_address("0100007F"), "127.0.0.1")
        self.assertEqual(sysinfo.decode_address("00000000"), "0.0.0.0")

    def test_ipv6(self) -> None:
        """Four native-order words: ::1, :: and an IPv4-mapped address."""
        self.assertEqual(
            sysinfo.decode_address("00000000000000000000000001000000"), "::1"
        )
        self.assertEqual(sysinfo.decode_address("0" * 32), "::")
        self.assertEqual(
            sysinfo.decode_address("0000000000000000FFFF00000100007F"),
            "::ffff:127.0.0.1",
        )


class ProcNetTests(TreeMixin, SynchronousTestCase):
    """Listening sockets and their owners from a fake /proc."""

    def setUp(self) -> None:
        if sys.byteorder != "little":
            raise self.skipTest("fixtures are in little-endian word order")

    def test_only_listening_lines(self) -> None:
        """Only state 0A lines count; established and time-wait are skipped."""
        text = (
            TCP_HEADER
            + tcp_line("0100007F:1F90", "00000000:0000", "0A", 101)
            + tcp_line("0100007F:1F90", "0100007F:C350", "01", 102)
            + tcp_line("0100007F:0050", "0100007F:C351", "06", 0)
        )
        self.assertEqual(
            sysinfo.parse_proc_net_tcp(text, "tcp"), [("127.0.0.1", 8080, 101)]
        )

    def test_garbage_lines_skipped(self) -> None:
        """A malformed line does not break the rest of the table."""
        text = (
            TCP_HEADER + "junk\n" + tcp_line("00000000:0016", "00000000:0000", "0A", 7)
        )
        self.assertEqual(sysinfo.parse_proc_net_tcp(text, "tcp"), [("0.0.0.0", 22, 7)])

    def test_listening_with_owners_and_dedupe(self) -> None:
        """
        IPv4 and IPv6 sockets are listed by port with the pid whose fd holds
        the inode; duplicates (SO_REUSEPORT) show once; unknown owners are
        null.
        """
        root = self.tree(
            {
                "net/tcp": TCP_HEADER
                + tcp_line("00000000:1F90", "00000000:0000", "0A", 501)
                + tcp_line("00000000:1F90", "00000000:0000", "0A", 502)
                + tcp_line("0100007F:0016", "00000000:0000", "0A", 600),
                "net/tcp6": TCP_HEADER
                + tcp_line(
                    "00000000000000000000000001000000:0BB8",
                    "0" * 32 + ":0000",
                    "0A",
                    700,
                ),
                "42/fd/.keep": "",
                "7/fd/.keep": "",
            }
        )
        os.symlink("socket:[502]", os.path.join(root, "42/fd/4"))
        os.symlink("socket:[501]", os.path.join(root, "42/fd/3"))
        os.symlink("socket:[700]", os.path.join(root, "7/fd/9"))
        os.symlink("/dev/null", os.path.join(root, "7/fd/0"))
        found = [e.as_json() for e in sysinfo.listening(root)]
        self.assertEqual(
            found,
            [
                {"port": 22, "protocol": "tcp", "address": "127.0.0.1", "pid": None},
                {"port": 3000, "protocol": "tcp6", "address": "::1", "pid": 7},
                {"port": 8080, "protocol": "tcp", "address": "0.0.0.0", "pid": 42},
            ],
        )

    def test_listening_ports_alone(self) -> None:
        """
        The ports only: IPv4 and IPv6 together, each once, without reading
        any process's descriptors (an unreadable fd directory changes
        nothing).
        """
        v6 = "0" * 32
        tcp = [
            tcp_line("00000000:1F90", "00000000:0000", "0A", 501),
            tcp_line("00000000:1F90", "00000000:0000", "0A", 502),
            tcp_line("0100007F:1F91", "0100007F:C350", "01", 503),
        ]
        tcp6 = [
            tcp_line(v6 + ":0BB8", v6 + ":0000", "0A", 700),
            tcp_line(v6 + ":1F90", v6 + ":0000", "0A", 701),
        ]
        root = self.tree(
            {
                "net/tcp": TCP_HEADER + "".join(tcp),
                "net/tcp6": TCP_HEADER + "".join(tcp6),
                "42/fd": "not a directory",
            }
        )
        self.assertEqual(sysinfo.listening_ports(root), {3000, 8080})
        self.assertEqual(sysinfo.listening_ports(self.tree({})), set())

    def test_shared_socket_credited_to_lowest_pid(self) -> None:
        """A socket inherited by pre-forked workers belongs to the parent."""
        root = self.tree({"10/fd/.keep": "", "11/fd/.keep": ""})
        os.symlink("socket:[9]", os.path.join(root, "11/fd/3"))
        os.symlink("socket:[9]", os.path.join(root, "10/fd/3"))
        self.assertEqual(sysinfo.socket_owners({9}, root), {9: 10})

    def test_no_tables(self) -> None:
        """A /proc without network tables (no permission, no IPv6) is empty."""
        self.assertEqual(sysinfo.listening(self.tree({})), [])


def mountinfo(*lines: str) -> str:
    """A /proc/self/mountinfo from ``(root, mount point, fstype, options)`` lines."""
    return "".join(lines)


def mount(n: int, root: str, point: str, fstype: str, options: str) -> str:
    """One mountinfo line."""
    return f"{n} 1 0:{n} {root} {point} rw,relatime - {fstype} {fstype} {options}\n"


class CgroupV2Tests(TreeMixin, SynchronousTestCase):
    """cgroup v2: memory.max, memory.current, cpu.max, limits up the tree."""

    def v2(self, files: dict[str, str], path: str = "/sandbox") -> sysinfo.Cgroup:
        base = {
            "proc/self/cgroup": f"0::{path}\n",
            "proc/self/mountinfo": mount(30, "/", "/sys/fs/cgroup", "cgroup2", "rw"),
        }
        base.update(files)
        return sysinfo.Cgroup.find(self.tree(base))

    def test_limited_memory_and_cpu(self) -> None:
        """A 512 MiB, 1.5-CPU container reports those, from the cgroup."""
        group = self.v2(
            {
                "sys/fs/cgroup/sandbox/memory.max": f"{512 * MIB}\n",
                "sys/fs/cgroup/sandbox/memory.current": f"{200 * MIB}\n",
                "sys/fs/cgroup/sandbox/memory.stat": f"inactive_file {50 * MIB}\n",
                "sys/fs/cgroup/sandbox/cpu.max": "150000 100000\n",
            }
        )
        mem = sysinfo.memory(group, host_total=64 * GIB, host_available=60 * GIB)
        self.assertEqual(mem, sysinfo.Memory(512 * MIB, 362 * MIB, 150 * MIB, "cgroup"))
        self.assertEqual(mem.percent, 29.3)
        self.assertEqual(
            sysinfo.cpu(group, affinity=8, host=8), sysinfo.Cpu(2, 1.5, "cgroup")
        )

    def test_unlimited_is_host(self) -> None:
        """``max`` everywhere: the host's memory and CPUs, said so."""
        group = self.v2(
            {
                "sys/fs/cgroup/sandbox/memory.max": "max\n",
                "sys/fs/cgroup/sandbox/cpu.max": "max 100000\n",
            }
        )
        mem = sysinfo.memory(group, host_total=8 * GIB, host_available=6 * GIB)
        self.assertEqual(mem, sysinfo.Memory(8 * GIB, 6 * GIB, 2 * GIB, "host"))
        self.assertEqual(
            sysinfo.cpu(group, affinity=4, host=4), sysinfo.Cpu(4, None, "host")
        )

    def test_parent_limit_is_tighter(self) -> None:
        """A limit set on a parent cgroup binds the child too."""
        group = self.v2(
            {
                "sys/fs/cgroup/pod/memory.max": f"{256 * MIB}\n",
                "sys/fs/cgroup/pod/cpu.max": "50000 100000\n",
                "sys/fs/cgroup/pod/sandbox/memory.max": "max\n",
                "sys/fs/cgroup/pod/sandbox/memory.current": f"{10 * MIB}\n",
            },
            path="/pod/sandbox",
        )
        self.assertEqual(group.memory_limit(), 256 * MIB)
        self.assertEqual(group.cpu_limit(), 0.5)
        self.assertEqual(sysinfo.cpu(group, affinity=4, host=4).count, 1)

    def test_limit_above_host_is_host(self) -> None:
        """A limit larger than the machine is no limit at all."""
        group = self.v2({"sys/fs/cgroup/sandbox/memory.max": f"{128 * GIB}\n"})
        mem = sysinfo.memory(group, host_total=16 * GIB, host_available=10 * GIB)
        self.assertEqual(mem.source, "host")
        self.assertEqual(mem.total, 16 * GIB)

    def test_available_bounded_by_host(self) -> None:
        """When the host is shorter on memory than the cgroup's headroom, say so."""
        group = self.v2(
            {
                "sys/fs/cgroup/sandbox/memory.max": f"{4 * GIB}\n",
                "sys/fs/cgroup/sandbox/memory.current": f"{1 * GIB}\n",
            }
        )
        mem = sysinfo.memory(group, host_total=16 * GIB, host_available=1 * GIB)
        self.assertEqual(
            (mem.total, mem.available, mem.used), (4 * GIB, 1 * GIB, 1 * GIB)
        )

    def test_namespaced_path_missing_falls_back_to_mount(self) -> None:
        """A path that is not below the mount resolves to the mount itself."""
        group = self.v2(
            {"sys/fs/cgroup/memory.max": f"{GIB}\n"},
            path="/host/only/path",
        )
        self.assertEqual(group.memory_limit(), GIB)

    def test_cpuset_narrower_than_host(self) -> None:
        """A cpuset of 2 on an 8-CPU host says ``affinity``."""
        group = self.v2({})
        self.assertEqual(
            sysinfo.cpu(group, affinity=2, host=8), sysinfo.Cpu(2, None, "affinity")
        )


class AwkwardNameTests(TreeMixin, SynchronousTestCase):
    """
    Mount points and cgroups whose names hold characters other line or
    field splitters stop at: /proc text is split at LF and fields at a space.
    """

    #: NEL, U+2028, U+2029, FF, VT, 0x1c-0x1e, a CR and a no-break space.
    AWKWARD = "a\x85b\u2028c\u2029d\x0ce\x0bf\x1cg\x1dh\x1ei\rj\xa0k"

    def test_cgroup_v2_mount_and_path(self) -> None:
        """
        A cgroup2 mount point and a cgroup path holding them (and a space, as
        mountinfo escapes it), after another mount holding them too, are found.
        """
        point = f"/sys/fs/cg {self.AWKWARD}"
        escaped = point.replace(" ", "\\040")
        root = self.tree(
            {
                "proc/self/cgroup": f"0::/pod/{self.AWKWARD}\n",
                "proc/self/mountinfo": mountinfo(
                    mount(29, "/", f"/mnt/{self.AWKWARD}", "tmpfs", "rw"),
                    mount(30, "/", escaped, "cgroup2", "rw"),
                ),
                f"{point}/pod/{self.AWKWARD}/memory.max".lstrip("/"): f"{GIB}\n",
                f"{point}/pod/{self.AWKWARD}/memory.current".lstrip("/"): "10\n",
            }
        )
        group = sysinfo.Cgroup.find(root)
        directory = os.path.join(root, point.lstrip("/"))
        self.assertEqual(
            group.v2, (os.path.join(directory, "pod", self.AWKWARD), directory)
        )
        self.assertEqual(group.memory_limit(), GIB)
        self.assertEqual(group.memory_used(), 10)

    def test_cgroup_v1_controllers(self) -> None:
        """A v1 memory controller's cgroup whose name holds them is found."""
        root = self.tree(
            {
                "proc/self/cgroup": f"5:memory:/{self.AWKWARD}\n",
                "proc/self/mountinfo": mount(
                    31, "/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"
                ),
                f"sys/fs/cgroup/memory/{self.AWKWARD}/memory.limit_in_bytes": (
                    f"{GIB}\n"
                ),
            }
        )
        self.assertEqual(sysinfo.Cgroup.find(root).memory_limit(), GIB)


class CgroupV1Tests(TreeMixin, SynchronousTestCase):
    """cgroup v1: memory.limit_in_bytes, cfs quota, a host path as mount root."""

    def v1(self, files: dict[str, str]) -> sysinfo.Cgroup:
        base = {
            "proc/self/cgroup": (
                "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n"
            ),
            "proc/self/mountinfo": mountinfo(
                mount(
                    31, "/docker/abc", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"
                ),
                mount(
                    32,
                    "/docker/abc",
                    "/sys/fs/cgroup/cpu,cpuacct",
                    "cgroup",
                    "rw,cpu,cpuacct",
                ),
            ),
        }
        base.update(files)
        return sysinfo.Cgroup.find(self.tree(base))

    def test_limited(self) -> None:
        """The container's own cgroup is the mount point (no cgroup namespace)."""
        group = self.v1(
            {
                "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{GIB}\n",
                "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{300 * MIB}\n",
                "sys/fs/cgroup/memory/memory.stat": (
                    f"cache 5\ntotal_inactive_file {100 * MIB}\n"
                ),
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            }
        )
        mem = sysinfo.memory(group, host_total=32 * GIB, host_available=30 * GIB)
        self.assertEqual(mem, sysinfo.Memory(GIB, 824 * MIB, 200 * MIB, "cgroup"))
        self.assertEqual(
            sysinfo.cpu(group, affinity=16, host=16), sysinfo.Cpu(2, 2.0, "cgroup")
        )

    def test_unlimited(self) -> None:
        """v1 writes "no limit" as a huge number and a -1 quota."""
        group = self.v1(
            {
                "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            }
        )
        self.assertIsNone(group.memory_limit())
        self.assertIsNone(group.cpu_limit())
        self.assertEqual(sysinfo.memory(group, 8 * GIB, 4 * GIB).source, "host")

    def test_no_cgroup_at_all(self) -> None:
        """Outside any container (or without /proc), the host's numbers."""
        group = sysinfo.Cgroup.find(self.tree({}))
        self.assertEqual(group, sysinfo.Cgroup(None, {}))
        self.assertEqual(sysinfo.memory(group, 8 * GIB, 4 * GIB).source, "host")


class DiskTests(TreeMixin, SynchronousTestCase):
    """Disk usage of the file system holding a path."""

    def test_disk(self) -> None:
        """Totals are consistent and the percentage is in range."""
        usage = sysinfo.disk(self.tree({}))
        self.assertGreater(usage.total, 0)
        self.assertLessEqual(usage.used, usage.total)
        self.assertLessEqual(usage.free, usage.total)
        self.assertTrue(0.0 <= usage.percent <= 100.0)


class PortsOfTests(SynchronousTestCase):
    """The ports one process listens on, read from the real /proc."""

    def test_own_listener_found(self) -> None:
        """A socket this process listens on is found; a bound, unlistened one and a gone pid are not."""
        import socket

        listener = socket.socket()
        self.addCleanup(listener.close)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        bound = socket.socket()
        self.addCleanup(bound.close)
        bound.bind(("127.0.0.1", 0))
        ports = sysinfo.ports_of(os.getpid())
        self.assertIn(listener.getsockname()[1], ports)
        self.assertNotIn(bound.getsockname()[1], ports)
        self.assertEqual(sysinfo.ports_of(2**22 + 1), frozenset())
