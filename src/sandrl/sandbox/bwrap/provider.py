"""The default sandbox backend: bubblewrap namespaces, an idmapped copy-on-write root, cgroups.

How one sandbox is made (``native/sandrl-helper.c`` does the privileged part, as root):

1. A uid *slot* is locked (:mod:`sandrl.sandbox.bwrap.state`): two host uid ranges of its own, pid 1's
   uid U and the sandbox's U+1..U+65536, so root inside is nobody outside, pid 1 is nobody to
   the sandbox's root, and no two sandboxes share a uid.
2. Its cgroups are made with the spec's memory, pids and CPU limits (:mod:`.cgroups`).
3. The helper joins them and, through two short-lived children, makes the outer user namespace
   (0..65536 -> U..U+65536, pid 1's), the inner one nested in it (0..65535 -> U+1..U+65536,
   where every command runs) and a loopback-only network namespace owned by the inner one, which
   it enters (``network=True`` adds slirp4netns's tap to it, :mod:`.nat`). Meanwhile, in a
   private mount namespace, it mounts the image's layers idmapped (host directories through the
   inner namespace: host root -> sandbox root; store layers: the store's own range -> sandbox
   ids), read-only, nosuid, nodev,
   with overlayfs over a tmpfs of ``disk_mb`` on top: the sandbox may write anywhere, the image
   never changes, and the writable layer vanishes with the namespace. It joins a fresh session
   keyring and drops to uid U with a clean environment.
4. The helper makes pid 1 as bubblewrap would: as U inside the outer namespace it adds pid,
   ipc, uts and cgroup namespaces, ``/proc`` (a few host facts masked) and a minimal ``/dev``,
   hands pid 1 the root as a detached mount to pivot into, and pid 1 starts the agent with
   Docker's default capabilities. A launch made ahead for a fork's child (:mod:`.premade`)
   stages ``/proc`` and ``/dev`` before the image is known. ``launcher="bubblewrap"`` (or
   ``$SANDRL_LAUNCHER=bubblewrap``) has bubblewrap make a full launch's pid 1 instead, for a host
   that needs it (:mod:`.launch`); ``tests/sandbox`` holds every launch to the same surface.
5. The agent puts itself under the seccomp filter (with no_new_privs) and runs every command in
   the inner namespace as root, with at most Docker's default capabilities, under that filter.
   It serves execs and file transfers over a socket until the provider closes it or dies, or
   the TTL passes; then pid 1 exits and the kernel kills everything left.

Threat model. Sandboxed code (a policy under training, a third-party task's Dockerfile) is
hostile; this backend protects the host, the provider and other sandboxes from it:

- **Files.** No host files but the image: store layers, or for the ``host`` image the host's
  ``/usr`` (``/bin``, ``/lib*``) and ``/etc``, minus every entry host users could not read
  (:mod:`.images`: files and directories that are not world-readable are hidden from sandboxes
  created after they appeared; a sandbox already running when such a file is created under a
  host directory can see it until it ends). Layers on disk are owned by the store's own uid
  range (never host root), carry no setuid/setgid bits, and sit under 0700 directories, so an
  image build gives no host user anything. Everything pid 1 serves (read, write, upload, tar) is
  a regular file, opened non-blocking, never on ``/proc`` or ``/sys``, and bounded in size by the
  caller and by ``disk_mb`` before bytes reach the host.
- **Processes and pid 1.** No host processes are visible. Pid 1's uid is not mapped in the
  sandbox's namespace: its root cannot signal, ptrace, prlimit, renice, pin or re-score pid 1
  (belt and braces: the seccomp filter refuses ptrace, process_vm_*, prlimit64, sched_*,
  setpriority, ioprio_set, pidfd_open... naming pid 1). A sandbox that still kills its own
  supervisor (e.g. by exhausting its memory) fails its episode; it is not an infrastructure error.
- **Kernel surface.** Capabilities: Docker's default set, in namespaces the sandbox owns (no
  ``CAP_SYS_ADMIN``, ``CAP_SYS_PTRACE``, ``CAP_NET_ADMIN``...); ``NO_NEW_PRIVS``. Seccomp refuses
  keyrings (``keyctl``, ``add_key``, ``request_key``; each sandbox also has its own session
  keyring), ``kexec_*``, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``, module
  loading, swap, ``acct``, quotas, ``reboot``, ``syslog``, ``iopl``/``ioperm``,
  ``open_by_handle_at`` and ``fanotify_init``, and every syscall of another ABI (i386, x32). It
  allows what containers need and tasks use, including ``unshare``/``clone`` of new namespaces:
  a sandbox may create nested user namespaces (and mount there), which widens the kernel's
  attack surface. The sandbox shares the host kernel: kernel vulnerabilities are out of scope
  (use a microVM backend where they matter).
- **Resources.** Memory, pids and CPU are cgroup limits; the writable layer, ``/tmp``,
  ``/dev/shm`` and tmpfs mounts made in nested namespaces live in memory and count against
  ``memory_mb`` only; ``disk_mb`` bounds the writable layer. Output per command is capped, every
  command and the sandbox have a time limit, and every wait on pid 1 is bounded.
- **What a sandbox can still see of the host** (not secret, but not hidden): the kernel version,
  CPU model and count, total and free RAM (``/proc/meminfo``), load and uptime, mounts' shapes in
  ``/proc/self/mountinfo``. Masked (read as empty): ``/proc/cmdline``, ``partitions``,
  ``diskstats``, the boot id (and ``sched_debug``, ``latency_stats`` where the kernel has them);
  ``kcore`` and ``timer_list`` are host root's (unreadable), ``keys`` and ``key-users`` show only
  the sandbox's own; ``/sys`` is not mounted. As in Docker, the masks
  make the kernel refuse a fresh ``/proc`` in a nested pid namespace (``unshare --mount-proc``);
  nested user, mount and pid namespaces themselves still work.
- **Network.** Never the host's: every sandbox has a network namespace of its own, loopback only
  by default (its root may bind low ports and use raw sockets there, as in Docker). With
  ``network=True`` (and in image builds' ``RUN`` steps) it reaches the world through
  slirp4netns (:mod:`.nat`), never the host's loopback, link-local addresses (cloud metadata),
  the host's own addresses or private ranges (unless ``egress_allow`` names them): a cgroup BPF
  filter (:mod:`.egress`) refuses them on slirp4netns's sockets. slirp4netns runs with its own
  mount namespace, no capabilities and a seccomp filter, in the sandbox's cgroups. Without
  slirp4netns or cgroup BPF a sandbox with the network is refused, not given the host's.
- **Registry images.** Manifests, configs and layer blobs are checked against their digests
  before use; layers are unpacked by :mod:`sandrl.images.unpack` into the store's uid range,
  never through a symlink, never outside the layer (``../``, absolute names), without device
  files or setuid/setgid bits, within byte and entry bounds.
- **Side channels.** CPU is a quota, not a pin: caches and memory bandwidth are shared, and
  timing side channels between sandboxes are not addressed.
- **The provider.** It reads from a sandbox only within bounds (file reads: ``max_bytes``; output:
  the output cap, and a streaming reader's back-pressure pauses the command's pipes; requests are
  checked against the agent's frame limit before they are sent), and no wait on pid 1 is
  unbounded. The HTTP service's own threat model is in :mod:`sandrl.sandbox.service.server`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import os
import resource
import shutil
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Sequence
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

from sandrl.errors import (
    CapacityExhaustedError,
    ConfigError,
    LimitUnsupportedError,
    SandboxCreateError,
    SandboxUnavailableError,
)
from sandrl.host_memory import ADMISSION_MEMORY_AGE_S, mem_available_bytes
from sandrl.sandbox.base import DEFAULT_OUTPUT_CAP, FetchedImage, ImageSource, SandboxSpec
from sandrl.sandbox.bwrap import protocol
from sandrl.sandbox.bwrap.cgroups import CgroupManager, remove_group_dir
from sandrl.sandbox.bwrap.dockerfile.source import cached_image, fetch_image
from sandrl.sandbox.bwrap.egress import EgressFilter, parse_allow
from sandrl.sandbox.bwrap.helper_build import helper_path
from sandrl.sandbox.bwrap.images import Image, ImageStore, MountPlan
from sandrl.sandbox.bwrap.launch import LAUNCHER_ENV, LAUNCHERS, Launch, Launcher, PremadeKind
from sandrl.sandbox.bwrap.nat import require_nat, start_nat
from sandrl.sandbox.bwrap.premade import PremadeLaunches, undo_launch, undo_when_done
from sandrl.sandbox.bwrap.protocol import AgentConnection
from sandrl.sandbox.bwrap.sandbox import HOST_WORK, BwrapSandbox
from sandrl.sandbox.bwrap.snapshot import fork_sandbox, layers_in_use, remove_snapshot, snapshot_sandbox
from sandrl.sandbox.bwrap.state import StateDir, process_identity
from sandrl.sandbox.bwrap.store_usage import StoreUsage
from sandrl.sandbox.bwrap.tree_layers import image_with_tree
from sandrl.sandbox.entrypoint import start_entrypoint

DEFAULT_STATE_DIR = Path(os.environ.get("SANDRL_STATE_DIR", "/var/lib/sandrl"))
START_TIMEOUT_S = 15.0
EGRESS_ALLOW_ENV = "SANDRL_EGRESS_ALLOW"
"""Private ranges sandboxes with the network may reach on this host, comma-separated CIDRs."""


class BwrapProvider:
    """Makes :class:`BwrapSandbox` es on this host. Needs root and cgroups (and bubblewrap with
    ``launcher="bubblewrap"``)."""

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        output_cap: int = DEFAULT_OUTPUT_CAP,
        max_live: int | None = None,
        min_free_memory_mb: int = 256,
        bwrap: str | None = None,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        egress_allow: Sequence[str] | None = None,
        launcher: str | None = None,
    ) -> None:
        """``egress_allow``: private address ranges (CIDR) that sandboxes with the network may reach
        (:func:`.egress.parse_allow`; default ``$SANDRL_EGRESS_ALLOW``, comma-separated, else none);
        loopback and link-local never. ``launcher``: what makes a create's pid 1, ``"helper"`` or
        ``"bubblewrap"`` (:mod:`.launch`; default ``$SANDRL_LAUNCHER``, else ``"helper"``)."""
        if os.geteuid() != 0:
            raise SandboxUnavailableError(
                "the bubblewrap sandbox backend must run as root (it sets up idmapped mounts and cgroups, "
                "and then runs every sandbox as an unprivileged uid); run as root, or use a sandbox service "
                "(`sandrl serve sandboxes`) on a host where you can"
            )
        self.launcher_name = _launcher_name(launcher)
        found = bwrap or shutil.which("bwrap")
        usable = found is not None and os.access(found, os.X_OK)
        if self.launcher_name == "bubblewrap" and not usable:
            raise SandboxUnavailableError(
                "bubblewrap is not installed: install it (Debian: apt-get install bubblewrap) "
                "or run scripts/bootstrap.sh"
            )
        self.bwrap = found if usable else None
        """bubblewrap's path where it is installed (a launch runs it only with ``launcher="bubblewrap"``)."""
        _raise_fd_limit()  # one socket per live sandbox: hundreds at once
        self.state = StateDir(Path(state_dir) if state_dir is not None else DEFAULT_STATE_DIR)
        self.images = ImageStore(self.state.root / "images")
        self._usage = StoreUsage(self.images)
        self.helper = helper_path(self.state.root / "bin")
        self.cgroups = CgroupManager(root=cgroup_root, subdir=f"sandrl/{self.state.cgroup_name}")
        self._cgroup_missing = self.cgroups.missing()
        if len(self._cgroup_missing) < 3:
            self.cgroups.prepare()
        self.egress = EgressFilter(_egress_allow(egress_allow))
        self.output_cap = output_cap
        self.max_live = max_live
        self.min_free_memory_mb = min_free_memory_mb
        self.live: set[BwrapSandbox] = set()
        self._creating = 0
        self._identity = process_identity()
        by_bwrap = self.bwrap if self.launcher_name == "bubblewrap" else None
        self.launcher = Launcher(self.state, self.cgroups, self.helper, by_bwrap, self._identity)
        self.premade = PremadeLaunches(self.launcher)
        self._abandoned: set[concurrent.futures.Future[None]] = set()
        """Undoing the launches of creates that failed or were cancelled (:meth:`close_all` waits for them)."""
        self.reaped = self.reap()
        _LIVE_PROVIDERS.add(self)

    # -- reaping

    def reap(self) -> list[str]:
        """Remove what dead sandboxes left (records, cgroups), and kill the paused sandboxes of
        providers that are gone (:meth:`StateDir.orphaned_paused`); return their ids."""
        groups = self.cgroups.stale_groups()
        orphaned = self.state.orphaned_paused()
        for sid in orphaned:
            for d in groups.get(sid, []):
                remove_group_dir(d)  # kills what is in it: a frozen process dies of SIGKILL too
            self.state.remove_record(sid)
        dead = orphaned + self.state.dead_records()
        for sid in dead:
            for d in self.cgroups.stale_groups().get(sid, []):
                remove_group_dir(d)
            self.state.remove_record(sid)
        records = set(self.state.records())
        for name, dirs in self.cgroups.stale_groups().items():
            if name not in records:
                for d in dirs:
                    remove_group_dir(d)
                dead.append(name)
        return sorted(set(dead))

    # -- creating

    def _check_spec(self, spec: SandboxSpec) -> None:
        if self._cgroup_missing:
            what = ", ".join(self._cgroup_missing)
            if spec.require_limits:
                raise LimitUnsupportedError(
                    f"this host cannot enforce the {what} limit(s) (no such cgroup controller under "
                    f"{self.cgroups.root}); enable the controller, or create with require_limits=False "
                    "to run without them"
                )
            warnings.warn(f"sandbox runs without {what} limits: this host has no such cgroup controller", stacklevel=3)

    def _admit(self) -> None:
        live = len(self.live) + self._creating
        if self.max_live is not None and live >= self.max_live:
            raise CapacityExhaustedError(
                f"{live} sandboxes are live, the limit of this provider (max_live={self.max_live}); "
                "close some or raise max_live"
            )
        available = mem_available_bytes(max_age_s=ADMISSION_MEMORY_AGE_S)
        free_mb = None if available is None else available >> 20
        if free_mb is not None and free_mb < self.min_free_memory_mb:
            raise CapacityExhaustedError(
                f"the host has {free_mb} MiB of memory available, under the {self.min_free_memory_mb} MiB "
                "reserve: close sandboxes or wait"
            )

    async def resolve_image(self, source: ImageSource) -> str:
        """The store image ``source`` gives: built from its Dockerfile here (a cache hit when
        unchanged), else its prebuilt image when the store has it, else ``host``."""
        return (await self.fetch_image(source)).name

    async def fetch_image(self, source: ImageSource, *, on_bytes: Callable[[int], None] | None = None) -> FetchedImage:
        """:meth:`resolve_image`, saying whether the image was in the store, pulled or built
        (:class:`~sandrl.sandbox.base.ImageFetcher`)."""
        return await fetch_image(self, source, on_bytes=on_bytes)

    def cached_image(self, source: ImageSource) -> str | None:
        return cached_image(self, source)

    def store_bytes(self) -> int:
        return self._usage.bytes()

    async def layer_tree(self, base: str, tree: Path, *, key: str, name: str) -> str:
        """``base`` with ``tree`` laid over it, one shared layer per ``key`` (:mod:`.tree_layers`, a
        :class:`~sandrl.sandbox.base.TreeLayering`)."""
        return await asyncio.to_thread(image_with_tree, self.images, base, tree, key=key, name=name)

    async def create(self, spec: SandboxSpec | None = None) -> BwrapSandbox:
        """A new sandbox of ``spec``; with ``network=True`` its egress goes through slirp4netns
        (:mod:`.nat`: out to the world, not to the host or its private network)."""
        spec = spec or SandboxSpec()
        self._check_spec(spec)
        if spec.network:
            require_nat()
        return await self._create_of(spec, self.images.get(spec.image))

    async def create_from(self, spec: SandboxSpec, image: Image) -> BwrapSandbox:
        """:meth:`create` with ``spec``'s image looked up already (``image``): a fork's children share
        one lookup of their image (for a stacked image on ``host``, a scan of the host's system
        directories), ~0.2 ms each of the event loop's time."""
        self._check_spec(spec)
        if spec.network:
            require_nat()
        return await self._create_of(spec, image)

    async def _create_of(self, spec: SandboxSpec, image: Image) -> BwrapSandbox:
        self._admit()
        self._creating += 1
        try:
            sandbox = await self._create(spec, image.env, image.plan)
        finally:
            self._creating -= 1
        try:
            if spec.network:
                await start_nat(sandbox, self.egress)
            if spec.entrypoint and image.entrypoint:
                await start_entrypoint(sandbox, image.entrypoint)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def _create(self, spec: SandboxSpec, image_env: dict[str, str], plan: MountPlan) -> BwrapSandbox:
        # The launch's blocking work (slot lock, record, cgroup dirs and limits, fork and exec: ~3.5 ms
        # of syscalls; ~0.5 ms to finish a pre-made one) runs in a thread: _in_host_work.
        cpus = os.sched_getaffinity(0)  # the caller's: the sandbox inherits them, as if spawned from its thread
        launch = None
        premade = self.premade.take(PremadeKind.of(spec), cpus)
        if premade is not None:
            try:
                launch = await self._in_host_work(self.launcher.finish, premade, spec, plan)
            except OSError:  # its helper died while it waited (finish undid it): launch in full
                launch = None
        if launch is None:
            sid = "sb-" + uuid.uuid4().hex[:12]
            launch = await self._in_host_work(self.launcher.launch, sid, spec, plan, cpus)
        sid = launch.sid
        conn: AgentConnection | None = None
        try:
            assert launch.sock is not None
            reader, writer = await asyncio.open_unix_connection(sock=launch.sock, limit=1 << 20)
            launch.sock = None
            conn = AgentConnection(reader, writer)
            conn.start()
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
                # meets the reply, and a warm pool's refill would then never end.
                async with asyncio.timeout(START_TIMEOUT_S):
                    version = await asyncio.shield(conn.hello)
            except (ConnectionError, TimeoutError) as exc:
                detail = (launch.record / "log").read_text(errors="replace").strip() or str(exc) or "no output"
                raise SandboxCreateError(f"sandbox {sid} did not start: {detail}") from exc
            if version != protocol.PROTOCOL_VERSION:
                raise SandboxCreateError(
                    f"sandbox helper speaks protocol {version}, sandrl {protocol.PROTOCOL_VERSION}"
                )
        except BaseException:
            if conn is not None:
                await conn.close()
            # Waited for by close_all too: a caller cancelled meanwhile stops waiting, the undo goes on.
            await asyncio.shield(asyncio.wrap_future(self._undo_at_close(undo_launch(launch))))
            raise
        # The sandbox's own processes now hold the slot's lock; ours would outlive a crash of theirs.
        slot, group, proc = launch.slot, launch.group, launch.proc
        assert group is not None and proc is not None
        slot.release()
        sandbox = BwrapSandbox(sid, spec, image_env, slot.index, group, proc, conn, output_cap=self.output_cap)
        sandbox.add_close_callback(self._forget)
        # Its record goes with its cgroups, off the event loop, before anyone hears of the close.
        sandbox.removals.append(functools.partial(self.state.remove_record, sid))
        sandbox.removals.append(functools.partial(self.state.slot_freed, slot.index))
        sandbox.uid = slot.uid + 1  # the slot's uid is pid 1's; the sandbox's root is the next one
        sandbox.mount_plan = plan
        sandbox._snapshotter = functools.partial(snapshot_sandbox, self.images)
        sandbox._forker = functools.partial(fork_sandbox, self)
        sandbox.on_pause = self._record_pause
        self.live.add(sandbox)
        return sandbox

    snapshots = True
    """Its sandboxes can be snapshotted and forked (:class:`~sandrl.sandbox.base.SnapshotProvider`)."""
    port_forwarding = True
    """Its sandboxes can be given a host port (:mod:`.port_forward`, a ``PortForwardingProvider``)."""

    async def remove_image(self, name: str) -> None:
        """Remove a snapshot or fork image and the layers only it held (those a live sandbox of this
        provider has mounted stay, for ``sandrl images prune``)."""
        in_use = layers_in_use(self.images, self.live)
        await asyncio.to_thread(remove_snapshot, self.images, name, in_use)

    def _record_pause(self, sandbox: BwrapSandbox, ttl_left_s: float | None) -> None:
        paused = None
        if ttl_left_s is not None:
            now = time.time()
            paused = {"at": now, "ttl_left_s": ttl_left_s, "deadline": now + ttl_left_s}
        self.state.update_record(sandbox.id, paused=paused)

    def _forget(self, sandbox: BwrapSandbox) -> None:
        self.live.discard(sandbox)

    def expect_forks(self, spec: SandboxSpec, n: int, until: asyncio.Future[None] | None = None) -> None:
        """Forks of ``n`` children of ``spec`` will come again: keep their launches made ahead
        (:mod:`.premade`), made once ``until`` is done (at most :data:`.premade.REFILL_HOLD_S` later)."""
        self.premade.want(PremadeKind.of(spec), n, until=until)

    async def _in_host_work(self, start: Callable[..., Launch], *args: Any) -> Launch:
        """``start(*args)`` (a launch's blocking work) on ``HOST_WORK``, so the event loop serves other
        requests meanwhile. Shielded: a cancelled caller leaves the thread running, and what it made is
        undone when it ends; :meth:`close_all` waits for that (a run stopped by a signal used to exit
        first, leaving the launch's cgroups and record behind). The undo is the thread's, not a task of
        this loop: a caller cancelled as its loop ends (``asyncio.run``'s end cancels every task) would
        take such a task with it, and the launch's helper was dropped running, its socket open."""
        started = HOST_WORK.submit(start, *args)
        try:
            return await asyncio.shield(asyncio.wrap_future(started))
        except asyncio.CancelledError:
            self._undo_at_close(undo_when_done(started))
            raise

    def _undo_at_close(self, undone: concurrent.futures.Future[None]) -> concurrent.futures.Future[None]:
        """``undone``, which :meth:`close_all` waits for until it is done."""
        self._abandoned.add(undone)
        undone.add_done_callback(self._abandoned.discard)  # at once if it is done already
        return undone

    async def close_all(self) -> None:
        await asyncio.gather(*(asyncio.wrap_future(f) for f in list(self._abandoned)), return_exceptions=True)
        await self.premade.close()
        await asyncio.gather(*(s.close() for s in list(self.live)), return_exceptions=True)

    def _close_all_sync(self) -> None:
        """Last resort at interpreter exit: kill and clean up without an event loop."""
        self.premade.close_sync()
        for sandbox in list(self.live):
            sandbox._cleanup_sync()


def _launcher_name(given: str | None) -> str:
    name = given if given is not None else os.environ.get(LAUNCHER_ENV, "").strip() or LAUNCHERS[0]
    if name not in LAUNCHERS:
        where = "launcher" if given is not None else f"${LAUNCHER_ENV}"
        raise ConfigError(f"{where}: unknown launcher {name!r}; use one of {', '.join(LAUNCHERS)}")
    return name


def _egress_allow(given: Sequence[str] | None) -> tuple[IPv4Network, ...]:
    if given is not None:
        return parse_allow(tuple(given))
    ranges = [r for r in os.environ.get(EGRESS_ALLOW_ENV, "").replace(" ", "").split(",") if r]
    try:
        return parse_allow(ranges)
    except ConfigError as exc:
        raise ConfigError(f"${EGRESS_ALLOW_ENV}: {exc}") from None


FD_LIMIT = 65536
"""Open files the provider asks for at least: one socket per live sandbox (and one pipe more with the
network), 10,000 live and the service's clients besides. Root may raise the hard limit up to the
kernel's ``fs.nr_open``; the sandboxes inherit it, as a container's processes get Docker's 1048576."""


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(hard, FD_LIMIT)
    with contextlib.suppress(OSError, ValueError), open("/proc/sys/fs/nr_open") as f:
        want = min(want, int(f.read()))
    for limit in (want, hard):  # a hard limit above the current one needs CAP_SYS_RESOURCE
        if soft < limit:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
                return


_LIVE_PROVIDERS: weakref.WeakSet[BwrapProvider] = weakref.WeakSet()


@atexit.register
def _cleanup_at_exit() -> None:
    for provider in list(_LIVE_PROVIDERS):
        provider._close_all_sync()
